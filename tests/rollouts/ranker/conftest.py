"""Fixtures of the ranker's live-page tests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.rollouts.ranker.fixture import bundled_tasks


@pytest.fixture(scope="module")
def tasks() -> list[Any]:
    return bundled_tasks()
