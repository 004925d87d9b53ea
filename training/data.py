"""Training data: curated dataset exports and collected runs → :class:`~training.interface.Turn`.

Two sources:

* SFT — a dataset built by ``webloop curate`` (registered in ``datasets``, exported as
  ``parquet/sft.parquet``): one turn per row, the prompt exactly as the policy saw it
  (``render(messages)``, images as ``sha256:`` references) and the screenshots as stored PNG bytes.
* RL — the trajectories of a collect run (the current policy's samples): one turn per stored
  step, the prompt read back from its blob (``steps.prompt_hash``), the reply the model wrote
  (``model_output``), the log-prob it had when sampled (``steps.logprob``: the PPO "old"
  log-prob), and the trajectory's reward and status for the advantage estimators.

Everything that cannot train is reported with where it is: a dataset name that is not
registered, an export that is gone, another prompt format, a split with no rows, a step whose
prompt blob is missing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from rollouts.prompts import BLOB_REF, PROMPT_FORMAT_VERSION
from training.interface import DataMismatch, Turn
from warehouse.blobs import BlobError
from warehouse.records import INFRA_ERROR, TIMEOUT
from warehouse.relations import outcome_sql, with_relations
from warehouse.store import Warehouse

REWARDS = {"success": 1.0, "failure": 0.0}  # trajectory status → reward (curation uses the same)
NO_REWARD = (INFRA_ERROR, TIMEOUT)  # never a reward, never a turn that trains


@dataclass(frozen=True)
class DatasetRef:
    """A registered dataset: what a training run records as its data."""

    dataset_id: str
    name: str
    snapshot_id: int
    export_path: Path


def find_dataset(wh: Warehouse, name_or_id: str) -> DatasetRef:
    """The dataset with this id, or the newest one with this name."""
    df = wh.sql(
        "SELECT dataset_id, name, snapshot_id, export_path FROM datasets "
        "WHERE dataset_id = $q OR name = $q ORDER BY (dataset_id = $q) DESC, created_at DESC "
        "LIMIT 1",
        {"q": name_or_id},
    )
    if df.is_empty():
        known = wh.sql("SELECT DISTINCT name FROM datasets ORDER BY name")["name"].to_list()
        hint = f"; registered: {', '.join(known)}" if known else " (run: webloop curate)"
        raise DataMismatch(f"no dataset named or with id {name_or_id!r}{hint}")
    row = df.row(0, named=True)
    path = Path(row["export_path"] or "")
    if not (path / "parquet" / "sft.parquet").exists():
        raise DataMismatch(
            f"dataset {row['name']} ({row['dataset_id']}): no SFT export at "
            f"{path / 'parquet' / 'sft.parquet'} (rebuild it with webloop curate, or the recipe "
            "asked for no sft examples)"
        )
    return DatasetRef(row["dataset_id"], row["name"], int(row["snapshot_id"]), path)


def check_prompt_format(export_path: Path) -> None:
    """Refuse an export written with another prompt format than this code's."""
    meta_file = export_path / "metadata.json"
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    version = meta.get("prompt_format", 1)  # exports before the field existed used version 1
    if version != PROMPT_FORMAT_VERSION:
        raise DataMismatch(
            f"{export_path}: prompts of format version {version}; this policy's prompt builder "
            f"writes version {PROMPT_FORMAT_VERSION} (rebuild the dataset with this code)"
        )


def sft_turns(export_path: Path, splits: Sequence[str] = ("train",)) -> list[Turn]:
    """The SFT rows of an export (only ``splits``; empty: all) as turns, in file order."""
    check_prompt_format(export_path)
    path = export_path / "parquet" / "sft.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    turns = [
        _sft_turn(r) for r in rows if not splits or r.get("split") in splits or r["split"] is None
    ]
    if not turns:
        have = sorted({str(r.get("split")) for r in rows})
        raise DataMismatch(
            f"{path}: no SFT rows in split(s) {', '.join(splits)} (the export has "
            f"{len(rows)} rows in {', '.join(have) or 'no split'})"
        )
    return turns


def check_modality(kind: str, turns: Sequence[Turn], where: str, text_only: bool = False) -> None:
    """A vision-language model trains on screenshots: refuse data with none (unless
    ``text_only``, on purpose); the ranker reads the accessibility tree and needs no images."""
    if kind == "vlm" and not text_only and not any(t.images for t in turns):
        raise DataMismatch(
            f"{where} has no screenshots, and the model is a vision-language model: rebuild it "
            "from runs with screenshots (prompt mode both or screenshot, output.k_images >= 1), "
            "or train text-only on purpose (--text-only)"
        )


def _sft_turn(r: dict[str, Any]) -> Turn:
    images = tuple(_png(img) for img in r.get("images") or [])
    return Turn(
        prompt=r["prompt"],
        completion=r["completion"],
        images=images,
        weight=float(r.get("weight") if r.get("weight") is not None else 1.0),
        key=f"{r['traj_id']}/{r['step_idx']}" + ("/i" if r.get("kind") == "intervention" else ""),
        meta={k: r.get(k) for k in ("task_id", "site", "split", "policy", "kind")},
    )


def _png(img: Any) -> bytes:
    if isinstance(img, dict):
        return img["bytes"]
    return bytes(img)


# -- RL: the steps of collected runs ------------------------------------------------------------


def run_steps(wh: Warehouse, run_ids: Sequence[str], judge: str | None = None) -> pl.DataFrame:
    """One row per stored step of the runs' trajectories: ids, group, status, reward, the task's
    site and difficulty, the prompt hash, the model output and the sampling log-prob.

    Reward: 1/0 for a ``success``/``failure`` status (bundled tasks are graded as they end);
    for a ``finished`` trajectory (live web), its judges' verdict (``trajectory_verdicts`` of
    :mod:`warehouse.relations`); null otherwise (unjudged, ``infra_error``, ``timeout``: such
    turns never train). Site, difficulty, split: the task version the trajectory ran.

    With ``judge``, the reward is that judge's verdict for every trajectory (bundled ones too);
    one it could not decide gets none (:data:`warehouse.relations.JUDGED_STATUS`)."""
    status, verdicts = outcome_sql(judge)
    return wh.sql(
        with_relations(
            "SELECT s.traj_id, s.step_idx, t.run_id, t.task_id, t.group_id, "
            f"{status} AS status, k.site, k.difficulty, k.split, s.prompt_hash, "
            "s.model_output, s.action_text, s.logprob, s.token_ids, s.image_spans, "
            "count(*) OVER (PARTITION BY s.traj_id) AS n_turns "
            "FROM steps s JOIN trajectories t USING (traj_id) "
            "LEFT JOIN trajectory_tasks k USING (traj_id) "
            f"{verdicts} "
            "WHERE t.run_id IN (SELECT unnest($runs)) ORDER BY s.traj_id, s.step_idx"
        ),
        {"runs": list(run_ids), **({"judge": judge} if judge is not None else {})},
    ).with_columns(
        reward=pl.col("status").replace_strict(REWARDS, default=None, return_dtype=pl.Float64)
    )


def rl_turns(wh: Warehouse, steps: pl.DataFrame, *, rollout_logprobs: bool = False) -> list[Turn]:
    """Turns for the rows of ``steps`` that carry an ``advantage`` column (see
    :mod:`training.advantages`): prompts from the blob store, the stored reply as the completion.
    Old log-probs: the sampling policy's stored ones with ``rollout_logprobs`` (they must mean
    what the model path's ``logprobs`` means: e.g. the VLM's reasoning weight λ = 1), else None —
    the trainer recomputes them with the model before its first update. Steps without a prompt
    or a reply are skipped (an expert step of a run without a prompt config)."""
    out = []
    for r in steps.iter_rows(named=True):
        if r["prompt_hash"] is None or r["model_output"] is None:
            continue
        try:
            prompt = wh.blobs.get_text(r["prompt_hash"])
        except BlobError as exc:
            raise DataMismatch(f"step {r['traj_id']}/{r['step_idx']}: {exc}") from exc
        out.append(
            Turn(
                prompt=prompt,
                completion=r["model_output"],
                images=prompt_images(wh, prompt, f"{r['traj_id']}/{r['step_idx']}"),
                weight=float(r.get("weight", 1.0) or 0.0),
                advantage=float(r["advantage"]),
                old_logprob=r["logprob"] if rollout_logprobs else None,
                key=f"{r['traj_id']}/{r['step_idx']}"
                + (f"/c{r['cand_idx']}" if r.get("cand_idx") is not None else ""),
                meta={"task_id": r["task_id"], "site": r["site"], "status": r["status"]},
                reply_ids=_json_tuple(r.get("token_ids")),
                image_spans=_json_tuple(r.get("image_spans")),
            )
        )
    return out


def _json_tuple(value: Any) -> Any:
    """A JSON column's list (as text or list) as nested tuples; None stays None."""
    if isinstance(value, str):
        value = json.loads(value)
    if value is None:
        return None
    return tuple(_json_tuple(v) if isinstance(v, list) else v for v in value)


def prompt_images(wh: Warehouse, prompt: str, where: str) -> tuple[bytes, ...]:
    """The screenshots a rendered prompt references, in order, from the blob store."""
    refs = []
    for m in json.loads(prompt):
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                url = (part.get("image_url") or {}).get("url", "")
                if url.startswith(BLOB_REF):
                    refs.append(url[len(BLOB_REF) :])
    try:
        return tuple(wh.blobs.get(h) for h in refs)
    except BlobError as exc:
        raise DataMismatch(f"step {where}: {exc}") from exc
