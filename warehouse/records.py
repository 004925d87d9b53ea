"""One frozen record type per entity of the data model, shared by every stage.

Each record class names its table (``TABLE``), its key columns (``KEY``) and how rewrites behave
(``MODE``: ``"upsert"`` replaces a row whose non-volatile columns changed, ``"insert"`` keeps the
first copy). The dataclass fields are exactly the table's columns (``warehouse/schema/*.sql``; a
test keeps both in step). JSON-typed fields (``dict``/``list``/``Any``) are stored as JSON text.

Status and label vocabularies are plain strings, listed as constants below.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, TypeVar

import polars as pl

R = TypeVar("R", bound="Record")

# trajectory.status
RUNNING, FINISHED, SUCCESS, FAILURE, INFRA_ERROR, TIMEOUT = (
    "running",
    "finished",  # ended; no outcome known yet (live web: a judge decides)
    "success",
    "failure",
    "infra_error",  # browser/model-server failure: never a reward, never SFT data
    "timeout",
)
TRAJECTORY_STATUSES = (RUNNING, FINISHED, SUCCESS, FAILURE, INFRA_ERROR, TIMEOUT)
TERMINAL_STATUSES = (FINISHED, SUCCESS, FAILURE, INFRA_ERROR, TIMEOUT)
# human_labels.label / judgments.verdict
LABELS = ("success", "failure", "not_executable")
VERDICTS = ("success", "failure", "abstain")
# runs.status
RUN_STATUSES = ("running", "completed", "failed", "cancelled")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Record:
    """Base of all records: table name, key columns and write mode as class variables."""

    TABLE: ClassVar[str]
    KEY: ClassVar[tuple[str, ...]]
    MODE: ClassVar[str] = "upsert"
    # Columns ignored when deciding whether a rewrite changed a row (so rewriting is idempotent).
    VOLATILE: ClassVar[tuple[str, ...]] = ("created_at",)

    def to_row(self) -> dict[str, Any]:
        """The row as stored: JSON fields serialized canonically."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = to_json(value) if f.name in json_fields(type(self)) else value
        return out


# ---------------------------------------------------------------------------------------------
# Entities (DESIGN.md, "Data model")


@dataclass(frozen=True)
class Task(Record):
    """A task: what to do, where to start, and how success is decided.

    ``rubric`` is a list of key points (WebJudge style); ``checker`` a site-specific checker spec
    for programmatic judging; ``reference`` a reference solution in the action grammar.
    Tasks are versioned: a changed task gets a new ``version``, never a silent overwrite.
    """

    TABLE: ClassVar[str] = "tasks"
    KEY: ClassVar[tuple[str, ...]] = ("task_id", "version")
    MODE: ClassVar[str] = "insert"

    task_id: str
    suite: str
    instruction: str
    start_url: str
    site: str | None = None
    version: int = 1
    suite_version: str | None = None
    split: str | None = None
    difficulty: int | None = None
    rubric: list[str] | None = None
    reference: Any = None
    checker: Any = None
    source: str | None = None
    meta: dict[str, Any] | None = None
    content_hash: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class Run(Record):
    """One execution of a stage (collect, judge, import, train, …) with its full config."""

    TABLE: ClassVar[str] = "runs"
    KEY: ClassVar[tuple[str, ...]] = ("run_id",)
    VOLATILE: ClassVar[tuple[str, ...]] = ("created_at", "started_at")

    run_id: str
    kind: str
    config: dict[str, Any] | None = None
    name: str | None = None
    code_version: str | None = None
    status: str = "running"
    error: str | None = None
    started_at: dt.datetime = field(default_factory=utcnow)
    ended_at: dt.datetime | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class Trajectory(Record):
    """One attempt of a policy at a task; ``group_id`` ties the G samples of a task (GRPO)."""

    TABLE: ClassVar[str] = "trajectories"
    KEY: ClassVar[tuple[str, ...]] = ("traj_id",)

    traj_id: str
    run_id: str
    task_id: str
    policy: str
    status: str
    task_version: int | None = None
    group_id: str | None = None
    sample_idx: int = 0
    n_steps: int = 0
    answer: str | None = None
    error: str | None = None
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    duration_s: float | None = None
    meta: dict[str, Any] | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class Step(Record):
    """One observation → action turn. Screenshots/trees/prompts are blob hashes, never inline."""

    TABLE: ClassVar[str] = "steps"
    KEY: ClassVar[tuple[str, ...]] = ("traj_id", "step_idx")

    traj_id: str
    step_idx: int
    url: str | None = None
    title: str | None = None
    screenshot_hash: str | None = None
    a11y_hash: str | None = None
    prompt_hash: str | None = None
    model_output: str | None = None
    thought: str | None = None
    action: dict[str, Any] | None = None
    action_text: str | None = None
    action_error: str | None = None
    logprob: float | None = None
    latency_model_s: float | None = None
    latency_env_s: float | None = None
    created_at: dt.datetime = field(default_factory=utcnow)
    # the reply's sampled token ids (no end-of-turn token) and the prompt's image-token runs
    # ([start, length]), where the engine named them (schema 0007); None: not recorded
    token_ids: list[int] | None = None
    image_spans: list[list[int]] | None = None


@dataclass(frozen=True)
class Judgment(Record):
    """A judge's verdict on a trajectory, or the judge's error (never a silent failure)."""

    TABLE: ClassVar[str] = "judgments"
    KEY: ClassVar[tuple[str, ...]] = ("judgment_id",)

    judgment_id: str
    traj_id: str
    judge: str
    judge_version: str
    model: str | None = None
    prompt_hash: str | None = None
    verdict: str | None = None
    score: float | None = None
    criteria: list[dict[str, Any]] | None = None
    rationale: str | None = None
    error: str | None = None
    attempts: int = 1
    run_id: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)
    protocol: str | None = None  # the named evaluation protocol's hash it was judged under


@dataclass(frozen=True)
class Candidate(Record):
    """A candidate action sampled at a visited state (PRO-CUA)."""

    TABLE: ClassVar[str] = "candidates"
    KEY: ClassVar[tuple[str, ...]] = ("traj_id", "step_idx", "cand_idx")

    traj_id: str
    step_idx: int
    cand_idx: int
    policy: str | None = None
    model_output: str | None = None
    action: dict[str, Any] | None = None
    action_text: str | None = None
    run_id: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class StepScore(Record):
    """A PRM score of one candidate, and its group-relative advantage within the state."""

    TABLE: ClassVar[str] = "step_scores"
    KEY: ClassVar[tuple[str, ...]] = ("traj_id", "step_idx", "cand_idx", "scorer", "scorer_version")

    traj_id: str
    step_idx: int
    cand_idx: int
    scorer: str
    scorer_version: str
    score: float | None = None
    advantage: float | None = None
    detail: dict[str, Any] | None = None
    error: str | None = None
    run_id: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class Intervention(Record):
    """A corrective step proposed for a failed trajectory, and whether replay verified it."""

    TABLE: ClassVar[str] = "interventions"
    KEY: ClassVar[tuple[str, ...]] = ("intervention_id",)

    intervention_id: str
    traj_id: str
    first_error_step: int | None = None
    proposed_action: dict[str, Any] | None = None
    rationale: str | None = None
    proposer: str | None = None
    verified: bool | None = None
    verified_outcome: str | None = None
    replay_traj_id: str | None = None
    run_id: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)
    reference: str | None = None  # "task" (the task's reference solution) or a successful traj_id
    detail: dict[str, Any] | None = None  # teacher's error description, verifier's replay/verdict


@dataclass(frozen=True)
class Rationale(Record):
    """A teacher's reasoning for one step (ERA), kept apart from the trajectory's own thought."""

    TABLE: ClassVar[str] = "rationales"
    KEY: ClassVar[tuple[str, ...]] = ("traj_id", "step_idx", "teacher")

    traj_id: str
    step_idx: int
    teacher: str
    thought: str
    model: str | None = None
    prompt_hash: str | None = None
    run_id: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class HumanLabel(Record):
    """A person's label on a trajectory (or one step of it)."""

    TABLE: ClassVar[str] = "human_labels"
    KEY: ClassVar[tuple[str, ...]] = ("label_id",)

    label_id: str
    traj_id: str
    label: str
    reviewer: str
    step_idx: int | None = None
    note: str | None = None
    source: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class Dataset(Record):
    """A curated, versioned dataset pinned to a warehouse snapshot."""

    TABLE: ClassVar[str] = "datasets"
    KEY: ClassVar[tuple[str, ...]] = ("dataset_id",)

    dataset_id: str
    name: str
    snapshot_id: int
    recipe: dict[str, Any] | None = None
    counts: dict[str, Any] | None = None
    export_path: str | None = None
    data_card: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)
    recipe_hash: str | None = None
    code_version: str | None = None


@dataclass(frozen=True)
class DatasetMember(Record):
    """Membership of a trajectory (``step_idx`` null) or one step in a dataset."""

    TABLE: ClassVar[str] = "dataset_members"
    KEY: ClassVar[tuple[str, ...]] = ("dataset_id", "traj_id", "step_idx")

    dataset_id: str
    traj_id: str
    step_idx: int | None = None
    split: str | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class TrainingRun(Record):
    """An SFT or RL training run: base model, dataset, full config."""

    TABLE: ClassVar[str] = "training_runs"
    KEY: ClassVar[tuple[str, ...]] = ("training_run_id",)

    training_run_id: str
    stage: str
    base_model: str
    dataset_id: str | None = None
    run_id: str | None = None
    config: dict[str, Any] | None = None
    code_version: str | None = None
    status: str = "running"
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class Metric(Record):
    """One scalar logged by a training run at a step."""

    TABLE: ClassVar[str] = "metrics"
    KEY: ClassVar[tuple[str, ...]] = ("training_run_id", "step", "name")

    training_run_id: str
    step: int
    name: str
    value: float
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class Checkpoint(Record):
    """A saved model state of a training run."""

    TABLE: ClassVar[str] = "checkpoints"
    KEY: ClassVar[tuple[str, ...]] = ("checkpoint_id",)

    checkpoint_id: str
    training_run_id: str
    step: int
    path: str
    sha256: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class Evaluation(Record):
    """Success of a checkpoint (or policy) on a split, with a confidence interval."""

    TABLE: ClassVar[str] = "evaluations"
    KEY: ClassVar[tuple[str, ...]] = ("evaluation_id",)

    evaluation_id: str
    suite: str
    split: str
    n: int
    n_success: int
    success_rate: float
    checkpoint_id: str | None = None
    policy: str | None = None
    run_id: str | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    breakdown: dict[str, Any] | None = None
    created_at: dt.datetime = field(default_factory=utcnow)
    judge: str | None = None  # the judge whose verdicts are the outcomes (None: the rollouts')


@dataclass(frozen=True)
class Pin(Record):
    """A pinned DuckLake snapshot: maintenance never expires it, so it stays readable."""

    TABLE: ClassVar[str] = "pins"
    KEY: ClassVar[tuple[str, ...]] = ("pin_id",)

    pin_id: str
    snapshot_id: int
    reason: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class Blob(Record):
    """Metadata of a blob in the content-addressed store (the bytes live in the store)."""

    TABLE: ClassVar[str] = "blobs"
    KEY: ClassVar[tuple[str, ...]] = ("hash",)
    MODE: ClassVar[str] = "insert"

    hash: str
    size: int
    media_type: str | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class Agreement(Record):
    """How well a judge (version) agrees with a reference (human, programmatic, a judge)."""

    TABLE: ClassVar[str] = "agreements"
    KEY: ClassVar[tuple[str, ...]] = ("agreement_id",)

    agreement_id: str
    judge: str
    reference: str
    n: int
    judge_version: str | None = None
    site: str | None = None
    accuracy: float | None = None
    precision: float | None = None
    recall: float | None = None
    f1: float | None = None
    kappa: float | None = None
    judge_success_rate: float | None = None
    reference_success_rate: float | None = None
    success_rate_gap: float | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class ProtocolComparison(Record):
    """One cell of a run's side-by-side protocol table (``webloop eval protocols``): a
    protocol's own success rate (``other`` None), or its paired agreement with another protocol
    or with the human labels (``other`` 'human') on the trajectories both judged."""

    TABLE: ClassVar[str] = "protocol_comparisons"
    KEY: ClassVar[tuple[str, ...]] = ("comparison_id",)

    comparison_id: str
    run_id: str
    protocol: str
    protocol_hash: str
    n: int
    successes: int
    other: str | None = None
    model: str | None = None
    rate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    other_successes: int | None = None
    agree: int | None = None
    only_this: int | None = None
    only_other: int | None = None
    kappa: float | None = None
    mcnemar_p: float | None = None
    created_at: dt.datetime = field(default_factory=utcnow)


RECORD_TYPES: tuple[type[Record], ...] = (
    Task,
    Run,
    Trajectory,
    Step,
    Judgment,
    Candidate,
    StepScore,
    Intervention,
    Rationale,
    HumanLabel,
    Dataset,
    DatasetMember,
    TrainingRun,
    Metric,
    Checkpoint,
    Evaluation,
    Pin,
    Blob,
    Agreement,
    ProtocolComparison,
)
BY_TABLE: dict[str, type[Record]] = {r.TABLE: r for r in RECORD_TYPES}


# ---------------------------------------------------------------------------------------------
# Values shared by stages (not tables of their own)


@dataclass(frozen=True)
class Criterion:
    """One requirement of a task, checked: its name, whether it passed, and why not."""

    name: str
    passed: bool
    detail: str | None = ""


@dataclass(frozen=True)
class Verdict:
    """A decision on whether a trajectory did its task, from a site's programmatic checker
    (``sites.checkers.check``) or from a judge (``judging``).

    A judge's verdict is stored as a :class:`Judgment` row (``verdict``, ``score``,
    ``criteria``, ``rationale``, ``prompt_hash``); the checker's per-criterion results
    (:meth:`to_dict`) go into ``trajectories.meta`` at collection time. ``calls`` and ``images``
    count the model calls and image inputs it cost (0 for checkers).
    """

    verdict: str  # success | failure | abstain (VERDICTS)
    criteria: list[Criterion] = field(default_factory=list)
    score: float | None = None
    rationale: str | None = None
    prompt_hash: str | None = None
    calls: int = 0
    images: int = 0

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be success, failure or abstain, not {self.verdict!r}")

    @classmethod
    def of(cls, criteria: Sequence[Criterion]) -> Verdict:
        """Success iff there is at least one criterion and every one passed; the score is the
        share of criteria passed."""
        crit = list(criteria)
        passed = sum(c.passed for c in crit)
        ok = bool(crit) and passed == len(crit)
        return cls("success" if ok else "failure", crit, passed / len(crit) if crit else 0.0)

    @property
    def success(self) -> bool:
        return self.verdict == "success"

    @property
    def reasons(self) -> list[str]:
        """``name: detail`` of each failed criterion."""
        return [f"{c.name}: {c.detail}" for c in self.criteria if not c.passed]

    def criteria_dicts(self) -> list[dict[str, Any]]:
        """The criteria as stored (``judgments.criteria``, ``trajectories.meta.criteria``)."""
        return [dataclasses.asdict(c) for c in self.criteria]

    def to_dict(self) -> dict[str, Any]:
        return {"success": self.success, "criteria": self.criteria_dicts()}


# ---------------------------------------------------------------------------------------------
# Frames <-> records

_SCALARS: dict[Any, tuple[pl.DataType, str]] = {
    str: (pl.Utf8(), "VARCHAR"),
    int: (pl.Int64(), "BIGINT"),
    float: (pl.Float64(), "DOUBLE"),
    bool: (pl.Boolean(), "BOOLEAN"),
    dt.datetime: (pl.Datetime("us", "UTC"), "TIMESTAMP WITH TIME ZONE"),
}


def _base_type(tp: Any) -> Any:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0]) if len(args) == 1 else Any
    return tp


@cache
def column_types(cls: type[Record]) -> dict[str, tuple[pl.DataType, str]]:
    """Column name → (polars dtype, SQL type) for a record class."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        base = _base_type(hints[f.name])
        out[f.name] = _SCALARS.get(base, (pl.Utf8(), "JSON"))
    return out


@cache
def json_fields(cls: type[Record]) -> frozenset[str]:
    return frozenset(n for n, (_, sql) in column_types(cls).items() if sql == "JSON")


def polars_schema(cls: type[Record]) -> dict[str, pl.DataType]:
    return {n: t for n, (t, _) in column_types(cls).items()}


def to_json(value: Any) -> str | None:
    """Canonical JSON text (sorted keys) so that equal values give equal strings."""
    if value is None:
        return None
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def to_frame(records: Sequence[Record], cls: type[Record] | None = None) -> pl.DataFrame:
    """Records → a typed polars frame in column order (empty frames keep the schema)."""
    if cls is None:
        if not records:
            raise ValueError("to_frame needs cls= for an empty sequence")
        cls = type(records[0])
    rows = [r.to_row() for r in records]
    return pl.DataFrame(rows, schema=polars_schema(cls), orient="row")


def from_frame(cls: type[R], frame: pl.DataFrame) -> list[R]:
    """A frame with (at least) the record's columns → records, JSON fields parsed."""
    jf = json_fields(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    out = []
    for row in frame.select(names).iter_rows(named=True):
        for name in jf:
            if row[name] is not None:
                row[name] = json.loads(row[name])
        out.append(cls(**row))
    return out


def conform(cls: type[Record], frame: pl.DataFrame) -> pl.DataFrame:
    """Cast/complete a user frame to the record's schema; missing nullable columns become null."""
    schema = polars_schema(cls)
    unknown = set(frame.columns) - set(schema)
    if unknown:
        raise ValueError(f"{cls.TABLE}: unknown columns {sorted(unknown)}")
    missing_keys = [k for k in cls.KEY if k not in frame.columns and k != "step_idx"]
    if missing_keys:
        raise ValueError(f"{cls.TABLE}: key columns missing: {missing_keys}")
    cols = []
    for name, dtype in schema.items():
        if name in frame.columns:
            col = frame.get_column(name)
            if name in json_fields(cls) and col.dtype != pl.Utf8:
                col = pl.Series(name, [to_json(v) for v in col.to_list()], dtype=pl.Utf8)
            cols.append(col.cast(dtype).alias(name))
        else:
            cols.append(pl.lit(None, dtype).alias(name))
    return frame.select(cols) if cols else frame
