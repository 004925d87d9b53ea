"""Curation fixtures: the hand-countable warehouse of tests/curation/fixture.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.curation.fixture import Fixture, build_fixture_warehouse
from warehouse import Warehouse


@pytest.fixture
def fixture_wh(wh: Warehouse) -> Iterator[tuple[Warehouse, Fixture]]:
    """A warehouse holding the curation fixture, and what was written (snapshot id, screens)."""
    yield wh, build_fixture_warehouse(wh)
