"""Experiment trackers beside the warehouse: TensorBoard, MLflow, Weights & Biases.

``--report-to`` follows the Hugging Face Trainer's convention: ``none`` (the default), or one or
more of ``tensorboard``, ``mlflow``, ``wandb`` (comma-separated), or ``all``. Each tracker gets the
scalars the warehouse's ``metrics`` table gets, at the same steps, plus the run's config and its
lineage (training run id, dataset id, pinned snapshot, stage): what trained the curves is
answerable from the tracker too. The warehouse stays the source of truth; a tracker that fails
to log stops nothing it has not started (its error is raised when it opens, before training).

Where each writes (``root``: ``$WEBLOOP_HOME/trackers`` unless the tracker's own setting says):

* TensorBoard: event files under ``root/tensorboard/<training_run_id>/`` (``torch``'s
  ``SummaryWriter``); the config as text.
* MLflow: the tracking URI of ``MLFLOW_TRACKING_URI`` or a local SQLite store
  ``root/mlflow.db``; experiment ``MLFLOW_EXPERIMENT_NAME`` or ``webloop``; one MLflow run per
  training run (a resumed run logs into the same one, found by its ``webloop.training_run_id``
  tag); params are the flattened config, tags the lineage.
* W&B: ``wandb.init`` with project ``WANDB_PROJECT`` or ``webloop``, a run id derived from the
  training run id (resumes into the same run), files under ``root`` (``WANDB_DIR`` overrides);
  ``WANDB_MODE=offline`` writes the run folder without network, to ``wandb sync`` later.

Secrets: values are passed through :func:`warehouse.secrets.redact` before any tracker sees them
(API keys come from the environment and are never logged).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from warehouse.secrets import redact

TRACKERS = ("tensorboard", "mlflow", "wandb")
TAG = "webloop.training_run_id"


class TrackerError(ValueError):
    """An unknown tracker name, or a tracker that cannot start (its package missing …)."""


def parse_report_to(text: str | None) -> tuple[str, ...]:
    """``none`` / ``all`` / ``tensorboard,mlflow`` → the trackers' names (validated)."""
    names = [n.strip().lower() for n in (text or "none").split(",") if n.strip()]
    if names in ([], ["none"]):
        return ()
    if names == ["all"]:
        return TRACKERS
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise TrackerError(
            f"report_to: unknown tracker(s) {unknown}; choose none, all or any of "
            f"{', '.join(TRACKERS)} (comma-separated)"
        )
    return tuple(dict.fromkeys(names))


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as ``{"rollout.n_tasks": "4", …}`` (string values, secrets masked)."""
    out: dict[str, str] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = redact(v if isinstance(v, str) else json.dumps(v, default=str))
    return out


class _TensorBoard:
    def __init__(self, root: Path, run: str, config: dict[str, str], tags: dict[str, str]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(root / "tensorboard" / run))
        lines = [f"| {k} | {v} |" for k, v in {**tags, **config}.items()]
        self.writer.add_text("config", "| key | value |\n|---|---|\n" + "\n".join(lines))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def close(self, _status: str) -> None:
        self.writer.flush()
        self.writer.close()


class _MLflow:
    def __init__(self, root: Path, run: str, config: dict[str, str], tags: dict[str, str]):
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "webloop"
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        found = self.client.search_runs([exp_id], filter_string=f"tags.`{TAG}` = '{run}'")
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return  # a resumed training run: its params are already there
        self.run_id = self.client.create_run(exp_id, run_name=run, tags=tags).info.run_id
        params = [Param(k, v[:6000]) for k, v in config.items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_batch(self.run_id, tags=[RunTag("mlflow.note.content", "webloop")])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(_mlflow_key(k), float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=rows)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if status == "completed" else "FAILED")


def _mlflow_key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", name)


class _WandB:
    def __init__(self, root: Path, run: str, config: dict[str, str], tags: dict[str, str]):
        import wandb

        folder = Path(os.environ.get("WANDB_DIR") or root)
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "webloop",
            id=re.sub(r"[^a-z0-9-]", "-", run.lower())[:64],
            name=run,
            dir=str(folder),
            config={**config, **tags},
            tags=[tags.get("stage", "train")],
            resume="allow",
            settings=wandb.Settings(console="off", silent=True),
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "completed" else 1)


_KINDS = {"tensorboard": _TensorBoard, "mlflow": _MLflow, "wandb": _WandB}


class Trackers:
    """The trackers of one training run; :meth:`log` as the warehouse's metrics log is called.

    ``names``: from :func:`parse_report_to`. ``run``: the training run id. ``config``: the
    run's config (flattened, secrets masked). ``lineage``: dataset id, snapshot, stage …
    (tags). An empty ``names`` makes a no-op."""

    def __init__(
        self,
        names: tuple[str, ...],
        *,
        root: Path,
        run: str,
        config: Mapping[str, Any],
        lineage: Mapping[str, Any],
    ) -> None:
        self.names = names
        flat = flatten(config)
        tags = {k: redact(str(v)) for k, v in lineage.items() if v is not None}
        tags[TAG] = run
        self._open: list[Any] = []
        try:
            for name in names:
                self._open.append(_KINDS[name](root, run, flat, tags))
        except ImportError as exc:
            self.close("failed")
            raise TrackerError(
                f"report_to {name}: its package is not installed ({exc}); "
                "pip install 'webloop[trackers]'"
            ) from exc

    def log(self, step: int, metrics: Mapping[str, float | None]) -> None:
        values = {k: float(v) for k, v in metrics.items() if v is not None}
        for t in self._open:
            t.log(step, values)

    def close(self, status: str = "completed") -> None:
        opened, self._open = self._open, []
        for t in opened:
            t.close(status)
