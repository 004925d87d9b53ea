"""``bench/learning.py --quick`` runs in the suite: every stage of the loop (noisy expert →
judge → curated and unfiltered datasets → ranker SFT on the curated one → tiny VLM SFT →
evaluations → DAgger-style RL (states labelled while rolling out, first errors scored, a
buffer), chosen on val against SFT itself → evaluations → the aims) produces what
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
    evals = re.findall(r"^  (sft \w+|rl(?: [\w+-]+)?)\s+(val|test|ood)\s+(\d+)/(\d+)", out, re.M)
    sft_chosen = "(SFT was chosen: RL's test figures are SFT's)" in out
    assert [(a, b) for a, b, *_ in evals] == [
        ("sft curated", "val"),
        ("rl dagger", "val"),  # every RL configuration on val ...
        ("sft curated", "test"),
        *([] if sft_chosen else [("rl", "test")]),  # ... the chosen one on test
    ]
    assert all(0 <= int(k) <= int(n) and 0 < int(n) <= 3 for *_, k, n in evals)
    table = out.split("sft curated on test, per template (solved of n):\n")[1]
    rows = re.findall(r"^  ([a-z_]+)\s+(\d+) of (\d+)", table.split("\nrl ")[0], re.M)
    solved = {(a, b): int(k) for a, b, k, _ in evals}
    assert sum(int(n) for *_, n in rows) == 3  # the test tasks, by template
    assert sum(int(k) for _, k, _ in rows) == solved[("sft curated", "test")]
    # DAgger: the rollouts labelled their states; the first errors' states were scored
    scored = re.findall(r"rl iteration \d: (\d+) states, (\d+) candidates scored by reference", out)
    assert len(scored) == 2 and sum(int(c) for _, c in scored) > 0, out
    iters = re.findall(r"rl dagger iteration (\d) \(step_best\): .*, (\d+)/(\d+) turns", out)
    assert [i for i, *_ in iters] == ["0", "1"]
    assert int(iters[1][2]) >= int(iters[0][2])  # the buffer keeps the first iteration's states
    tried = re.findall(r"^  (sft|dagger)\s+val (\d+)/\d+ .*?( <- chosen)?$", out, re.M)
    assert [t[0] for t in tried] == ["sft", "dagger"]  # SFT itself is a candidate
    chosen = [name for name, _, mark in tried if mark]
    assert len(chosen) == 1  # the most val successes (ties: the earlier, SFT first) ...
    assert int(dict((n, k) for n, k, _ in tried)[chosen[0]]) == max(int(k) for _, k, _ in tried)
    assert f"rl = {chosen[0]} (chosen on val)" in out and sft_chosen == (chosen[0] == "sft")
    diffs = re.findall(r"^  (val|test)\s+(.+?) - (.+?): [+-][\d.]+%, within templates", out, re.M)
    assert [d[0] for d in diffs] == ["val", "test"]
    # the same seeded tasks for every checkpoint: the comparisons are paired
    assert len(re.findall(r"paired on \d+ tasks \(\d+ templates\).*McNemar p", out)) == 2, out
    aims = re.findall(r"^  (met   |MISSED) (.+?): ", out.split("aims (RL - SFT on test):")[1], re.M)
    assert [a for _, a in aims] == [
        "diff >= +5 points",
        "McNemar p < 0.05",
        "within-template lower bound > 0",
        "no template loses > 2 tasks",
        ">= 300 test tasks",
    ]
    assert aims[-1][0] == "MISSED"  # 3 test tasks at the quick size
