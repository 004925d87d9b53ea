"""Curation fixtures: the hand-countable warehouse of tests/curation/fixture.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.curation.fixture import Fixture, build_fixture_warehouse
from warehouse import Warehouse, WarehouseConfig


@pytest.fixture
def fixture_wh(wh: Warehouse) -> tuple[Warehouse, Fixture]:
    """A fresh warehouse holding the curation fixture (tests may write more into it)."""
    return wh, build_fixture_warehouse(wh)


@pytest.fixture(scope="module")
def shared_wh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Warehouse, Fixture]]:
    """One fixture warehouse per test module, for tests that only read it."""
    home = tmp_path_factory.mktemp("curation") / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as w:
        yield w, build_fixture_warehouse(w)
