"""``bench/rollouts.py --quick`` runs every section and prints figures that parse, with the same
step and model-call counts in the async and lock-step arms (the baseline does the same work)."""

from __future__ import annotations

import re

import pytest

from tests.bench.early import quick

NUM = r"(\d+(?:\.\d+)?)"


@pytest.mark.long(
    reason=(
        "the rollouts bench at --quick size; twin: "
        "tests/rollouts/test_engine.py::test_a_free_slot_takes_the_next_job_while_others_still_run"
    )
)
@pytest.mark.bench("rollouts.py")
@pytest.mark.browser
@pytest.mark.slow
def test_quick_rollouts_bench_prints_figures_and_equal_work():
    proc = quick("rollouts.py", timeout=540)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    eff = re.findall(rf"engine +{NUM} steps/s, bare +{NUM} steps/s, efficiency {NUM}", out)
    assert len(eff) == 2 and all(float(x) > 0 for row in eff for x in row)
    for arm in ("browser arm", "simulated arm"):
        rates = {
            name: re.search(rf"{arm}: {name} +median {NUM} \(min {NUM}, max {NUM}\)", out)
            for name in ("async", "lock-step")
        }
        assert all(m and float(m.group(1)) > 0 for m in rates.values()), out
        m = re.search(rf"{arm}: speed-up {NUM}x .*ideal for this run {NUM}x", out)
        assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, out
        m = re.search(rf"{arm}: async at {NUM} of C / mean .* sigma {NUM} configured", out)
        assert m and float(m.group(1)) > 0, out
        m = re.search(
            rf"{arm}: counts per run: async (\d+) steps, (\d+) model calls; "
            rf"lock-step (\d+) steps, (\d+) model calls; (equal|NOT EQUAL)",
            out,
        )
        assert m, out
        a_steps, a_calls, l_steps, l_calls = map(int, m.groups()[:4])
        assert a_steps == l_steps > 0 and a_calls == l_calls > 0 and m.group(5) == "equal"
