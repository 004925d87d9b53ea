"""The ``--quick`` size of the sites and judging benchmarks runs in the suite, so a broken
benchmark fails CI; each check reads the figures it prints and asserts they are the real work
(every task checked, every model call counted), not only that the script exited."""

from __future__ import annotations

import re

import pytest

from tests.bench.early import quick


def run_bench(name: str, *args: str, timeout: int = 600) -> str:
    proc = quick(name, *args, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.long(
    reason=(
        "the sites bench at --quick size; twin: "
        "tests/sites/test_conformance.py::test_generated_tasks_are_solvable"
    )
)
@pytest.mark.bench("sites.py")
@pytest.mark.browser
def test_sites_bench_quick_checks_every_task_with_the_expert():
    out = run_bench("sites.py")
    m = re.search(r"expert success: (\d+)/(\d+) = ([\d.]+)%", out)
    assert m, out
    assert int(m.group(2)) == 8 and int(m.group(1)) == 8  # the expert solves every bundled task
    latency = re.search(r"page latency, all (\d+) HTML responses: median ([\d.]+) ms", out)
    assert latency and int(latency.group(1)) >= 8, out  # the server measured real page loads


@pytest.mark.long(
    reason=(
        "the judging bench at --quick size; twin: "
        "tests/judging/test_rubric_vlm.py::test_model_selection_costs_at_most_n_plus_2_calls_and_caps_images"
    )
)
@pytest.mark.bench("judging.py")
@pytest.mark.slow
def test_judging_bench_quick_counts_n_plus_two_calls():
    out = run_bench("judging.py")
    rows = re.findall(
        r"selection=(\w+)\s+concurrency\s+(\d+): ([\d.]+) model calls/trajectory \(N\+2 = (\d+)\), "
        r"([\d.]+) image inputs/trajectory, ([\d.]+) trajectories/s",
        out,
    )
    assert len(rows) == 4, out
    for selection, _c, calls, n_plus_2, images, per_s in rows:
        expected = float(n_plus_2) if selection == "model" else 2.0
        assert float(calls) == expected and float(images) > 0 and float(per_s) > 0


@pytest.mark.long(
    reason=(
        "the training bench (1 process against DDP) at --quick size; twin: "
        "tests/cli/test_train_cli.py::test_two_processes_train_the_tiny_vlm_and_every_tracker_gets_the_warehouse_s_curve"
    )
)
@pytest.mark.bench("training.py")
def test_training_bench_quick_runs_every_arm_on_the_same_steps():
    out = run_bench("training.py")
    rows = re.findall(
        r"^(1 process|ddp x2|fsdp x2): (\d+) steps, ([\d.]+) examples/s, (\d+) reply tokens/s",
        out,
        re.M,
    )
    assert [r[0] for r in rows] == ["1 process", "ddp x2"], out
    assert all(int(r[1]) == 3 and float(r[2]) > 0 and int(r[3]) > 0 for r in rows)
    diffs = re.findall(r"scaling efficiency (\d+)%, max \|loss - baseline's\| ([\d.e+-]+)", out)
    assert len(diffs) == 1 and all(float(d) < 1e-5 for _, d in diffs), out  # the same work
