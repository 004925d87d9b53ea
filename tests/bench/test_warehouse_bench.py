"""``bench/warehouse.py --quick`` runs in the suite: the script must exit 0, both stores must hold
every row it wrote (a baseline that inserts nothing fails here), and every figure it prints must
parse as a positive number. No assertion on speed: the figures depend on the machine."""

from __future__ import annotations

import re

import pytest

from tests.bench.early import quick

NUM = r"([\d,]+(?:\.\d+)?)"


def number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.long(
    reason=(
        "the warehouse bench at --quick size; twin: "
        "tests/warehouse/test_writes.py::test_write_many_is_one_transaction"
    )
)
@pytest.mark.bench("warehouse.py")
@pytest.mark.slow
def test_warehouse_bench_quick_ingests_every_row_into_both_stores():
    proc = quick("warehouse.py", timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]

    counts = re.findall(
        rf"rows in (DuckLake|plain DuckDB): {NUM} steps / {NUM} trajectories "
        rf"\(expected {NUM} / {NUM}\)",
        out,
    )
    # the 1,000-step DuckLake, the plain DuckDB baseline, the big-batch DuckLake
    assert [c[0] for c in counts] == ["DuckLake", "plain DuckDB", "DuckLake"], out
    for _store, steps, trajs, want_steps, want_trajs in counts:
        assert number(steps) == number(want_steps) > 0, out
        assert number(trajs) == number(want_trajs) > 0, out
    assert number(counts[0][1]) == number(counts[1][1]) == 20_000, out  # same rows in both

    rates = re.findall(
        rf"ingest, (DuckLake|plain DuckDB), {NUM}-step txns:\s+{NUM}\s+{NUM}s\s+{NUM}s\s+"
        rf"\({NUM} steps\)",
        out,
    )
    assert [r[0] for r in rates] == ["DuckLake", "plain DuckDB", "DuckLake"], out
    for _store, _batch, rate, wall, _cpu, steps in rates:
        assert number(rate) > 0 and number(wall) > 0 and number(steps) > 0, out
    assert re.search(rf"ratio DuckLake / plain DuckDB \(wall\): {NUM}", out), out
    for query in ("trajectory_summary", "success_by"):
        m = re.search(rf"{query} over 20,000 steps: {NUM} ms", out)
        assert m and number(m.group(1)) > 0, out
