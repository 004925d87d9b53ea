"""``bench/curation.py --quick`` runs in the suite: the fill writes every row it made, the real
build reports every stage, every filter of the recipe removed something, and the build, the
exported files and the dataset members agree with the bench's independent SQL count (the bench
exits non-zero otherwise; here the figures are re-read from its output). No assertion on speed."""

from __future__ import annotations

import re

import pytest

from tests.bench.early import quick

NUM = r"([\d,]+(?:\.\d+)?)"
STAGES = ["validate", "pin", "select", "examples", "gates", "export", "register", "total"]
FILTERS = [
    "verdict",
    "prm_threshold",
    "drop_invalid_steps",
    "drop_loops",
    "length",
    "dedup_trajectories",
    "dedup_tasks",
]


def number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.long(
    reason=(
        "the curation bench at --quick size; twin: "
        "tests/curation/test_build.py::test_build_registers_the_dataset_and_its_members"
    )
)
@pytest.mark.bench("curation.py")
@pytest.mark.slow
def test_curation_bench_quick_builds_what_the_sql_count_expects():
    proc = quick("curation.py", timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]

    fill = re.search(rf"fill: {NUM} tasks .* {NUM} trajectories, {NUM} steps, {NUM} distinct", out)
    assert fill, out
    assert [number(g) for g in fill.groups()] == [200, 2_000, 20_000, 80], out

    stages = {
        name: (number(wall), number(cpu))
        for name, wall, cpu in re.findall(rf"^stage (\w+) +{NUM} +{NUM}", out, re.M)
    }
    assert list(stages) == STAGES, out
    assert all(wall > 0 for wall, _ in stages.values()), out
    subs = re.findall(rf"^  select: filter (\S+) +{NUM} +{NUM}", out, re.M)
    assert [s[0] for s in subs] == ["exclude_infra", *FILTERS, "balance.per_task"], out

    removed = {
        m[0]: number(m[1]) + number(m[2])
        for m in re.findall(rf"removed by (\S+): {NUM} trajectories, {NUM} steps", out)
    }
    assert all(removed[f] > 0 for f in ["exclude_infra", *FILTERS]), removed

    peak = re.search(rf"peak RSS: build process {NUM} MB", out)
    assert peak and number(peak.group(1)) > 0, out

    want = re.search(
        rf"expected \(independent SQL count\): {NUM} trajectories, {NUM} steps = {NUM} sft "
        rf"examples, {NUM} rl rows",
        out,
    )
    assert want, out
    trajs, steps = number(want.group(1)), number(want.group(2))
    assert trajs > 0 and steps > trajs, out
    line = next(x for x in out.splitlines() if x.startswith("found: "))
    found = {k: number(v) for k, v in (item.rsplit(" ", 1) for item in line[7:].split(", "))}
    assert found["build sft"] == found["parquet sft"] == found["datasets sft"] == steps, found
    assert found["members steps"] == found["build steps"] == steps, found
    assert found["build rl"] == found["parquet rl"] == found["members trajectories"] == trajs
    assert "check: OK" in out, out
