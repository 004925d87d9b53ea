"""Training examples from a :class:`~curation.select.Selection`: SFT chat examples, RL groups
and preference pairs, rendered by the rollout prompt builder.

SFT (one example per kept step). The prompt is ``rollouts.prompts.build_messages`` over the
trajectory's stored steps, exactly as the rollout engine built it: every earlier step is a
``Turn`` with its action text (``"(invalid action)"`` where the output did not parse) and its
error, the current step's observation carries the accessibility tree; screenshots and trees come
from the blob store. The prompt config is the run's (``runs.config``: ``prompt_mode``,
``self_summary``; the running summary is the last ``Summary:`` line of the earlier outputs)
with the recipe's ``output.k_images``. With the run's own ``k_images`` the rendered prompt is
byte-identical to the stored ``steps.prompt_hash`` blob (``render(messages)``).

A row stores the prompt as ``render(messages)`` (images as ``sha256:<hex>`` references) plus the
screenshots, in order, as PNG bytes (``images``); :func:`sft_messages` turns a row back into
OpenAI chat messages with data URLs and the assistant reply.

The target (``completion``) is the model's reply as a model writes it:
* a teacher rationale for the step (``include.rationales``): ``"Thought: …\\nAction: …"``;
* the expert (``policy`` starting with ``expert``): ``"Action: <recorded action text>"`` (its
  own "thought" is plan bookkeeping, not reasoning);
* any other policy: the stored ``model_output`` verbatim.
Verified interventions (``include.interventions``) add one example each: the failed
trajectory's prefix up to ``first_error_step`` as the prompt, the corrective action (with the
intervention's rationale as the thought) as the target.

RL groups (one row per trajectory with a known outcome): ``reward`` is 1 for ``success`` and 0
for ``failure`` (trajectories still ``finished``, i.e. unjudged, get no row). ``advantage`` is
the reward minus the mean reward of its ``group_id`` (the G samples of a task), divided by the
group's population standard deviation when that is above zero (GRPO); a group of one has
advantage 0.

Preference pairs, two sources:
* ``outcome``: for each failed trajectory, the successful trajectory of the same task sharing
  the longest prefix of actions (ties: smallest traj_id); at the first step where they differ
  (the "same state": same task, same earlier actions) the success's reply is ``chosen``, the
  failure's ``rejected``; the prompt is the successful trajectory's.
* ``prm``: at a kept step with scored candidates (``step_scores`` + ``candidates``), per scorer
  version, the highest-scored candidate is ``chosen`` and the lowest ``rejected`` (ties: lowest
  cand_idx), when their scores differ.

Work is columnar and streamed: trajectories are processed in chunks of whole tasks, steps are
read per chunk with one query at the pinned snapshot, rows go to Arrow IPC spool files chunk by
chunk (never the whole dataset in memory); blobs are read once per chunk.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from rollouts.actions import (
    Action,
    Answer,
    Back,
    Click,
    Goto,
    ParseError,
    Press,
    Scroll,
    Select,
    Target,
    Type,
    Wait,
    format_action,
    parse_action,
)
from rollouts.prompts import BLOB_REF, DATA_URL, PromptConfig, Turn, build_messages, render
from warehouse.blobs import BlobError, BlobStore
from warehouse.connection import LAKE
from warehouse.ids import make_id
from warehouse.images import validate_image
from warehouse.store import Warehouse

INVALID = "(invalid action)"  # what the engine shows for a step whose output did not parse
CHUNK_TRAJECTORIES = 512  # trajectories per chunk (whole tasks: a task never spans chunks)
KINDS = ("sft", "rl", "preferences")


# -- schemas ------------------------------------------------------------------------------------

_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # datasets' Image() storage

SFT_SCHEMA = pa.schema(
    [
        ("example_id", pa.string()),
        ("kind", pa.string()),  # step | intervention
        ("traj_id", pa.string()),
        ("step_idx", pa.int64()),
        ("task_id", pa.string()),
        ("suite", pa.string()),
        ("site", pa.string()),
        ("split", pa.string()),
        ("policy", pa.string()),
        ("run_id", pa.string()),
        ("prompt", pa.string()),  # render(messages): canonical JSON, images as sha256: refs
        ("completion", pa.string()),  # the assistant reply (the target)
        ("images", pa.list_(_IMAGE)),  # the prompt's screenshots, in order
        ("image_hashes", pa.list_(pa.string())),
        ("prompt_hash", pa.string()),  # the stored prompt blob of this state (null: none stored)
        ("weight", pa.float64()),
    ]
)
RL_SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("traj_id", pa.string()),
        ("task_id", pa.string()),
        ("suite", pa.string()),
        ("site", pa.string()),
        ("split", pa.string()),
        ("policy", pa.string()),
        ("run_id", pa.string()),
        ("instruction", pa.string()),
        ("status", pa.string()),
        ("n_steps", pa.int64()),
        ("actions", pa.list_(pa.string())),  # every stored step's action text, in order
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("weight", pa.float64()),
    ]
)
PREF_SCHEMA = pa.schema(
    [
        ("pair_id", pa.string()),
        ("source", pa.string()),  # outcome | prm
        ("task_id", pa.string()),
        ("site", pa.string()),
        ("split", pa.string()),
        ("traj_id", pa.string()),  # the trajectory whose state is the prompt
        ("step_idx", pa.int64()),
        ("prompt", pa.string()),
        ("images", pa.list_(_IMAGE)),
        ("image_hashes", pa.list_(pa.string())),
        ("chosen", pa.string()),
        ("rejected", pa.string()),
        ("chosen_ref", pa.string()),  # outcome: traj_id; prm: "traj_id/step/cand"
        ("rejected_ref", pa.string()),
        ("scorer", pa.string()),
        ("chosen_score", pa.float64()),
        ("rejected_score", pa.float64()),
    ]
)
SCHEMAS = {"sft": SFT_SCHEMA, "rl": RL_SCHEMA, "preferences": PREF_SCHEMA}


@dataclass
class Examples:
    """Rendered examples, spooled to Arrow IPC stream files (one per kind that was asked for),
    and the small check frames the quality gates read.

    ``blob_checks``: hash, role (screenshot | a11y), exists, reason (null: a usable blob).
    ``target_checks``: example_id, kind, completion, parses (the target parses in the grammar).
    ``step_index``: traj_id, n_steps (stored), count, min_idx, max_idx, contiguous.
    ``step_checks``: traj_id, step_idx, action_text, parses (each kept step's recorded action).
    ``tasks``: task_id, split, instruction of every task the examples come from.
    ``counts``: rows per kind; ``rl_unrewarded``: trajectories without an outcome (no RL row).
    """

    spool: dict[str, Path] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    blob_checks: pl.DataFrame | None = None
    target_checks: pl.DataFrame | None = None
    step_index: pl.DataFrame | None = None
    step_checks: pl.DataFrame | None = None
    tasks: pl.DataFrame | None = None
    rl_unrewarded: int = 0


# -- helpers ------------------------------------------------------------------------------------


def expert_policy(policy: str | None) -> bool:
    return bool(policy) and str(policy).startswith("expert")


def reply(action_text: str, thought: str | None = None) -> str:
    """A target formatted as a model reply: ``Thought: …\\nAction: …`` (no thought: the action
    line alone)."""
    return f"Thought: {thought}\nAction: {action_text}" if thought else f"Action: {action_text}"


_ACTIONS: dict[str, type] = {
    c.__name__.lower(): c for c in (Click, Type, Press, Scroll, Select, Goto, Back, Wait, Answer)
}


def action_from_dict(d: dict[str, Any]) -> Action | ParseError:
    """The inverse of :func:`rollouts.actions.to_dict` (``steps.action``,
    ``interventions.proposed_action``); other JSON action shapes go through the parser."""
    cls = _ACTIONS.get(str(d.get("type", "")).lower())
    if cls is not None:
        try:
            kw = {k: v for k, v in d.items() if k != "type"}
            for key in ("target",):
                if isinstance(kw.get(key), dict):
                    kw[key] = Target(**kw[key])
            return cls(**kw)
        except (TypeError, ValueError):
            pass
    return parse_action(json.dumps(d))


def proposed_action_text(value: Any) -> str | None:
    """Canonical action text of an intervention's ``proposed_action`` (JSON text, dict or a
    grammar string); None when it is not an action."""
    if value is None:
        return None
    if isinstance(value, str):
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(value)
    if isinstance(value, str):
        action = parse_action(value)
    elif isinstance(value, dict):
        # the grammar text when stored beside the fields ("text": curation.interventions;
        # "action_text"), else the to_dict fields
        texts = [value.get(k) for k in ("text", "action_text") if isinstance(value.get(k), str)]
        parsed = [a for a in map(parse_action, texts) if not isinstance(a, ParseError)]
        action = parsed[0] if parsed else action_from_dict(value)
    else:
        return None
    return None if isinstance(action, ParseError) else format_action(action)


def prompt_config(run_config: dict[str, Any] | None, k_images: int) -> PromptConfig:
    """The prompt config a run's policy used (``CollectConfig`` fields), with ``k_images``."""
    c = run_config or {}
    mode = c.get("prompt_mode") or "both"
    return PromptConfig(mode=mode, k_images=k_images, self_summary=bool(c.get("self_summary")))


_SUMMARY = re.compile(r"^\s*summary\s*:\s*(.+)$", re.I | re.M)  # rollouts.policies


def summaries(outputs: Sequence[str | None]) -> list[str | None]:
    """The running self-summary each step's prompt showed: the last ``Summary:`` line of the
    earlier outputs (as ``rollouts.policies.remember_summary`` keeps it)."""
    out, current = [], None
    for text in outputs:
        out.append(current)
        m = _SUMMARY.search(text or "")
        if m:
            current = m.group(1).strip()[:1000]
    return out


def sft_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """An exported SFT row → OpenAI chat messages (images as PNG data URLs) + the assistant
    reply. ``render(sft_messages(row)[:-1])`` is the prompt the policy saw, byte for byte, when
    the images are read as stored (``datasets.Image(decode=False)``, or Arrow/Parquet): decoded
    PIL images are re-encoded here, same pixels but other PNG bytes, so other image hashes."""
    messages = json.loads(row["prompt"])
    shots = iter(_image_bytes(img) for img in row["images"])
    for m in messages:
        if isinstance(m.get("content"), list):
            for part in m["content"]:
                url = (part.get("image_url") or {}).get("url", "")
                if url.startswith(BLOB_REF):
                    part["image_url"]["url"] = DATA_URL + base64.b64encode(next(shots)).decode()
    return [*messages, {"role": "assistant", "content": row["completion"]}]


def _image_bytes(img: Any) -> bytes:
    if isinstance(img, dict):
        return img["bytes"]
    if isinstance(img, bytes | bytearray):
        return bytes(img)
    import io  # a decoded PIL image (datasets' default): its original bytes are gone

    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# -- blobs --------------------------------------------------------------------------------------


class BlobReader:
    """Reads screenshots and trees for one chunk; records whether each exists and is usable.

    The cache is an LRU bounded by bytes (``cache_bytes``), not by entries: a chunk's working
    set (every distinct screen and tree it shows) must fit, or every prompt re-reads, re-hashes
    and re-validates its blobs (measured on bench/curation.py: 600 distinct small blobs against
    a 256-entry cap read 27k blobs from disk for 34k examples)."""

    def __init__(self, store: BlobStore, cache_bytes: int = 128 << 20) -> None:
        self.store = store
        self.cache: OrderedDict[str, bytes | None] = OrderedDict()  # LRU: bounded memory
        self.cache_bytes = cache_bytes
        self.cached = 0  # bytes held by the cache
        self.checks: dict[str, tuple[str, bool, str | None]] = {}

    def clear(self) -> None:
        self.cache.clear()
        self.cached = 0

    def get(self, digest: str | None, role: str) -> bytes | None:
        if not digest:
            return None
        if digest in self.cache:
            self.cache.move_to_end(digest)
            return self.cache[digest]
        try:
            data: bytes | None = self.store.get(digest)
            exists, reason = True, None
        except BlobError as exc:  # missing, corrupt, or not a digest
            data, exists, reason = None, False, str(exc)
        if data is not None and role == "screenshot":
            reason = validate_image(data)
            if reason is not None:
                data = None
        elif data is not None:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                data, reason = None, "not UTF-8 text"
        self.cache[digest] = data
        self.cached += len(data or b"")
        while self.cached > self.cache_bytes and len(self.cache) > 1:
            _, old = self.cache.popitem(last=False)
            self.cached -= len(old or b"")
        self.checks.setdefault(digest, (role, exists, reason))
        return data

    def frame(self) -> pl.DataFrame:
        rows = [
            {"hash": h, "role": r, "exists": e, "reason": why}
            for h, (r, e, why) in sorted(self.checks.items())
        ]
        schema = {"hash": pl.Utf8, "role": pl.Utf8, "exists": pl.Boolean, "reason": pl.Utf8}
        return pl.DataFrame(rows, schema=schema)


# -- reads at the snapshot ----------------------------------------------------------------------

_STEP_COLS = (
    "traj_id, step_idx, url, title, screenshot_hash, a11y_hash, prompt_hash, model_output, "
    "action_text, action_error"
)


def _register_ids(wh: Warehouse, name: str, ids: Sequence[str]) -> None:
    wh.con.register(name, pa.table({"traj_id": pa.array(list(ids), pa.string())}))


def read_steps(wh: Warehouse, traj_ids: Sequence[str], snapshot_id: int) -> pl.DataFrame:
    """Every stored step of ``traj_ids`` at the snapshot, ordered by (traj_id, step_idx)."""
    _register_ids(wh, "__curation_ids", traj_ids)
    try:
        return wh.sql(
            f"SELECT {_STEP_COLS} FROM {LAKE}.steps AT (VERSION => $v) "
            "WHERE traj_id IN (SELECT traj_id FROM __curation_ids) ORDER BY traj_id, step_idx",
            {"v": snapshot_id},
        )
    finally:
        wh.con.unregister("__curation_ids")


def read_run_configs(wh: Warehouse, run_ids: Sequence[str], snapshot_id: int) -> dict[str, Any]:
    """run_id → its stored config (dict) at the snapshot."""
    if not run_ids:
        return {}
    df = wh.sql(
        f"SELECT run_id, config FROM {LAKE}.runs AT (VERSION => $v) "
        "WHERE run_id IN (SELECT unnest($ids))",
        {"v": snapshot_id, "ids": sorted(set(run_ids))},
    )
    out = {}
    for run_id, config in df.iter_rows():
        out[run_id] = json.loads(config) if isinstance(config, str) else config
    return out


_INFO_COLUMNS = (
    "traj_id",
    "run_id",
    "task_id",
    "policy",
    "status",
    "group_id",
    "n_steps",
    "suite",
    "site",
    "split",
    "instruction",
)


def trajectory_info(wh: Warehouse, traj_ids: Sequence[str], snapshot_id: int) -> pl.DataFrame:
    """traj_id, run_id, task_id, policy, status, group_id, n_steps, suite, site, split,
    instruction of ``traj_ids`` (the task version the trajectory ran, else the latest)."""
    if not traj_ids:
        return pl.DataFrame(
            schema={c: pl.Int64 if c == "n_steps" else pl.Utf8 for c in _INFO_COLUMNS}
        )
    return wh.sql(
        f"""
        WITH t AS (
            SELECT traj_id, run_id, task_id, task_version, policy, status, group_id, n_steps
            FROM {LAKE}.trajectories AT (VERSION => $v) WHERE traj_id IN (SELECT unnest($ids))
        ), k AS (
            SELECT task_id, version, suite, site, split, instruction,
                   max(version) OVER (PARTITION BY task_id) AS latest
            FROM {LAKE}.tasks AT (VERSION => $v)
            WHERE task_id IN (SELECT task_id FROM t)
        )
        SELECT t.traj_id, t.run_id, t.task_id, t.policy, t.status, t.group_id, t.n_steps,
               k.suite, k.site, k.split, k.instruction
        FROM t JOIN k ON k.task_id = t.task_id AND k.version = coalesce(t.task_version, k.latest)
        ORDER BY t.traj_id
        """,
        {"v": snapshot_id, "ids": sorted(set(traj_ids))},
    )


# -- rendering ----------------------------------------------------------------------------------


@dataclass
class _Traj:
    """One trajectory's rows, ready to render prompts at any of its steps."""

    info: dict[str, Any]
    steps: list[dict[str, Any]]
    config: PromptConfig
    reader: BlobReader
    summaries: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.config.self_summary:
            self.summaries = summaries([s["model_output"] for s in self.steps])

    def turns(self, i: int) -> list[Turn]:
        """The prompt's turns at step ``i``: earlier steps with their actions, then step i."""
        k = self.config.k_images if self.config.mode in ("screenshot", "both") else 0
        out = []
        for j, s in enumerate(self.steps[: i + 1]):
            shot = self.reader.get(s["screenshot_hash"], "screenshot") if j > i - k else None
            if j < i:
                text = s["action_text"] if s["action_text"] is not None else INVALID
                err = s["action_error"]
                out.append(Turn(s["url"] or "", s["title"] or "", shot, None, text, err))
            else:
                a11y = None
                if self.config.mode in ("a11y", "both"):
                    raw = self.reader.get(s["a11y_hash"], "a11y")
                    a11y = raw.decode("utf-8") if raw is not None else None
                out.append(Turn(s["url"] or "", s["title"] or "", shot, a11y))
        return out

    def prompt(self, i: int) -> tuple[str, list[dict[str, Any]], list[str]]:
        """(render(messages), images as Image() values, their hashes) at step ``i``."""
        turns = self.turns(i)
        summary = self.summaries[i] if self.config.self_summary else None
        messages = build_messages(self.info["instruction"], turns, self.config, summary)
        k = self.config.k_images if self.config.mode in ("screenshot", "both") else 0
        shown = [(t.screenshot, s) for t, s in zip(turns, self.steps[: i + 1], strict=True)]
        shown = [(b, s["screenshot_hash"]) for b, s in shown[-k:] if b] if k else []
        return (
            render(messages),
            [{"bytes": b, "path": None} for b, _ in shown],
            [h for _, h in shown],
        )

    def target(self, i: int, rationale: str | None = None) -> str:
        s = self.steps[i]
        if s["action_text"] is not None and (rationale or expert_policy(self.info["policy"])):
            return reply(s["action_text"], rationale)
        return s["model_output"] or ""


class _Spool:
    """Arrow IPC stream files, one per kind, written batch by batch."""

    def __init__(self, folder: Path, kinds: Sequence[str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.paths = {k: folder / f"{k}.arrow" for k in kinds}
        self.writers = {
            k: pa.ipc.new_stream(pa.OSFile(str(p), "wb"), SCHEMAS[k]) for k, p in self.paths.items()
        }
        self.counts = dict.fromkeys(kinds, 0)

    def write(self, kind: str, rows: list[dict[str, Any]]) -> None:
        if rows and kind in self.writers:
            self.writers[kind].write_batch(pa.RecordBatch.from_pylist(rows, schema=SCHEMAS[kind]))
            self.counts[kind] += len(rows)

    def close(self) -> None:
        for w in self.writers.values():
            w.close()


def render_examples(
    wh: Warehouse,
    sel: Any,
    recipe: Any,
    blobs: BlobStore,
    spool_dir: Path,
    *,
    chunk: int = CHUNK_TRAJECTORIES,
) -> Examples:
    """Render the examples ``recipe.output`` asks for from ``sel`` into ``spool_dir``."""
    out_cfg = recipe.output
    kinds = [k for k, on in zip(KINDS, _wanted(recipe), strict=True) if on]
    spool = _Spool(spool_dir, kinds)
    reader = BlobReader(blobs)
    v = int(sel.snapshot_id)
    trajs = sel.trajectories.sort("task_id", "traj_id")
    kept = _kept(sel.steps)
    rationales = _rationale_map(sel)
    configs = read_run_configs(wh, trajs.get_column("run_id").unique().to_list(), v)
    checks: list[dict[str, Any]] = []
    index_frames: list[pl.DataFrame] = []
    step_frames: list[pl.DataFrame] = []
    tasks = [trajs.select("task_id", "split", "instruction")]
    unrewarded = 0
    try:
        for part in _task_chunks(trajs, chunk):
            ids = part.get_column("traj_id").to_list()
            steps = read_steps(wh, ids, v)
            index_frames.append(_step_index(part, steps))
            step_frames.append(_step_checks(steps, sel.steps))
            by_traj = _group_steps(steps)
            rendered = {
                row["traj_id"]: _Traj(
                    row,
                    by_traj.get(row["traj_id"], []),
                    prompt_config(configs.get(row["run_id"]), out_cfg.k_images),
                    reader,
                )
                for row in part.iter_rows(named=True)
            }
            if "sft" in kinds:
                rows = _sft_rows(rendered, kept, rationales)
                checks += [_check(r) for r in rows]
                spool.write("sft", rows)
            if "rl" in kinds:
                rows = _rl_rows(rendered)
                unrewarded += len(rendered) - len(rows)
                spool.write("rl", rows)
            if "preferences" in kinds:
                rows = _outcome_pairs(rendered, kept, rationales)
                rows += _prm_pairs(wh, rendered, kept, v)
                spool.write("preferences", rows)
            reader.clear()
        if "sft" in kinds and sel.interventions is not None and sel.interventions.height:
            rows, info = _intervention_rows(wh, sel.interventions, out_cfg.k_images, reader, v)
            tasks.append(info.select("task_id", "split", "instruction"))
            checks += [_check(r) for r in rows]
            spool.write("sft", rows)
    finally:
        spool.close()
    return Examples(
        spool=spool.paths,
        counts=spool.counts,
        blob_checks=reader.frame(),
        target_checks=pl.DataFrame(
            checks,
            schema={
                "example_id": pl.Utf8,
                "kind": pl.Utf8,
                "completion": pl.Utf8,
                "parses": pl.Boolean,
            },
        ),
        step_index=pl.concat(index_frames) if index_frames else _step_index(trajs.head(0), None),
        step_checks=pl.concat(step_frames) if step_frames else _step_checks(None, sel.steps),
        tasks=pl.concat(tasks).unique("task_id", keep="first").sort("task_id"),
        rl_unrewarded=unrewarded,
    )


def _wanted(recipe: Any) -> tuple[bool, bool, bool]:
    o = recipe.output
    return bool(o.sft), bool(o.rl_groups), bool(o.preferences)


def _kept(steps: pl.DataFrame) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for tid, idx in steps.select("traj_id", "step_idx").sort("traj_id", "step_idx").iter_rows():
        out.setdefault(tid, []).append(int(idx))
    return out


def _rationale_map(sel: Any) -> dict[tuple[str, int], str]:
    r = getattr(sel, "rationales", None)
    if r is None or r.is_empty():
        return {}
    return {(t, int(i)): th for t, i, th in r.select("traj_id", "step_idx", "thought").iter_rows()}


def _task_chunks(trajs: pl.DataFrame, size: int) -> Iterator[pl.DataFrame]:
    """Consecutive slices of ``trajs`` (sorted by task) of about ``size`` trajectories that
    never split a task."""
    if trajs.is_empty():
        return
    tasks = trajs.get_column("task_id").to_list()
    start = 0
    while start < len(tasks):
        end = min(start + size, len(tasks))
        while end < len(tasks) and tasks[end] == tasks[end - 1]:
            end += 1
        yield trajs.slice(start, end - start)
        start = end


def _group_steps(steps: pl.DataFrame) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in steps.iter_rows(named=True):
        out.setdefault(row["traj_id"], []).append(row)
    return out


def _step_index(trajs: pl.DataFrame, steps: pl.DataFrame | None) -> pl.DataFrame:
    """Per trajectory: stored n_steps, step rows, min/max index, and whether 0..n-1 all exist."""
    base = trajs.select("traj_id", pl.col("n_steps").cast(pl.Int64))
    if steps is None or steps.is_empty():
        agg = pl.DataFrame(
            schema={"traj_id": pl.Utf8, "count": pl.Int64, "min_idx": pl.Int64, "max_idx": pl.Int64}
        )
    else:
        agg = steps.group_by("traj_id").agg(
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("step_idx").min().cast(pl.Int64).alias("min_idx"),
            pl.col("step_idx").max().cast(pl.Int64).alias("max_idx"),
        )
    df = base.join(agg, on="traj_id", how="left").with_columns(pl.col("count").fill_null(0))
    contiguous = (pl.col("count") == pl.col("n_steps")) & (
        (pl.col("count") == 0)
        | ((pl.col("min_idx") == 0) & (pl.col("max_idx") == pl.col("count") - 1))
    )
    return df.with_columns(contiguous.alias("contiguous"))


def _step_checks(steps: pl.DataFrame | None, kept: pl.DataFrame) -> pl.DataFrame:
    """Kept steps of this chunk with their recorded action and whether it parses."""
    schema = {"traj_id": pl.Utf8, "step_idx": pl.Int64, "action_text": pl.Utf8}
    if steps is None or steps.is_empty():
        return pl.DataFrame(schema={**schema, "parses": pl.Boolean})
    rows = steps.select("traj_id", pl.col("step_idx").cast(pl.Int64), "action_text").join(
        kept.select("traj_id", pl.col("step_idx").cast(pl.Int64)), on=["traj_id", "step_idx"]
    )
    texts = rows.get_column("action_text").unique().drop_nulls().to_list()  # parse each once
    ok = [t for t in texts if not isinstance(parse_action(t), ParseError)]
    parses = pl.col("action_text").is_in(pl.Series(ok, dtype=pl.Utf8).implode()).fill_null(False)
    return rows.with_columns(parses.alias("parses"))


def _check(row: dict[str, Any]) -> dict[str, Any]:
    parsed = parse_action(row["completion"] or "")
    return {
        "example_id": row["example_id"],
        "kind": row["kind"],
        "completion": row["completion"],
        "parses": not isinstance(parsed, ParseError),
    }


def _base(t: _Traj) -> dict[str, Any]:
    i = t.info
    return {k: i.get(k) for k in ("task_id", "suite", "site", "split", "policy", "run_id")}


def _sft_rows(
    rendered: dict[str, _Traj], kept: dict[str, list[int]], rationales: dict[tuple[str, int], str]
) -> list[dict[str, Any]]:
    rows = []
    for tid, t in rendered.items():
        for i in kept.get(tid, []):
            if i >= len(t.steps) or t.steps[i]["step_idx"] != i:
                continue  # not contiguous: the step-index gate reports it
            prompt, images, hashes = t.prompt(i)
            rows.append(
                {
                    "example_id": make_id("sft", tid, i, "step"),
                    "kind": "step",
                    "traj_id": tid,
                    "step_idx": i,
                    **_base(t),
                    "prompt": prompt,
                    "completion": t.target(i, rationales.get((tid, i))),
                    "images": images,
                    "image_hashes": hashes,
                    "prompt_hash": t.steps[i]["prompt_hash"],
                    "weight": float(t.info.get("weight") or 1.0),
                }
            )
    return rows


def _intervention_rows(
    wh: Warehouse, interventions: pl.DataFrame, k_images: int, reader: BlobReader, v: int
) -> tuple[list[dict[str, Any]], pl.DataFrame]:
    """Prefix of the failed trajectory up to ``first_error_step`` + the corrective action."""
    iv = interventions.sort("intervention_id")
    ids = iv.get_column("traj_id").unique().to_list()
    frame = trajectory_info(wh, ids, v)
    info = {r["traj_id"]: r for r in frame.iter_rows(named=True)}
    configs = read_run_configs(wh, [r["run_id"] for r in info.values()], v)
    by_traj = _group_steps(read_steps(wh, ids, v))
    rows = []
    for r in iv.iter_rows(named=True):
        tid, at = r["traj_id"], r["first_error_step"]
        action = proposed_action_text(r["proposed_action"])
        steps = by_traj.get(tid, [])
        if tid not in info or at is None or action is None or not 0 <= at < len(steps):
            continue
        cfg = prompt_config(configs.get(info[tid]["run_id"]), k_images)
        t = _Traj(info[tid], steps, cfg, reader)
        prompt, images, hashes = t.prompt(int(at))
        rows.append(
            {
                "example_id": make_id("sft", r["intervention_id"], "intervention"),
                "kind": "intervention",
                "traj_id": tid,
                "step_idx": int(at),
                **_base(t),
                "prompt": prompt,
                "completion": reply(action, r.get("rationale")),
                "images": images,
                "image_hashes": hashes,
                "prompt_hash": steps[int(at)]["prompt_hash"],
                "weight": 1.0,
            }
        )
    reader.clear()
    return rows, frame


REWARDS = {"success": 1.0, "failure": 0.0}


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """``r - mean`` over the group, divided by the population std when it is above zero."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    std = (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5
    return [(r - mean) / std if std > 0 else r - mean for r in rewards]


def _rl_rows(rendered: dict[str, _Traj]) -> list[dict[str, Any]]:
    """One row per rewarded trajectory; a group lies inside one chunk (groups are per task)."""
    groups: dict[str, list[_Traj]] = {}
    for tid, t in rendered.items():
        if t.info.get("status") in REWARDS:
            groups.setdefault(t.info.get("group_id") or tid, []).append(t)
    rows = []
    for gid in sorted(groups):
        members = sorted(groups[gid], key=lambda t: t.info["traj_id"])
        rewards = [REWARDS[t.info["status"]] for t in members]
        for t, r, a in zip(members, rewards, group_advantages(rewards), strict=True):
            rows.append(
                {
                    "group_id": gid,
                    "traj_id": t.info["traj_id"],
                    **_base(t),
                    "instruction": t.info["instruction"],
                    "status": t.info["status"],
                    "n_steps": len(t.steps),
                    "actions": [s["action_text"] or INVALID for s in t.steps],
                    "reward": r,
                    "advantage": a,
                    "weight": float(t.info.get("weight") or 1.0),
                }
            )
    return rows


def _common_prefix(a: list[str | None], b: list[str | None]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _outcome_pairs(
    rendered: dict[str, _Traj], kept: dict[str, list[int]], rationales: dict[tuple[str, int], str]
) -> list[dict[str, Any]]:
    by_task: dict[str, list[_Traj]] = {}
    for t in rendered.values():
        by_task.setdefault(t.info["task_id"], []).append(t)
    rows = []
    for task_id in sorted(by_task):
        ts = sorted(by_task[task_id], key=lambda t: t.info["traj_id"])
        wins = [t for t in ts if t.info.get("status") == "success" and t.steps]
        for f in (t for t in ts if t.info.get("status") == "failure" and t.steps):
            acts_f = [s["action_text"] for s in f.steps]
            best, at = None, -1
            for s in wins:
                n = _common_prefix([x["action_text"] for x in s.steps], acts_f)
                if n > at and n < len(s.steps) and n < len(f.steps):
                    best, at = s, n
            if best is None or at not in kept.get(best.info["traj_id"], []):
                continue
            sid = best.info["traj_id"]
            chosen = best.target(at, rationales.get((sid, at)))
            rejected = f.target(at, rationales.get((f.info["traj_id"], at)))
            if chosen == rejected:
                continue
            prompt, images, hashes = best.prompt(at)
            rows.append(
                {
                    "pair_id": make_id("pref", "outcome", sid, f.info["traj_id"], at),
                    "source": "outcome",
                    "task_id": task_id,
                    "site": best.info.get("site"),
                    "split": best.info.get("split"),
                    "traj_id": sid,
                    "step_idx": at,
                    "prompt": prompt,
                    "images": images,
                    "image_hashes": hashes,
                    "chosen": chosen,
                    "rejected": rejected,
                    "chosen_ref": sid,
                    "rejected_ref": f.info["traj_id"],
                    "scorer": None,
                    "chosen_score": None,
                    "rejected_score": None,
                }
            )
    return rows


def _prm_pairs(
    wh: Warehouse, rendered: dict[str, _Traj], kept: dict[str, list[int]], v: int
) -> list[dict[str, Any]]:
    _register_ids(wh, "__curation_ids", list(rendered))
    try:
        scored = wh.sql(
            f"""
            SELECT s.traj_id, s.step_idx, s.cand_idx, s.scorer, s.scorer_version, s.score,
                   c.model_output, c.action_text
            FROM {LAKE}.step_scores AS s AT (VERSION => $v)
            JOIN {LAKE}.candidates AS c AT (VERSION => $v)
              USING (traj_id, step_idx, cand_idx)
            WHERE s.traj_id IN (SELECT traj_id FROM __curation_ids) AND s.score IS NOT NULL
            ORDER BY s.traj_id, s.step_idx, s.scorer, s.scorer_version, s.cand_idx
            """,
            {"v": v},
        )
    finally:
        wh.con.unregister("__curation_ids")
    rows = []
    for (tid, idx, scorer, version), g in scored.group_by(
        "traj_id", "step_idx", "scorer", "scorer_version", maintain_order=True
    ):
        idx = int(idx)
        if idx not in kept.get(tid, []) or g.height < 2:
            continue
        best = g.sort(["score", "cand_idx"], descending=[True, False]).row(0, named=True)
        worst = g.sort(["score", "cand_idx"], descending=[False, False]).row(0, named=True)
        if best["score"] <= worst["score"]:
            continue
        t = rendered[tid]
        prompt, images, hashes = t.prompt(idx)
        rows.append(
            {
                "pair_id": make_id("pref", "prm", tid, idx, scorer, version),
                "source": "prm",
                "task_id": t.info["task_id"],
                "site": t.info.get("site"),
                "split": t.info.get("split"),
                "traj_id": tid,
                "step_idx": idx,
                "prompt": prompt,
                "images": images,
                "image_hashes": hashes,
                "chosen": _candidate_text(best),
                "rejected": _candidate_text(worst),
                "chosen_ref": f"{tid}/{idx}/{best['cand_idx']}",
                "rejected_ref": f"{tid}/{idx}/{worst['cand_idx']}",
                "scorer": f"{scorer}@{version}",
                "chosen_score": float(best["score"]),
                "rejected_score": float(worst["score"]),
            }
        )
    return rows


def _candidate_text(row: dict[str, Any]) -> str:
    if row.get("model_output"):
        return row["model_output"]
    return reply(row["action_text"] or "")
