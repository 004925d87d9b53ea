"""``bench/curation_value.py --quick`` runs in the suite: the habit-noised expert → judged →
two datasets of the same trajectories (unfiltered, success-filtered) → ranker SFT on each for
the same number of steps → both evaluated on the same ``test`` tasks → the paired difference,
overall and per template. No assertion on the figures' size: the quick size is far too small."""

from __future__ import annotations

import re

import pytest

from tests.bench.early import quick


@pytest.mark.long(
    reason=(
        "judged, filtered and intervened data trained and evaluated paired, at bench size; "
        "twins: "
        "tests/curation/test_filters.py::test_verdict_single_judge_latest_judgment_counts, "
        "tests/flows/test_stage_flows.py::test_curate, "
        "tests/flows/test_stage_flows.py::test_evaluate_newest_shows_the_delta"
    )
)
@pytest.mark.bench("curation_value.py")
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(900)
def test_curation_value_bench_quick_compares_the_arms_paired():
    proc = quick("curation_value.py", timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    m = re.search(
        r"expert value-habit-expert, noise 0.4 \(habit\): (\d+) trajectories, \d+ steps, "
        r"outcomes (\{.*\})",
        out,
    )
    assert m and int(m[1]) == 12 and "'failure'" in m[2]  # the habits broke some tasks
    iv = re.search(
        r"interventions \(expert teacher\): (\d+) failed trajectories, \d+ intervened, "
        r"(\d+) verified",
        out,
    )
    assert iv and 1 <= int(iv[1]) <= 2 and int(iv[2]) >= 1  # capped at --interventions 2
    sizes = {k: int(v) for k, v in re.findall(r"dataset value-([\w-]+): \{'sft': (\d+)", out)}
    assert 0 < sizes["success"] < sizes["unfiltered"]  # failures filtered out
    assert sizes["success-interventions"] == sizes["success"] + int(iv[2])  # one row each
    assert sizes["success"] <= sizes["prefixes"] <= sizes["unfiltered"]  # + the failed prefixes
    steps = re.findall(r"^sft ([\w+]+): (\d+) rows, (\d+) steps", out, re.M)
    assert [(arm, int(n)) for arm, _, n in steps] == [
        ("unfiltered", 20),
        ("success", 20),
        ("success+interventions", 20),
        ("prefixes", 20),
    ]  # the same number of gradient steps for every arm
    evals = re.findall(r"^  ([\w+]+)\s+test\s+(\d+)/(\d+)", out, re.M)
    assert [(a, int(n)) for a, _, n in evals] == [
        ("unfiltered", 3),
        ("success", 3),
        ("success+interventions", 3),
        ("prefixes", 3),
    ]
    solved = {a: int(k) for a, k, _ in evals}
    diffs = re.findall(
        r"^  ([\w+]+) - (\w+): ([+-][\d.]+)% \[.*\] paired on (\d+) tasks", out, re.M
    )
    assert [(b, a) for b, a, *_ in diffs] == [
        ("success", "unfiltered"),
        ("success+interventions", "success"),
        ("success+interventions", "unfiltered"),
        ("prefixes", "unfiltered"),
    ]
    for b, a, diff, n in diffs:
        assert int(n) == 3 and float(diff) == pytest.approx(
            100 * (solved[b] - solved[a]) / 3, abs=0.05
        )
    rows = re.findall(
        r"^  (\w+)\s+(\d+) /\s+(\d+) /\s+(\d+) /\s+(\d+) of (\d+)\s+train (\d+)/(\d+)", out, re.M
    )
    assert rows and sum(int(r[5]) for r in rows) == 3  # every test task in one template's row
    assert sum(int(r[1]) for r in rows) == solved["unfiltered"]
