"""Task versioning and warehouse configuration."""

from __future__ import annotations

import dataclasses

import pytest

from warehouse import Warehouse, WarehouseConfig
from warehouse.config import ConfigError, postgres_dsn
from warehouse.records import Task
from warehouse.tasks import latest_tasks, put_tasks


def test_a_changed_task_gets_a_new_version_never_an_overwrite(wh: Warehouse):
    t = Task(task_id="t1", suite="s", instruction="Buy a mug", start_url="http://shop/")
    assert put_tasks(wh, [t]).new == ["t1"]
    assert put_tasks(wh, [t]).unchanged == ["t1"]
    rep = put_tasks(wh, [dataclasses.replace(t, instruction="Buy two mugs")])
    assert rep.new_version == ["t1"] and rep.stored[0].version == 2
    versions = wh.read(Task).sort("version")
    assert versions["instruction"].to_list() == ["Buy a mug", "Buy two mugs"]
    assert latest_tasks(wh)["version"].to_list() == [2]


def test_postgres_urls_become_libpq_strings_and_hide_the_password():
    dsn, secret = postgres_dsn("postgresql://ana:s3cr%40t@db.local:5433/lake?sslmode=require")
    assert secret == "s3cr@t"
    assert "host=db.local" in dsn and "port=5433" in dsn and "dbname=lake" in dsn
    assert "sslmode=require" in dsn and "user=ana" in dsn
    assert "s3cr" not in dsn and "password" not in dsn  # DuckDB gets it as a secret
    cfg = WarehouseConfig.from_env(home="/tmp/x", warehouse="postgresql://ana:s3cr%40t@h/lake")
    assert cfg.catalog_kind == "postgres"
    assert "s3cr@t" not in cfg.describe() and cfg.secret == "s3cr@t"
    assert "s3cr@t" not in repr(cfg)
    with pytest.raises(ConfigError, match="names no database"):
        postgres_dsn("postgresql://h:5432/")


def test_config_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("WEBLOOP_HOME", str(tmp_path))
    monkeypatch.delenv("WEBLOOP_WAREHOUSE", raising=False)
    cfg = WarehouseConfig.from_env()
    assert cfg.catalog == str(tmp_path / "lake" / "catalog.sqlite")
    assert cfg.data_path == str(tmp_path / "lake" / "data") + "/"
    monkeypatch.setenv("WEBLOOP_WAREHOUSE", "mysql://nope")
    with pytest.raises(ConfigError, match="unsupported catalog URL"):
        WarehouseConfig.from_env()
