from __future__ import annotations

from collections.abc import Iterator

import pytest

from sites.server import SiteServer


@pytest.fixture(scope="module")
def server() -> Iterator[SiteServer]:
    with SiteServer(seed=0, slow_s=0.1) as s:
        yield s
