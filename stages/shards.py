"""Stages whose work shards across Dask workers (collect, judge, score-steps) share one shape:

* ``sharded_session(wh, cfg)``: a context manager, entered in the flow process, that records the
  run (and holds its lease) and yields a :class:`Session`: the run id and the items to shard;
* ``run_shard(wh, cfg, run_id, items)``: one worker's share (idempotent: it skips what is
  stored, so Dask may rerun it when a worker dies);
* ``merge_shards(cfg, session, parts, workers)``: the run's result from the shards' results.

``flows.dask_scale.run_sharded`` drives any such stage; the stages know nothing of Dask."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def _no_fence() -> None:
    return None


@dataclass
class Session:
    """A sharded run in progress: its id, the items to shard, how many items the run has in
    all (``total``), ``fence`` to call before the run is declared done (the lease check), and
    stage-specific ``extra`` the merge needs."""

    run_id: str
    items: list[Any]
    total: int = 0
    fence: Callable[[], None] = _no_fence
    extra: dict[str, Any] = field(default_factory=dict)
