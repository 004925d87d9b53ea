"""Exports never write into a filesystem root nor through an OUT that is a symbolic link: both
refused with a clear error before anything is created (om2w export and dataset export)."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from curation.examples import Examples
from curation.export import ExportInfo, export
from warehouse import Warehouse, sample
from warehouse.interop import om2w
from warehouse.outdir import UnsafeOutputDir, check_out_dir

ROOTS = ["/", "/.", "//", "/tmp/..", "/../.."]


@pytest.fixture
def forbid_writes(monkeypatch: pytest.MonkeyPatch):
    """Any folder or file creation fails the test instead of touching the disk (so that code
    without the check cannot write into ``/`` while the test shows it would)."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"tried to create {args[:1]}")

    monkeypatch.setattr(Path, "mkdir", refuse)
    monkeypatch.setattr(os, "mkdir", refuse)
    monkeypatch.setattr(os, "open", refuse)


@pytest.fixture
def run_id(wh: Warehouse) -> str:
    data = sample.generate(seed=3, n_tasks=2, samples=1)
    sample.load(wh, data)
    return data.run.run_id


def _dataset() -> tuple[Examples, ExportInfo]:
    info = ExportInfo(
        dataset_id="ds-1",
        name="tiny",
        description="",
        snapshot_id=1,
        recipe={"name": "tiny"},
        recipe_hash="0" * 64,
        report=[],
        composition=pl.DataFrame(
            schema={"site": pl.Utf8, "split": pl.Utf8, "policy": pl.Utf8, "trajectories": pl.Int64}
        ),
        sources=pl.DataFrame(schema={"suite": pl.Utf8, "source": pl.Utf8, "tasks": pl.Int64}),
        curriculum=[],
        horizon=[],
        gates=[],
    )
    return Examples(), info


def _export_dataset(out: str | Path) -> Path:
    ex, info = _dataset()
    return export(ex, info, Path(out), progress=lambda _: None)


# -- a filesystem root ---------------------------------------------------------------------------


@pytest.mark.parametrize("out", ROOTS)
def test_om2w_export_refuses_a_filesystem_root(wh: Warehouse, run_id: str, out: str, forbid_writes):
    with pytest.raises(UnsafeOutputDir, match="filesystem root"):
        om2w.export_om2w(wh, run_id, out)


@pytest.mark.parametrize("out", ROOTS)
def test_dataset_export_refuses_a_filesystem_root(out: str, forbid_writes):
    with pytest.raises(UnsafeOutputDir, match="filesystem root"):
        _export_dataset(out)


def test_a_relative_out_that_resolves_to_the_root_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir("/")
    for out in (".", "", "tmp/.."):
        with pytest.raises(UnsafeOutputDir, match="filesystem root"):
            check_out_dir(out)


# -- OUT is a symbolic link ----------------------------------------------------------------------


def _linked(tmp_path: Path, *, dangling: bool = False) -> tuple[Path, Path]:
    target = tmp_path / "elsewhere"
    if not dangling:
        target.mkdir()
    link = tmp_path / "out"
    link.symlink_to(target, target_is_directory=True)
    return link, target


@pytest.mark.parametrize("dangling", [False, True])
def test_om2w_export_refuses_an_out_that_is_a_link(
    wh: Warehouse, run_id: str, tmp_path: Path, dangling: bool
):
    link, target = _linked(tmp_path, dangling=dangling)
    for out in (link, f"{link}/"):
        with pytest.raises(UnsafeOutputDir, match="symbolic link"):
            om2w.export_om2w(wh, run_id, out)
    assert (list(target.iterdir()) if target.exists() else []) == []
    assert not dangling or not target.exists()


@pytest.mark.parametrize("dangling", [False, True])
def test_dataset_export_refuses_an_out_that_is_a_link(tmp_path: Path, dangling: bool):
    link, target = _linked(tmp_path, dangling=dangling)
    with pytest.raises(UnsafeOutputDir, match="symbolic link"):
        _export_dataset(link)
    assert (list(target.iterdir()) if target.exists() else []) == []


def test_links_above_out_are_followed(wh: Warehouse, run_id: str, tmp_path: Path):
    """Only OUT itself is checked: a link further up is the system's layout (macOS /var)."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "up").symlink_to(real, target_is_directory=True)
    rep = om2w.export_om2w(wh, run_id, tmp_path / "up" / "out")
    assert len(rep.folders) == 2 and len(list((real / "out").iterdir())) == 2
    assert _export_dataset(tmp_path / "up" / "ds").parent == tmp_path / "up" / "ds"
    assert (real / "ds" / "tiny-ds-1" / "recipe.json").is_file()


def test_unsafe_out_is_a_warehouse_error():
    """A :class:`WarehouseError`: the CLI prints its message and exits 2, no traceback."""
    from warehouse.connection import WarehouseError

    assert issubclass(UnsafeOutputDir, WarehouseError)
