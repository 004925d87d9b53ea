"""DuckDB's extension signatures are checked once per process (warehouse.extensions): later
connections skip the check only while the folder holds exactly the files that passed it."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from warehouse import Warehouse, WarehouseConfig
from warehouse.connection import extension_directory
from warehouse.extensions import _subfolder, connect_config, verified


def unsigned_allowed(config: dict) -> bool:
    con = duckdb.connect(config=config)
    try:
        return con.execute("SELECT current_setting('allow_unsigned_extensions')").fetchone()[0]
    finally:
        con.close()


def folder_like_the_wheels(tmp_path: Path, tampered: str | None = None) -> Path:
    """A copy of the wheels' extension folder: links to the real files, but ``tampered`` (a file
    name) is a copy with one byte flipped in its code (not in its signature)."""
    real = Path(extension_directory()) / _subfolder()
    out = tmp_path / "ext"
    (out / _subfolder()).mkdir(parents=True)
    for f in real.glob("*.duckdb_extension"):
        target = out / _subfolder() / f.name
        if f.name == tampered:
            shutil.copyfile(f, target)
            with open(target, "r+b") as fh:
                fh.seek(1_000_000)
                byte = fh.read(1)
                fh.seek(1_000_000)
                fh.write(bytes([byte[0] ^ 0xFF]))
        else:
            target.symlink_to(f)
    return out


def test_a_warehouse_opened_twice_loads_its_extensions_unchecked_the_second_time(
    cfg: WarehouseConfig,
):
    with Warehouse.open(cfg) as wh:
        assert wh.sql("SELECT count(*) FROM tasks").item() == 0
    folder = extension_directory()
    assert verified(folder)  # the first open checked every file of the folder
    assert unsigned_allowed(connect_config(folder))
    with Warehouse.open(cfg) as wh:  # and the next open still works without the check
        assert wh.sql("SELECT current_setting('allow_unsigned_extensions')").item() is True


def test_a_tampered_extension_fails_the_check_and_is_never_loaded_unchecked(tmp_path: Path):
    folder = str(folder_like_the_wheels(tmp_path, tampered="ducklake.duckdb_extension"))
    assert not verified(folder)
    config = connect_config(folder)
    assert not unsigned_allowed(config)
    con = duckdb.connect(config=config)
    with pytest.raises(duckdb.Error, match="signature"):
        con.execute(f"ATTACH 'ducklake:sqlite:{tmp_path}/meta.sqlite' AS lake")
    con.close()


def test_a_file_replaced_after_the_check_turns_the_check_back_on(tmp_path: Path):
    good = folder_like_the_wheels(tmp_path / "a")
    assert verified(str(good))
    assert unsigned_allowed(connect_config(str(good)))
    bad = folder_like_the_wheels(tmp_path / "b", tampered="sqlite_scanner.duckdb_extension")
    name = Path(_subfolder()) / "sqlite_scanner.duckdb_extension"
    (good / name).unlink()
    shutil.move(bad / name, good / name)  # another file under the verified name
    assert not verified(str(good))
    assert not unsigned_allowed(connect_config(str(good)))
    (good / name).unlink()  # the real file back: checked again, passes
    (good / name).symlink_to(Path(extension_directory()) / name)
    assert verified(str(good))
    assert unsigned_allowed(connect_config(str(good)))
