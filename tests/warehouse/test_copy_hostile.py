"""``webloop warehouse copy`` of a catalog whose paths lead out of the data folder (a copied or
edited catalog): refused with the row that names the path, before anything is read or written."""

from __future__ import annotations

import hashlib
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from sites.tasks import generate
from warehouse import Warehouse, WarehouseConfig
from warehouse.copy import CopyError, copy_warehouse
from warehouse.tasks import put_tasks


def tree(root: Path) -> dict[str, str]:
    """Every file below ``root``, hashed (SQLite's side files, which any reader may create,
    left out)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and not p.name.endswith(("-wal", "-shm", "-journal"))
    }


def tasks_file(cfg: WarehouseConfig) -> tuple[int, int, Path]:
    """(data_file_id, table_id, path) of the tasks table's data file."""
    with sqlite3.connect(cfg.catalog) as con:
        file_id, table_id, name = con.execute(
            "SELECT f.data_file_id, f.table_id, f.path FROM ducklake_data_file f "
            "JOIN ducklake_table t USING (table_id) WHERE t.table_name = 'tasks'"
        ).fetchone()
    return file_id, table_id, Path(cfg.data_path) / "main" / "tasks" / name


def edit(cfg: WarehouseConfig, sql: str, *params: object) -> None:
    with sqlite3.connect(cfg.catalog) as con:
        con.execute(sql, params)


def move_outside(cfg: WarehouseConfig, tmp: Path, name: str) -> Path:
    """The attacker's target: the tasks table's real Parquet file, moved out of the data folder
    (so the catalog's counts still read right, as a planted file's would)."""
    _, _, real = tasks_file(cfg)
    outside = tmp / name
    outside.parent.mkdir(parents=True, exist_ok=True)
    real.rename(outside)
    return outside


def dot_dot(cfg: WarehouseConfig, tmp: Path, file_id: int) -> str:
    move_outside(cfg, tmp / "old", "secret.parquet")  # read from old/, written to tmp/
    path = "../../../../secret.parquet"
    edit(cfg, "UPDATE ducklake_data_file SET path = ? WHERE data_file_id = ?", path, file_id)
    return f"main/tasks/{path}"


def absolute(cfg: WarehouseConfig, tmp: Path, file_id: int) -> str:
    path = str(move_outside(cfg, tmp, "secret.parquet"))  # flagged relative all the same
    edit(cfg, "UPDATE ducklake_data_file SET path = ? WHERE data_file_id = ?", path, file_id)
    return f"main/tasks/{path}"


def backslash(cfg: WarehouseConfig, tmp: Path, file_id: int) -> str:
    path = "..\\..\\..\\..\\secret.parquet"
    edit(cfg, "UPDATE ducklake_data_file SET path = ? WHERE data_file_id = ?", path, file_id)
    return f"main/tasks/{path}"


def table_path(cfg: WarehouseConfig, tmp: Path, file_id: int) -> str:
    _, _, real = tasks_file(cfg)
    edit(cfg, "UPDATE ducklake_table SET path = '../../../' WHERE table_name = 'tasks'")
    return f"main/../../../{real.name}"


def link(cfg: WarehouseConfig, tmp: Path, file_id: int) -> str:
    outside = move_outside(cfg, tmp / "outside", "secret.parquet")
    (Path(cfg.data_path) / "main" / "tasks" / "evil").symlink_to(outside.parent)
    path = "evil/secret.parquet"
    edit(cfg, "UPDATE ducklake_data_file SET path = ? WHERE data_file_id = ?", path, file_id)
    return f"main/tasks/{path}"


@pytest.mark.parametrize(
    ("attack", "problem"),
    [
        (dot_dot, "a '..' component"),
        (absolute, "an absolute path"),
        (backslash, "a backslash in it"),
        (table_path, "a '..' component"),
        (link, "resolves to .*/outside/secret.parquet, outside"),
    ],
)
def test_a_catalog_path_leaving_the_data_folder_is_refused_before_anything_is_copied(
    tmp_path, monkeypatch, attack, problem
):
    src = WarehouseConfig.from_env(home=tmp_path / "old", warehouse="")
    with Warehouse.open(src) as wh:
        put_tasks(wh, generate(6, 0))
    file_id, table_id, _ = tasks_file(src)
    named = attack(src, tmp_path, file_id)
    dst = WarehouseConfig.from_env(
        home=tmp_path / "new", warehouse=str(tmp_path / "new" / "catalog.sqlite"),
        data_path=str(tmp_path / "new" / "data"), blob_path=src.blob_path,
    )  # fmt: skip
    before = tree(tmp_path)
    opened: list[str] = []
    real_copyfile = shutil.copyfile
    monkeypatch.setattr(shutil, "copyfile", lambda a, b: opened.append(a) or real_copyfile(a, b))
    row = f"ducklake_data_file row data_file_id={file_id} (table_id {table_id})"
    expected = "1 catalog path would leave the data path; nothing was copied: "
    expected += re.escape(f"{row} names {named!r}: ") + problem
    with pytest.raises(CopyError, match=expected):
        copy_warehouse(src, dst)
    assert opened == []  # no file was read for a copy
    assert tree(tmp_path) == before  # nothing written anywhere, the outside file untouched
    assert not (tmp_path / "new").exists()  # not even the destination catalog
