"""``bench/dashboard.py --quick`` runs in the suite: it builds the synthetic warehouse, renders
the 30-step trajectory's page cold and cached, and prints the timings with the aims; here the
printed figures are read back (the page showed the asked step with its action drawn, every
timing is a positive number). No assertion on speed."""

from __future__ import annotations

import re

import pytest

from tests.bench.early import quick

NUM = r"([\d.]+)"


@pytest.mark.long(
    reason=(
        "the dashboard bench at --quick size; twin: "
        "tests/dashboards/test_browser.py::test_trajectory_page_in_chromium"
    )
)
@pytest.mark.bench("dashboard.py")
@pytest.mark.slow
def test_dashboard_bench_quick_renders_the_page_and_prints_the_aims():
    proc = quick("dashboard.py", timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert re.search(r"fill: .* 2,000 trajectories, 20,000 steps", out), out
    shows = re.search(r"page shows: bench-30 step 15 of 30, Drawn: click at \(620, 300\)", out)
    assert shows, out  # step 15 = 5 x 3: a click at x = 40 * 15 + 20
    cold = re.search(
        rf"page cold: {NUM} s wall, {NUM} s CPU \(aim < 1.5 s\) (OK|OVER); AppTest", out
    )
    cached = re.search(
        rf"page cached: median {NUM} s wall of 5 .*median {NUM} s CPU \(aim < 0.3 s\) (OK|OVER)",
        out,
    )
    assert cold and cached, out
    assert all(float(v) > 0 for v in (*cold.groups()[:2], *cached.groups()[:2]))
    funcs = re.findall(r"data functions \((first|again)\): (.*); list (\d+) rows, view (\d+)", out)
    assert [f[0] for f in funcs] == ["first", "again"], out
    assert all(int(rows) == 500 and int(steps) == 30 for _, _, rows, steps in funcs), funcs
