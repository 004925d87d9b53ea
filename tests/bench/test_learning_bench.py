"""``bench/learning.py --quick`` runs in the suite: every stage of the loop (noisy expert →
judge → curated and unfiltered datasets → ranker SFT on the curated one → tiny VLM SFT →
evaluations → on-policy RL in two configurations, chosen on val → evaluations) produces what
the next needs; the bench exits non-zero when a stage produced nothing or an SFT loss did not
fall. Figures are re-read from its output; no assertion on speed or on success rates (the quick
size is far too small to measure them)."""

from __future__ import annotations

import re

import pytest

from tests.bench.early import quick


@pytest.mark.long(
    reason=(
        "the whole ranker loop at bench size; twin: "
        "tests/flows/test_stage_flows.py::test_evaluate_newest_shows_the_delta (every stage, "
        "small)"
    )
)
@pytest.mark.bench("learning.py")
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(1500)  # every stage of the loop, on a shared 2-core machine
def test_learning_bench_quick_runs_the_whole_loop():
    proc = quick("learning.py", timeout=1200)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    expert = re.search(r"expert bench-noisy-expert, noise .*: (\d+) trajectories, (\d+) steps", out)
    assert expert and int(expert.group(1)) == 24 and int(expert.group(2)) > 24
    sizes = dict(re.findall(r"dataset bench-(\w+): \{'sft': (\d+)", out))
    assert 0 < int(sizes["curated"]) < int(sizes["unfiltered"])  # failures filtered out
    cov = float(re.search(r"oracle coverage of the candidate generator: ([\d.]+)%", out)[1])
    assert 80.0 <= cov <= 100.0
    m = re.search(r"sft curated: \d+ rows, \d+ steps .*, loss ([\d.]+) -> ([\d.]+)", out)
    assert m and float(m[2]) < float(m[1])
    assert "sft unfiltered" not in out  # (the same code path: the full size runs it)
    assert re.search(r"sft tiny VLM: \d+ examples in [\d.]+ s", out)
    evals = re.findall(
        r"^  (untrained|sft \w+|rl(?: [\w+-]+)?)\s+(val|test|ood)\s+(\d+)/(\d+)", out, re.M
    )
    assert [(a, b) for a, b, *_ in evals] == [
        ("untrained", "test"),
        ("sft curated", "val"),
        ("sft curated", "test"),
        ("sft curated", "ood"),
        ("rl sampled", "val"),  # every RL configuration on val ...
        ("rl greedy+expert", "val"),
        ("rl", "test"),  # ... the chosen one on the held-out splits
        ("rl", "ood"),
    ]
    assert all(0 <= int(k) <= int(n) and 0 < int(n) <= 3 for *_, k, n in evals)
    table = out.split("sft curated on test, per template (solved of n):\n")[1]
    rows = re.findall(r"^  ([a-z_]+)\s+(\d+) of (\d+)", table.split("\nrl ")[0], re.M)
    solved = {(a, b): int(k) for a, b, k, _ in evals}
    assert sum(int(n) for *_, n in rows) == 3  # the test tasks, by template
    assert sum(int(k) for _, k, _ in rows) == solved[("sft curated", "test")]
    rl = r"rl (sampled|greedy\+expert) iteration 0 \(step_grpo\): mean reward of the samples"
    assert len(set(re.findall(rl, out))) == 2, out
    tried = re.findall(r"^  (sampled|greedy\+expert)\s+val (\d+)/\d+ .*?( <- chosen)?$", out, re.M)
    assert [t[0] for t in tried] == ["sampled", "greedy+expert"]
    chosen = [name for name, _, mark in tried if mark]
    assert len(chosen) == 1  # the most val successes (ties: the first listed) ...
    assert int(dict((n, k) for n, k, _ in tried)[chosen[0]]) == max(int(k) for _, k, _ in tried)
    assert f"rl = rl {chosen[0]} (chosen on val)" in out  # ... is the one tested
    diffs = re.findall(r"^  (val|test|ood)\s+(.+?) - (.+?): [+-][\d.]+% \[", out, re.M)
    assert [d[0] for d in diffs] == ["val", "val", "test", "test", "ood"]
    # the same seeded tasks for every checkpoint: the comparisons are paired
    assert len(re.findall(r"paired on \d+ tasks \(\d+ templates\).*McNemar p", out)) == 5, out
