"""Deterministic identifiers: the same inputs give the same id, so retries never duplicate."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def stable_hash(*parts: Any, length: int = 20) -> str:
    """Hex digest of the canonical JSON of ``parts`` (order matters, dict key order does not)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def make_id(prefix: str, *parts: Any) -> str:
    """``prefix-<hash of parts>``, e.g. ``traj-3f2a…`` for (run_id, task_id, sample_idx)."""
    return f"{prefix}-{stable_hash(*parts)}"


def run_id_for(kind: str, config: dict[str, Any], name: str | None = None) -> str:
    """A run is named by the user or by its configuration, so the same command resumes it."""
    return name if name else make_id(kind, config)


def traj_id_for(run_id: str, task_id: str, sample_idx: int) -> str:
    """A trajectory id derives from its run, task and sample index."""
    return make_id("traj", run_id, task_id, sample_idx)
