"""``bench/ood.py --quick`` runs in the suite: the few-shot curve on the held-out travel site
(expert demonstrations of the training sites plus K of travel → ranker SFT → closed-loop success,
criteria met and next-action accuracy on held-out travel tasks, K vs 0 paired). No assertion on
the figures' size: the quick size is far too small to measure them."""

from __future__ import annotations

import re

import pytest

from tests.bench.early import quick


@pytest.mark.long(
    reason=(
        "the held-out site's few-shot curve at bench size; twins: "
        "tests/flows/test_stage_flows.py::test_train_sft, "
        "tests/flows/test_stage_flows.py::test_evaluate"
    )
)
@pytest.mark.bench("ood.py")
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(900)
def test_ood_bench_quick_draws_the_few_shot_curve():
    proc = quick("ood.py", timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    pool, held = map(int, re.search(r"demonstration pool (\d+), held out (\d+)", out).groups())
    assert (pool, held) == (1, 2)
    sizes = dict(re.findall(r"dataset ood-(\d)-shot: \{'sft': (\d+)", out))
    assert int(sizes["0"]) < int(sizes["1"])  # the travel demonstration's rows are trained on
    curve = re.findall(
        r"^ +(\d+) demonstrations: success (\d+)/(\d+) .*criteria met ([\d.]+)%, "
        r"next-action accuracy (\d+)/(\d+)",
        out,
        re.M,
    )
    assert [c[0] for c in curve] == ["0", "1"]
    for _, k, n, met, hits, turns in curve:
        assert int(n) == 2 and 0 <= int(k) <= 2 and 0.0 <= float(met) <= 100.0
        assert int(turns) > 0 and 0 <= int(hits) <= int(turns)  # the expert's held-out states
    assert re.search(
        r"1 demonstrations: .*; vs 0: [+-][\d.]+% \[.*\] \(paired, McNemar p [\d.e-]+\)", out
    )
