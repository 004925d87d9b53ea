"""``bench/demo_rounds.py --quick`` runs in the long tier: the demo's flywheel at a tiny size on
one seed in a fresh home, two rounds evaluated on the same held-out tasks; the bench's per-seed
line (solved per round, lost and gained) and its aims agree."""

from __future__ import annotations

import re

import pytest

from tests.bench.early import quick


@pytest.mark.long(
    reason=(
        "the demo's whole flywheel, two rounds, as a bench; twin: "
        "tests/flows/test_flywheel.py::test_each_round_leaves_its_rows"
    )
)
@pytest.mark.bench("demo_rounds.py")
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(900)
def test_demo_rounds_bench_quick_pairs_round_two_with_round_one():
    proc = quick("demo_rounds.py", timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    line = re.search(
        r"^seed 0: round 1 (\d+)/3 -> round 2 (\d+)/3 \(round 2 against round 1: "
        r"(\d+) lost, (\d+) gained\); (\d+) s$",
        out,
        re.M,
    )
    assert line, out[-3000:]
    one, two, lost, gained = (int(line[i]) for i in range(1, 5))
    assert two - one == gained - lost  # paired: the same three tasks in both rounds
    verdict = "met   " if two >= one else "MISSED"
    assert f"  {verdict} last round >= round 1 on every seed: {int(two >= one)} of 1 seeds" in out
    assert re.search(r"^  (met   |MISSED) every demo < 5 minutes: \d+-\d+ s$", out, re.M)
