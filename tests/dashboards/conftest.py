"""Fixtures of the dashboard tests: the fixture warehouse (built once per session) and a
helper that runs one page of the app with AppTest against a chosen warehouse."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.dashboards.fixture import build_dashboard_warehouse
from warehouse import Warehouse, WarehouseConfig

APP = Path(__file__).parents[2] / "dashboards" / "app.py"


@pytest.fixture(scope="session")
def dash_home(tmp_path_factory) -> Path:
    """WEBLOOP_HOME of the dashboard fixture warehouse (tests/dashboards/fixture.py)."""
    home = tmp_path_factory.mktemp("dash") / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
        build_dashboard_warehouse(wh)
    return home


def use_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> WarehouseConfig:
    monkeypatch.setenv("WEBLOOP_HOME", str(home))
    monkeypatch.setenv("WEBLOOP_WAREHOUSE", "")
    for var in ("WEBLOOP_DATA_PATH", "WEBLOOP_BLOBS"):
        monkeypatch.delenv(var, raising=False)
    return WarehouseConfig.from_env()


@pytest.fixture
def open_page(monkeypatch, dash_home) -> Iterator[Callable]:
    """``open_page(name, home=None, **query)``: the AppTest of page ``name`` after one run
    (``home``: another WEBLOOP_HOME than the fixture warehouse's)."""
    from streamlit.testing.v1 import AppTest

    def run(name: str, home: Path | None = None, **query: str):
        use_home(monkeypatch, home or dash_home)
        at = AppTest.from_file(str(APP), default_timeout=120)
        for k, v in query.items():
            at.query_params[k] = v
        at.switch_page(f"views/{name}.py")
        return at.run()

    yield run
    os.environ.pop("WEBLOOP_HOME", None)
