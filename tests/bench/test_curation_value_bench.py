"""``bench/curation_value.py --quick`` runs in the suite: flawless demonstrations → a weak ranker
→ its own rollouts with reference labels (the pool) → first-error corrections by the labels
teacher → four datasets of the same pool (unfiltered, success, prefixes, corrected) → ranker SFT
on each for the same number of steps → the primary pair evaluated on the same ``test`` tasks,
the other arms on the first of them → the paired differences (on the tasks both ran), per
template and the aims. No assertion on the figures' size: the quick size is far too small."""

from __future__ import annotations

import re

import pytest

from tests.bench.early import quick

ARMS = ["unfiltered", "success", "prefixes", "corrected"]


@pytest.mark.long(
    reason=(
        "a weak policy's rollouts curated four ways, trained and evaluated paired, at bench "
        "size; twins: "
        "tests/stages/test_reference_labels.py::"
        "test_a_noisy_policy_gets_its_first_error_which_the_scorer_and_the_labels_teacher_use, "
        "tests/curation/test_filters.py::test_verdict_single_judge_latest_judgment_counts, "
        "tests/flows/test_stage_flows.py::test_evaluate_newest_shows_the_delta"
    )
)
@pytest.mark.bench("curation_value.py")
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(900)
def test_curation_value_bench_quick_curates_a_weak_policys_pool_and_compares_paired():
    proc = quick("curation_value.py", timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    demos = re.search(r"expert value-demos: (\d+) trajectories", out)
    assert demos and int(demos[1]) == 6
    pool = re.search(
        r"pool \(weak policy, greedy, label_reference\): (\d+) trajectories, \d+ steps, "
        r"outcomes (\{.*\})",
        out,
    )
    assert pool and int(pool[1]) == 8 and "'failure'" in pool[2]  # the weak policy fails some
    failed = int(re.findall(r"'failure': (\d+)", pool[2])[0])
    fix = re.search(
        r"first-error corrections \(labels teacher\): (\d+) failed trajectories, (\d+) corrected, "
        r"(\d+) without a first error",
        out,
    )
    assert fix and int(fix[1]) == failed and int(fix[2]) + int(fix[3]) == failed
    assert int(fix[2]) >= 1
    sizes = {k: int(v) for k, v in re.findall(r"dataset value-([\w-]+): \{'sft': (\d+)", out)}
    assert 0 <= sizes["success"] < sizes["prefixes"] < sizes["unfiltered"]  # the errors dropped
    assert sizes["corrected"] == sizes["prefixes"] + int(fix[2])  # one row per correction
    steps = re.findall(r"^sft ([\w+]+): (\d+) rows, (\d+) steps", out, re.M)
    assert [(arm, int(n)) for arm, _, n in steps if arm in ARMS] == [(a, 20) for a in ARMS]
    evals = re.findall(r"^  ([\w+]+)\s+test\s+(\d+)/(\d+)", out, re.M)
    n_eval = {"unfiltered": 3, "success": 2, "prefixes": 2, "corrected": 3}  # --secondary-n 2
    assert [(a, int(n)) for a, _, n in evals] == list(n_eval.items())
    solved = {a: int(k) for a, k, _ in evals}
    diffs = re.findall(
        r"^  test  ([\w+]+) - (\w+): ([+-][\d.]+)%, within templates .* paired on (\d+) tasks",
        out,
        re.M,
    )
    assert [(b, a) for b, a, *_ in diffs] == [
        ("corrected", "unfiltered"),
        ("success", "unfiltered"),
        ("prefixes", "unfiltered"),
        ("corrected", "prefixes"),
    ]
    # each pair on the tasks both ran: the primary on 3, any with a secondary arm on 2
    assert [int(n) for *_, n in diffs] == [3, 2, 2, 2]
    b, a, diff, _ = diffs[0]
    assert float(diff) == pytest.approx(100 * (solved[b] - solved[a]) / 3, abs=0.05)
    arm = r"\s+(\d+)/(\d+)\s*"
    rows = re.findall(rf"^  (\w+){arm}/{arm}/{arm}/{arm}\s+pool (\d+)/(\d+)", out, re.M)
    assert rows and sum(int(r[2]) for r in rows) == 3  # every test task in one template's row
    assert sum(int(r[4]) for r in rows) == 2  # the secondary arms' tasks
    assert sum(int(r[1]) for r in rows) == solved["unfiltered"]
    assert sum(int(r[3]) for r in rows) == solved["success"]
    assert sum(int(r[10]) for r in rows) <= 8  # the pool's trajectories, by template
    aims = re.findall(r"^  (met   |MISSED) (.+?): ", out, re.M)
    assert [n for _, n in aims] == [
        "diff >= +3 points",
        "McNemar p < 0.05",
        "within-template lower bound > 0",
        ">= 300 test tasks",
        "<= 30 minutes",
    ]
    assert aims[3][0] == "MISSED"  # 3 pairs: the quick size cannot meet it
