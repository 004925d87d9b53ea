"""Training bookkeeping in the warehouse: runs, per-step metrics, checkpoints, lineage.

A training run is named by what it does (stage, base model, dataset or source runs, config), so
the same command resumes the same run. Metrics are buffered and written in batches (one DuckLake
transaction per flush); a re-logged step replaces its row (``metrics`` upserts on
``(training_run_id, step, name)``), so a resumed run never holds a step twice. A checkpoint row
records the folder and the sha256 of its weight files. "Which data trained this checkpoint" is
one join (:data:`LINEAGE_SQL`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warehouse.ids import make_id
from warehouse.records import Checkpoint, Metric, TrainingRun, utcnow
from warehouse.store import Warehouse

LINEAGE_SQL = """
SELECT c.checkpoint_id, c.step, c.path, r.training_run_id, r.stage, r.base_model,
       r.dataset_id, d.name AS dataset, d.snapshot_id, r.run_id AS source_run
FROM checkpoints c
JOIN training_runs r USING (training_run_id)
LEFT JOIN datasets d USING (dataset_id)
"""
"""Checkpoint → training run → dataset → pinned warehouse snapshot, one row per checkpoint."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".json")


def training_run_id(stage: str, base_model: str, source: str | None, config: dict[str, Any]) -> str:
    """Deterministic id of a training run: same stage, model, data and config → same run."""
    return make_id(f"train-{stage}", base_model, source, config)


def start_run(
    wh: Warehouse,
    run_id: str,
    *,
    stage: str,
    base_model: str,
    dataset_id: str | None,
    source_run: str | None,
    config: dict[str, Any],
    code_version: str | None,
) -> TrainingRun:
    """Write (or re-open) the run as ``running``; a resumed run keeps its first start time."""
    old = wh.sql(
        "SELECT started_at FROM training_runs WHERE training_run_id = ?", [run_id]
    ).to_series()
    started = old[0] if len(old) and old[0] is not None else utcnow()
    row = TrainingRun(
        training_run_id=run_id,
        stage=stage,
        base_model=base_model,
        dataset_id=dataset_id,
        run_id=source_run,
        config=config,
        code_version=code_version,
        status="running",
        started_at=started,
    )
    wh.write([row])
    return row


def end_run(wh: Warehouse, row: TrainingRun, status: str) -> None:
    """Mark the run ``completed`` or ``failed``."""
    from dataclasses import replace

    wh.write([replace(row, status=status, ended_at=utcnow())])


@dataclass
class MetricsLog:
    """Buffers ``(step, {name: value})`` and writes them every ``every`` steps and on flush."""

    wh: Warehouse
    training_run_id: str
    every: int = 50
    _rows: list[Metric] = field(default_factory=list)
    _steps: int = 0

    def __call__(self, step: int, values: dict[str, float]) -> None:
        now = utcnow()
        self._rows += [
            Metric(self.training_run_id, int(step), name, float(v), now)
            for name, v in values.items()
            if v is not None
        ]
        self._steps += 1
        if self._steps % self.every == 0:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            self.wh.write(self._rows)
            self._rows = []


def weights_sha256(path: Path) -> str:
    """One sha256 over the checkpoint's weight and config files (names and bytes, sorted)."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        if f.suffix in WEIGHT_SUFFIXES and f.name != "trainer_state.json":
            h.update(str(f.relative_to(path)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def register_checkpoint(wh: Warehouse, training_run_id: str, step: int, path: Path) -> str:
    """Record a checkpoint folder; its id derives from the run and step."""
    cid = make_id("ckpt", training_run_id, step)
    wh.write(
        [
            Checkpoint(
                checkpoint_id=cid,
                training_run_id=training_run_id,
                step=int(step),
                path=str(Path(path).resolve()),
                sha256=weights_sha256(path),
            )
        ]
    )
    return cid


def find_checkpoint(wh: Warehouse, ref: str) -> dict[str, Any] | None:
    """A checkpoint by id, by folder path, or the last one of a training run id."""
    df = wh.sql(
        "SELECT c.*, r.base_model, r.stage, r.config FROM checkpoints c "
        "JOIN training_runs r USING (training_run_id) "
        "WHERE c.checkpoint_id = $q OR c.path = $p OR c.training_run_id = $q "
        "ORDER BY (c.checkpoint_id = $q) DESC, c.step DESC LIMIT 1",
        {"q": ref, "p": str(Path(ref).resolve()) if ref else ""},
    )
    return df.row(0, named=True) if not df.is_empty() else None


def lineage(wh: Warehouse, checkpoint_id: str | None = None) -> Any:
    """Rows of :data:`LINEAGE_SQL` (one checkpoint, or all)."""
    if checkpoint_id is None:
        return wh.sql(LINEAGE_SQL + " ORDER BY c.created_at")
    return wh.sql(LINEAGE_SQL + " WHERE c.checkpoint_id = ?", [checkpoint_id])
