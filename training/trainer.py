"""The one training loop: SFT, PPO and AWR, for both model paths (VLM and ranker).

It sees a model only through :class:`training.interface.TrainablePolicy` — ``logprobs(turns)``
gives differentiable reply log-probs, every loss is built from them (:mod:`training.losses`).

``fit`` seeds torch's global RNG with ``cfg.seed`` (dropout etc.). Data order is a pure
function of the seed: epoch ``e`` visits the trainable turns in the
permutation ``numpy.random.default_rng([seed, e])``, in consecutive batches of ``batch_size``
(the last one may be smaller). For PPO each batch is updated ``ppo_epochs`` times in a row; one
optimizer update is one *step*, numbered from 1.

Checkpoints: ``out_dir/checkpoint-<step>/`` holds ``model.save(dir)`` (the path's own
loadable folder), ``module.pt`` (``model.module.state_dict()``: what a resume restores, whatever
the path's save format), ``optimizer.pt``, ``rng.json`` (torch / numpy / python RNG states as
JSON: no pickle; the ``rng.pt`` of older checkpoints is read without running code, or refused),
``old_logprobs.pt`` (PPO: the frozen behaviour log-probs) and ``trainer_state.json`` (step,
epoch, batch position, config and data fingerprints, last metrics). A checkpoint is written to a
temporary folder and renamed into place, so a folder named ``checkpoint-<step>`` is complete.

Anchor (PPO-ptx, InstructGPT): ``fit(..., anchor=turns)`` with ``anchor_coef`` λ > 0 adds
``λ · SFT loss`` of a batch of ``anchor`` turns (demonstrations: a curated dataset's SFT rows) to
every RL step, so states the RL batch does not cover keep what SFT taught (one scorer serves
every state: an update on some templates moves the others). Step ``k`` takes the anchor batch
at position ``k - 1`` of a cycle through ``numpy.random.default_rng([seed, ANCHOR_STREAM, pass])``
permutations, a pure function of the step (a resume draws the same batches).

Resume: when ``out_dir`` already holds checkpoints, ``fit`` loads the latest, checks that its
config, data and model fingerprints match this call (a mismatch raises
:class:`CheckpointMismatch` naming both), restores module, optimizer and RNG states and continues
at the next step; no step is run or logged twice. ``max_steps`` and ``save_every`` are not part
of the config fingerprint: a run stopped by ``max_steps`` continues when called again without it.
Steps after the last checkpoint of a crashed run are run (and logged) again on resume, so a
metrics sink should key rows by step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from training.interface import DataMismatch, TrainablePolicy, Turn, TurnLogprobs
from training.losses import kl_penalty
from training.parallel import Engine, ParallelConfig

Objective = Literal["sft", "ppo", "awr"]
LogFn = Callable[[int, dict[str, float]], None]
CheckpointFn = Callable[[int, Path], None]
ProgressFn = Callable[[int, int], None]

STATE_FILE = "trainer_state.json"
CHECKPOINT_PREFIX = "checkpoint-"
_UNFINGERPRINTED = ("max_steps", "save_every")
ANCHOR_STREAM = 0xA2C4  # the anchor's data order: a seed stream apart from the epochs' (seed, e)


class CheckpointMismatch(ValueError):
    """``out_dir`` holds checkpoints of another run (other config, data or model)."""


class CheckpointRefused(ValueError):
    """A checkpoint file that is not what the trainer writes (changed, planted, or cut short):
    it is not loaded; the message names the file and what to do."""


@dataclass(frozen=True)
class TrainConfig:
    """How to train. Every field is recorded in each checkpoint's ``trainer_state.json``."""

    objective: Objective = field(
        default="sft",
        metadata={
            "help": "sft: weighted NLL; ppo: clipped surrogate on Turn.advantage; "
            "awr: NLL weighted by Turn.weight (exp(A/β) from the awr estimator)."
        },
    )
    epochs: int = field(default=1, metadata={"help": "Passes over the trainable turns."})
    lr: float = field(default=1e-4, metadata={"help": "AdamW learning rate (constant)."})
    batch_size: int = field(default=8, metadata={"help": "Turns per step."})
    seed: int = field(default=0, metadata={"help": "Data order and torch RNG seed."})
    max_steps: int | None = field(
        default=None, metadata={"help": "Stop after this global step (None: run all steps)."}
    )
    save_every: int | None = field(
        default=None, metadata={"help": "Checkpoint every N steps (None/0: only at the end)."}
    )
    grad_clip: float | None = field(
        default=1.0, metadata={"help": "Max global gradient norm (None: no clipping)."}
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    clip_eps: float = field(default=0.2, metadata={"help": "PPO ratio clip ε."})
    kl_coef: float = field(
        default=0.0,
        metadata={
            "help": "Weight of the KL to ref_model (needs ref_model): exact over the action "
            "set where the policy enumerates it (the ranker), else k3 on the sampled reply."
        },
    )
    ppo_epochs: int = field(
        default=1, metadata={"help": "PPO: consecutive updates (steps) on each batch."}
    )
    anchor_coef: float = field(
        default=0.0,
        metadata={"help": "λ of the SFT loss on anchor turns added to each step (needs anchor)."},
    )

    def __post_init__(self) -> None:
        problems = []
        if self.objective not in ("sft", "ppo", "awr"):
            problems.append(f"objective must be 'sft', 'ppo' or 'awr', got {self.objective!r}")
        for name in ("epochs", "batch_size", "ppo_epochs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                problems.append(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("max_steps", "save_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                problems.append(f"{name} must be None or an integer >= 0, got {value!r}")
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr!r}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            problems.append(f"grad_clip must be None or > 0, got {self.grad_clip!r}")
        if self.weight_decay < 0 or self.kl_coef < 0 or not 0 < self.clip_eps < 1:
            problems.append("need weight_decay >= 0, kl_coef >= 0 and 0 < clip_eps < 1")
        if self.anchor_coef < 0:
            problems.append(f"anchor_coef must be >= 0, got {self.anchor_coef!r}")
        if problems:
            raise ValueError("TrainConfig: " + "; ".join(problems))

    def fingerprint_fields(self) -> dict[str, Any]:
        """The fields that change what training computes (all but max_steps, save_every).
        Fields added later are left out at their default, so a run checkpointed before they
        existed still resumes."""
        d = dataclasses.asdict(self)
        if not self.anchor_coef:
            d.pop("anchor_coef")
        return {k: v for k, v in d.items() if k not in _UNFINGERPRINTED}


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit` did.

    ``steps_run``: optimizer steps taken by this call. ``last_step``: the global step reached.
    ``total_steps``: the planned global steps (capped by ``max_steps``). ``resumed_from``: the
    checkpoint step this call started from (None: from scratch). ``final_checkpoint``: the final
    checkpoint folder. ``last_metrics``: the last step's metrics (from the checkpoint when no step
    ran). ``n_trainable``: turns trained on; ``n_skipped``: turns left out (zero weight /
    advantage)."""

    steps_run: int
    last_step: int
    total_steps: int
    resumed_from: int | None
    final_checkpoint: Path
    last_metrics: dict[str, float]
    n_trainable: int
    n_skipped: int


# -- data -----------------------------------------------------------------------------------------


def trainable_indices(turns: Sequence[Turn], objective: str) -> list[int]:
    """Turns that can move the loss: PPO skips ``advantage == 0`` (no policy gradient) and
    ``weight == 0`` turns; SFT / AWR skip ``weight == 0`` turns."""
    out = []
    for i, t in enumerate(turns):
        if t.weight == 0 or (objective == "ppo" and t.advantage == 0):
            continue
        out.append(i)
    return out


def schedule(n: int, cfg: TrainConfig) -> list[tuple[int, int, list[int]]]:
    """The step plan over ``n`` trainable turns: ``(epoch, batch position, turn positions)`` for
    each global step 1..total (uncapped by ``max_steps``)."""
    plan = []
    for epoch in range(cfg.epochs):
        perm = np.random.default_rng([cfg.seed, epoch]).permutation(n).tolist()
        for b, start in enumerate(range(0, n, cfg.batch_size)):
            batch = perm[start : start + cfg.batch_size]
            repeats = cfg.ppo_epochs if cfg.objective == "ppo" else 1
            plan.extend((epoch, b, batch) for _ in range(repeats))
    return plan


def data_fingerprint(turns: Sequence[Turn]) -> str:
    """sha256 over every turn's key, prompt, completion, images, weight, advantage, old log-prob
    (and its sampled reply ids where it has them: turns without them hash as before)."""
    h = hashlib.sha256()
    for t in turns:
        images = [hashlib.sha256(b).hexdigest() for b in t.images]
        rec = [t.key, t.prompt, t.completion, images, t.weight, t.advantage, t.old_logprob]
        if t.reply_ids is not None:
            rec.append(list(t.reply_ids))
        h.update(json.dumps(rec, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()


def config_fingerprint(cfg: TrainConfig) -> str:
    return hashlib.sha256(json.dumps(cfg.fingerprint_fields(), sort_keys=True).encode()).hexdigest()


def model_fingerprint(model: TrainablePolicy) -> str:
    """The model path and its module's parameter names and shapes (not values: they train)."""
    shapes = [[k, list(v.shape)] for k, v in model.module.state_dict().items()]
    return hashlib.sha256(json.dumps([model.kind, shapes]).encode()).hexdigest()


# -- checkpoints ----------------------------------------------------------------------------------


def list_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``out_dir`` as ``(step, path)``, ascending."""
    found = []
    if out_dir.is_dir():
        for p in out_dir.iterdir():
            suffix = p.name[len(CHECKPOINT_PREFIX) :]
            if (
                p.name.startswith(CHECKPOINT_PREFIX)
                and suffix.isdigit()
                and (p / STATE_FILE).exists()
            ):
                found.append((int(suffix), p))
    return sorted(found)


# -- RNG states: JSON, never a pickle ------------------------------------------------------------

RNG_FILE = "rng.json"
LEGACY_RNG_FILE = "rng.pt"
_RNG_FORMAT = 1
_MOVE_IT = (
    "move {0} out of its folder to resume from the checkpoint before it (or to start afresh "
    "when it is the only one)"
)


def _rng_state() -> dict[str, Any]:
    """The RNG states a resume restores, as JSON values: ``torch`` (the CPU generator's state
    bytes, hex), ``cuda`` (one hex string per device, when CUDA is there), ``numpy`` (the
    legacy global ``np.random`` state: ``[algorithm, 624 key words, pos, has_gauss,
    cached_gaussian]``) and ``python`` (``random.getstate()`` with its tuple as a list)."""
    alg, key, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "format": _RNG_FORMAT,
        "torch": torch.get_rng_state().numpy().tobytes().hex(),
        "numpy": [alg, key.tolist(), pos, has_gauss, cached],
        "python": [version, list(internal), gauss],
    }
    if torch.cuda.is_available():  # dropout on a GPU draws from the CUDA generators
        state["cuda"] = [s.cpu().numpy().tobytes().hex() for s in torch.cuda.get_rng_state_all()]
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`_rng_state`'s values (checked by :func:`_parse_rng_state`)."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _parse_rng_state(raw: Any, path: Path) -> dict[str, Any]:
    """:func:`_rng_state`'s JSON values as the objects the RNGs take; a value of another type or
    size raises :class:`CheckpointRefused` naming ``path``."""
    try:
        alg, key, pos, has_gauss, cached = raw["numpy"]
        version, internal, gauss = raw["python"]
        ints = [*key, pos, has_gauss, version, *internal]
        if not all(type(v) is int for v in ints) or not isinstance(alg, str):
            raise TypeError("a state word is not an integer")
        if not 0 <= pos <= len(key) or has_gauss not in (0, 1):  # numpy checks neither
            raise ValueError(f"numpy position {pos} / has_gauss {has_gauss} out of range")
        state = {
            "torch": _byte_tensor(raw["torch"]),
            "numpy": (alg, np.array(key, dtype=np.uint32), pos, has_gauss, float(cached)),
            "python": (version, tuple(internal), None if gauss is None else float(gauss)),
        }
        if raw.get("cuda") is not None:
            state["cuda"] = [_byte_tensor(s) for s in raw["cuda"]]
        # the generators check sizes and values themselves: try them on scratch copies
        torch.Generator().set_state(state["torch"])
        np.random.RandomState().set_state(state["numpy"])
        random.Random().setstate(state["python"])
    except (TypeError, ValueError, KeyError, OverflowError, RuntimeError) as exc:
        raise CheckpointRefused(
            f"{path}: not RNG states this trainer wrote ({exc}); {_MOVE_IT.format(path.parent)}"
        ) from None
    return state


def _byte_tensor(text: Any) -> torch.Tensor:
    if not isinstance(text, str):
        raise TypeError(f"expected a hex string, got {type(text).__name__}")
    return torch.frombuffer(bytearray.fromhex(text), dtype=torch.uint8).clone()


def _read_rng_state(checkpoint: Path) -> dict[str, Any]:
    """The RNG states of ``checkpoint``: ``rng.json``, or the ``rng.pt`` of checkpoints written
    before it (see :func:`_read_legacy_rng`)."""
    path = checkpoint / RNG_FILE
    if path.is_file():
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            msg = f"{path}: not JSON ({exc}); {_MOVE_IT.format(checkpoint)}"
            raise CheckpointRefused(msg) from None
        if not isinstance(raw, dict) or raw.get("format") != _RNG_FORMAT:
            raise CheckpointRefused(
                f"{path}: not RNG states this trainer wrote; {_MOVE_IT.format(checkpoint)}"
            )
        return _parse_rng_state(raw, path)
    legacy = checkpoint / LEGACY_RNG_FILE
    if legacy.is_file():
        return _parse_rng_state(_read_legacy_rng(legacy), legacy)
    raise CheckpointRefused(
        f"{checkpoint}: no {RNG_FILE} (an incomplete checkpoint): {_MOVE_IT.format(checkpoint)}"
    )


class _LegacyArray:
    """Stands in for ``numpy.ndarray`` while an old ``rng.pt`` is read: keeps its pickled state
    (version, shape, dtype, Fortran order, raw bytes) and runs nothing."""

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _LegacyDtype:
    """Stands in for ``numpy.dtype`` (the arguments and state it was pickled with)."""

    def __init__(self, *args: Any) -> None:
        self.args, self.state = args, None

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _legacy_reconstruct(subtype: Any, shape: Any, dtype: Any) -> _LegacyArray:
    if subtype is not _LegacyArray:
        raise TypeError(f"not an ndarray: {subtype!r}")
    return _LegacyArray()


# the only globals an old rng.pt names beside torch's own: numpy's array reconstruction,
# mapped to the stand-ins above (never to numpy itself)
_LEGACY_GLOBALS = [
    (_legacy_reconstruct, "numpy._core.multiarray._reconstruct"),  # written by numpy 2
    (_legacy_reconstruct, "numpy.core.multiarray._reconstruct"),  # written by numpy 1
    (_LegacyArray, "numpy.ndarray"),
    (_LegacyDtype, "numpy.dtype"),
]


def _read_legacy_rng(path: Path) -> dict[str, Any]:
    """An ``rng.pt`` of the format before ``rng.json`` (``{"torch": ByteTensor, "numpy":
    np.random.get_state(), "python": random.getstate(), "cuda": [ByteTensor]}``), as
    :func:`_rng_state`'s JSON values. It is read by torch's weights-only unpickler, which calls
    nothing but tensor rebuilds and the stand-ins of ``_LEGACY_GLOBALS`` (they only store their
    arguments); the one array in it must be 624 ``uint32`` words. Anything else — a pickle
    that names another global (code it would run), another structure — raises
    :class:`CheckpointRefused` naming the file and what to do."""
    try:
        with torch.serialization.safe_globals(_LEGACY_GLOBALS):
            raw = torch.load(path, weights_only=True, map_location="cpu")
        alg, key, pos, has_gauss, cached = raw["numpy"]
        version, internal, gauss = raw["python"]
        state = {
            "format": _RNG_FORMAT,
            "torch": _legacy_bytes(raw["torch"]),
            "numpy": [alg, _legacy_words(key), pos, has_gauss, cached],
            "python": [version, list(internal), gauss],
        }
        if raw.get("cuda") is not None:
            state["cuda"] = [_legacy_bytes(s) for s in raw["cuda"]]
        extra = set(raw) - {"torch", "numpy", "python", "cuda"}
        if extra:
            raise ValueError(f"unexpected entries {sorted(extra)}")
    except Exception as exc:  # an unpickling error, or another structure than the old format's
        raise CheckpointRefused(
            f"{path}: refused: not the RNG states an earlier webloop wrote ({_reason(exc)}); "
            "unpickling it could run code: do not load it with torch.load(weights_only=False); "
            f"{_MOVE_IT.format(path.parent)}"
        ) from None
    return state


def _reason(exc: Exception) -> str:
    """The gist of a load error: the weights-only unpickler's own line, the global it refused
    (the message around it advises loading the file with ``weights_only=False``: never)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    found = [ln for ln in lines if "GLOBAL " in ln or "WeightsUnpickler error:" in ln]
    gist = (found or lines or [""])[0].removeprefix("WeightsUnpickler error: ")
    return f"{type(exc).__name__}: {gist.split(' Please use', 1)[0][:200]}"


def _legacy_bytes(t: Any) -> str:
    if type(t) is not torch.Tensor or t.dtype != torch.uint8 or t.dim() != 1:
        raise TypeError("an RNG state is not a 1-d uint8 tensor")
    return t.numpy().tobytes().hex()


def _legacy_words(arr: Any) -> list[int]:
    """The 624 key words of an old numpy state, from the stand-in's pickled state."""
    if type(arr) is not _LegacyArray:
        raise TypeError("the numpy key is not an array")
    version, shape, dtype, fortran, data = arr.state
    if type(dtype) is not _LegacyDtype or dtype.args[:1] != ("u4",) or dtype.state is None:
        raise TypeError("the numpy key is not uint32")
    order = dtype.state[1]
    if shape != (624,) or order not in ("<", ">", "=", "|") or type(data) is not bytes:
        raise TypeError("the numpy key is not 624 uint32 words")
    if len(data) != 624 * 4 or fortran not in (True, False) or version != 1:
        raise TypeError("the numpy key is not 624 uint32 words")
    return np.frombuffer(data, dtype=np.dtype("u4").newbyteorder(order)).tolist()


def _check_fingerprints(path: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    for what in ("config", "data", "model"):
        key = f"{what}_fingerprint"
        if saved.get(key) != current[key]:
            detail = ""
            if what == "config":
                old, new = saved.get("config", {}), current["config"]
                keys = sorted({*old, *new})
                diff = {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)}
                detail = f" (differing fields, checkpoint vs now: {diff})"
            raise CheckpointMismatch(
                f"{path} was written for another {what}: checkpoint {key} {saved.get(key)} "
                f"vs this run's {current[key]}{detail}; use a fresh out_dir or the same {what}"
            )


# -- the loop -------------------------------------------------------------------------------------


@dataclass
class _Run:
    """Mutable state of one fit call."""

    model: TrainablePolicy
    turns: list[Turn]
    cfg: TrainConfig
    engine: Engine
    opt: torch.optim.Optimizer
    ref_model: TrainablePolicy | None
    old_logprobs: torch.Tensor | None = None
    anchor: list[Turn] = field(default_factory=list)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.opt.param_groups for p in g["params"]]


_DROPOUT_ATTRS = ("attention_dropout", "dropout", "hidden_dropout", "activation_dropout")


def no_dropout(module: torch.nn.Module) -> dict[torch.nn.Module, dict[str, float]]:
    """Set every dropout of ``module`` to 0: its ``nn.Dropout`` layers' ``p`` and the float
    dropout rates attention layers apply functionally in train mode (``attention_dropout``, …).
    Returns the previous values, to restore."""
    saved: dict[torch.nn.Module, dict[str, float]] = {}
    for sub in module.modules():
        names = ["p"] if isinstance(sub, torch.nn.modules.dropout._DropoutNd) else []
        names += [a for a in _DROPOUT_ATTRS if isinstance(getattr(sub, a, None), float)]
        for name in names:
            saved.setdefault(sub, {})[name] = getattr(sub, name)
            setattr(sub, name, 0.0)
    return saved


def _policy_logprobs(model: TrainablePolicy, turns: list[Turn], batch_size: int) -> torch.Tensor:
    """No-grad log-probs of ``turns`` under ``model`` in eval mode (NaN where uncovered)."""
    was_training = getattr(model.module, "training", True)
    model.train(False)
    out = []
    with torch.no_grad():
        for start in range(0, len(turns), batch_size):
            lp = model.logprobs(turns[start : start + batch_size])
            covered = torch.as_tensor(lp.covered, dtype=torch.bool)
            values = lp.logprob.detach().float()
            out.append(torch.where(covered, values, torch.full_like(values, float("nan"))))
    model.train(was_training)
    return torch.cat(out).cpu() if out else torch.zeros(0)


def _behaviour_logprobs(run: _Run) -> torch.Tensor:
    """PPO's old log-probs: ``Turn.old_logprob`` where given, else computed once (no grad)."""
    missing = [i for i, t in enumerate(run.turns) if t.old_logprob is None]
    given = [float("nan") if t.old_logprob is None else t.old_logprob for t in run.turns]
    old = torch.tensor(given, dtype=torch.float32)
    if missing:
        computed = _policy_logprobs(run.model, [run.turns[i] for i in missing], run.cfg.batch_size)
        old[missing] = computed
    return old


def anchor_batch(anchor: Sequence[Turn], step: int, size: int, seed: int) -> list[Turn]:
    """The anchor turns of global step ``step`` (from 1): consecutive ``size``-slices of a cycle
    of seeded permutations of ``anchor`` (a new permutation each pass)."""
    n = len(anchor)
    start = (step - 1) * size
    out = []
    for pos in range(start, start + min(size, n)):
        cycle, i = divmod(pos, n)
        perm = np.random.default_rng([seed, ANCHOR_STREAM, cycle]).permutation(n)
        out.append(anchor[int(perm[i])])
    return out


# A rank's share of a step: (item, real) pairs. Every rank gets the same number of slots (and so
# runs the same number of forward passes, which fsdp's collectives need): a rank short of items
# repeats the batch's first one with real=False, which adds nothing to the loss.
Slots = list[tuple[Any, bool]]


def shard(items: Sequence[Any], rank: int, world: int) -> Slots:
    """Rank ``rank``'s slots of ``items``: every ``world``-th item from position ``rank``."""
    if not items:
        return []
    size = -(-len(items) // world)
    mine: Slots = [(x, True) for x in items[rank::world]]
    return mine + [(items[0], False)] * (size - len(mine))


def chunks(slots: Slots, n: int) -> list[Slots]:
    """``slots`` in ``n`` consecutive micro-batches of equal width (the last ones may be
    shorter or empty)."""
    width = max(-(-len(slots) // n), 1)
    return [slots[i * width : (i + 1) * width] for i in range(n)]


@dataclass
class _Denominators:
    """What a step's loss terms are normalised by, over the whole (global) batch."""

    objective: float
    kl: float
    anchor: float
    tokens: float


def _counts(model: TrainablePolicy, turns: list[Turn]) -> tuple[list[float], list[bool]]:
    """Each turn's ``n_tokens`` and ``covered``: the model's ``counts`` (no forward) when it has
    one, else from no-grad log-probs."""
    if not turns:
        return [], []
    counts = getattr(model, "counts", None)
    if callable(counts):
        n, covered = counts(turns)
        return [float(v) for v in n], [bool(c) for c in covered]
    with torch.no_grad():
        lp = model.logprobs(turns)
    return [float(v) for v in lp.n_tokens], [bool(c) for c in lp.covered]


def _local_denominators(run: _Run, mine: Slots, demo: Slots) -> list[float]:
    """This rank's share of the step's denominators (summed over the ranks by the caller)."""
    turns = [run.turns[i] for i, _ in mine]
    n, covered = _counts(run.model, turns)
    real = [r for _, r in mine]
    cov = [c and r for c, r in zip(covered, real, strict=True)]
    if run.cfg.objective == "ppo":
        assert run.old_logprobs is not None
        old = run.old_logprobs
        cov = [c and not math.isnan(float(old[i])) for c, (i, _) in zip(cov, mine, strict=True)]
    w = [t.weight for t in turns]
    if run.cfg.objective == "sft":
        objective = sum(wi * ni for wi, ni, c in zip(w, n, cov, strict=True) if c)
    else:
        objective = float(sum(cov))
    kl = 0.0
    if run.ref_model is not None:
        _, ref_cov = _counts(run.ref_model, turns)
        kl = float(sum(c and rc for c, rc in zip(cov, ref_cov, strict=True)))
    anchor = 0.0
    if demo:
        demo_turns = [t for t, _ in demo]
        dn, dc = _counts(run.model, demo_turns)
        real_demo = [r for _, r in demo]
        rows = zip(demo_turns, dn, dc, real_demo, strict=True)
        anchor = sum(t.weight * ni for t, ni, c, r in rows if c and r)
    tokens = sum(ni for ni, r in zip(n, real, strict=True) if r)
    return [objective, kl, anchor, tokens]


def _exact_kl(run: _Run, batch: list[Turn]) -> torch.Tensor | None:
    """Per-turn KL(π‖ref) summed over the state's whole action set, for a policy that
    enumerates it (``candidate_logprobs``: the ranker's candidates), differentiable in π;
    None where the model cannot (a VLM's replies are open text: k3 on the sampled reply)."""
    own = getattr(run.model, "candidate_logprobs", None)
    ref = getattr(run.ref_model, "candidate_logprobs", None)
    if not (callable(own) and callable(ref)):
        return None
    policy = own(batch)
    was_training = getattr(run.ref_model.module, "training", False)
    run.ref_model.train(False)
    with torch.no_grad():
        reference = ref(batch)
    run.ref_model.train(was_training)
    rows = [
        (lp.exp() * (lp - q.to(lp.device))).sum() for lp, q in zip(policy, reference, strict=True)
    ]
    return torch.stack(rows)


def _micro_loss(
    run: _Run, part: Slots, demo: Slots, dens: _Denominators
) -> tuple[torch.Tensor, list[float]]:
    """One micro-batch's share of the step's loss, scaled so that the gradients summed over
    micro-batches (and averaged over ranks, as DDP / FSDP do) are the whole batch's; and its
    metric sums: objective, kl and anchor numerators, covered, real, clipped, approx-KL and
    ratio sums, PPO's covered count."""
    scale = float(run.engine.world)
    sums = [0.0] * 9
    loss: torch.Tensor | None = None
    if part:
        idx = [i for i, _ in part]
        batch = [run.turns[i] for i in idx]
        lp: TurnLogprobs = run.model.logprobs(batch)
        logprob = lp.logprob
        dev = logprob.device
        real = torch.tensor([r for _, r in part], dtype=torch.bool, device=dev)
        covered = torch.as_tensor(lp.covered, dtype=torch.bool, device=dev) & real
        zeros = torch.zeros_like(logprob)
        w = torch.tensor([t.weight for t in batch], dtype=logprob.dtype, device=dev)
        n = torch.as_tensor(lp.n_tokens, device=dev).to(logprob.dtype)
        if run.cfg.objective == "sft":
            num = -(torch.where(covered, w * logprob, zeros)).sum()
        elif run.cfg.objective == "awr":
            num = torch.where(covered, -w * logprob / n.clamp_min(1e-8), zeros).sum()
        else:
            assert run.old_logprobs is not None
            old = run.old_logprobs[idx].to(dev, logprob.dtype)
            covered = covered & ~torch.isnan(old)
            log_ratio = torch.where(covered, logprob - torch.nan_to_num(old), zeros)
            ratio = torch.exp(log_ratio)
            adv = torch.tensor([t.advantage for t in batch], dtype=logprob.dtype, device=dev)
            eps = run.cfg.clip_eps
            surr = torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
            num = -torch.where(covered, surr, zeros).sum()
            with torch.no_grad():
                r, lr = ratio[covered], log_ratio[covered]
                sums[5] = float(((r - 1).abs() > eps).sum())
                sums[6] = float(((r - 1) - lr).sum())
                sums[7] = float(r.sum())
                sums[8] = float(covered.sum())
        loss = num * (scale / max(dens.objective, 1e-12))
        sums[0] = float(num.detach())
        sums[3], sums[4] = float(covered.sum()), float(real.sum())
        if run.ref_model is not None:
            ref = _policy_logprobs(run.ref_model, batch, len(batch)).to(dev, logprob.dtype)
            mask = covered & ~torch.isnan(ref)
            per_turn = _exact_kl(run, batch)
            if per_turn is None:  # k3 on the sampled reply (Schulman): unbiased for KL(π‖ref)
                per_turn = kl_penalty(logprob, torch.nan_to_num(ref))
            kl_num = torch.where(mask, per_turn.to(logprob.dtype), zeros).sum()
            sums[1] = float(kl_num.detach())
            if run.cfg.kl_coef > 0:
                loss = loss + kl_num * (run.cfg.kl_coef * scale / max(dens.kl, 1.0))
    if demo:
        demo_lp = run.model.logprobs([t for t, _ in demo])
        dl = demo_lp.logprob
        mask = torch.as_tensor(demo_lp.covered, dtype=torch.bool, device=dl.device)
        mask = mask & torch.tensor([r for _, r in demo], dtype=torch.bool, device=dl.device)
        dw = torch.tensor([t.weight for t, _ in demo], dtype=dl.dtype, device=dl.device)
        anchor_num = -(torch.where(mask, dw * dl, torch.zeros_like(dl))).sum()
        sums[2] = float(anchor_num.detach())
        term = anchor_num * (run.cfg.anchor_coef * scale / max(dens.anchor, 1e-12))
        loss = term if loss is None else loss + term
    assert loss is not None
    return loss, sums


def _step_metrics(run: _Run, totals: list[float], dens: _Denominators) -> tuple[float, dict]:
    """The step's loss and metrics from the metric sums over every rank and micro-batch."""
    cfg = run.cfg
    loss = totals[0] / dens.objective if dens.objective > 0 else 0.0
    metrics: dict[str, float] = {}
    if cfg.objective == "ppo":
        n = totals[8]
        metrics.update(
            clip_fraction=totals[5] / n if n else 0.0,
            approx_kl=totals[6] / n if n else 0.0,
            ratio_mean=totals[7] / n if n else 1.0,
        )
    if cfg.anchor_coef > 0 and run.anchor:
        anchor_loss = totals[2] / dens.anchor if dens.anchor > 0 else 0.0
        metrics["anchor_loss"] = anchor_loss
        loss += cfg.anchor_coef * anchor_loss
    if run.ref_model is not None and totals[3] > 0:
        kl = totals[1] / max(dens.kl, 1.0)
        metrics["kl"] = kl
        if cfg.kl_coef > 0:
            loss += cfg.kl_coef * kl
    metrics["covered"] = totals[3] / totals[4] if totals[4] else 0.0
    return loss, metrics


def _train_step(run: _Run, positions: list[int], step: int) -> dict[str, float]:
    """One optimizer step on the global batch ``positions``: this rank's share of it, in
    ``grad_accum`` micro-batches."""
    t0 = time.perf_counter()
    eng, cfg = run.engine, run.cfg
    run.opt.zero_grad(set_to_none=True)
    mine = shard(positions, eng.rank, eng.world)
    demo: Slots = []
    if cfg.anchor_coef > 0 and run.anchor:
        demo_all = anchor_batch(run.anchor, step, cfg.batch_size, cfg.seed)
        demo = shard(demo_all, eng.rank, eng.world)
    dens = _Denominators(*eng.sum(_local_denominators(run, mine, demo)))
    parts, demos = chunks(mine, eng.pc.grad_accum), chunks(demo, eng.pc.grad_accum)
    totals = [0.0] * 9
    for k, (part, dpart) in enumerate(zip(parts, demos, strict=True)):
        if not part and not dpart:
            continue
        with eng.no_sync(last=k == len(parts) - 1), eng.autocast():
            loss, sums = _micro_loss(run, part, dpart, dens)
            if not bool(torch.isfinite(loss.detach())):
                keys = [run.turns[i].key for i, _ in part]
                raise FloatingPointError(
                    f"non-finite loss {float(loss.detach())} on the batch {keys}"
                )
            eng.backward(loss)
        totals = [a + b for a, b in zip(totals, sums, strict=True)]
    totals = eng.sum(totals)
    loss_value, metrics = _step_metrics(run, totals, dens)
    grad_norm = 0.0
    if dens.objective > 0 or dens.anchor > 0:  # anything in the loss has a gradient
        max_norm = cfg.grad_clip if cfg.grad_clip is not None else math.inf
        grad_norm = eng.clip(run.params, max_norm)
        run.opt.step()
    elapsed = max(time.perf_counter() - t0, 1e-9)
    return {
        "loss": loss_value,
        "lr": run.opt.param_groups[0]["lr"],
        "grad_norm": grad_norm,
        "covered": metrics.pop("covered"),
        "examples_per_s": len(positions) / elapsed,
        "tokens_per_s": dens.tokens / elapsed,
        **metrics,
    }


def _latest(out_dir: Path, current: dict[str, Any]) -> tuple[int, Path, dict] | None:
    """The latest checkpoint in ``out_dir`` (checked against this run's fingerprints)."""
    found = list_checkpoints(out_dir)
    if not found:
        return None
    step, path = found[-1]
    saved = json.loads((path / STATE_FILE).read_text())
    _check_fingerprints(path, saved, current)
    return step, path, saved


def _restore(run: _Run, path: Path) -> None:
    """The optimizer, PPO's behaviour log-probs and the RNG states of checkpoint ``path`` (the
    module's weights were loaded before it was wrapped)."""
    opt_state = torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu")
    run.engine.load_optimizer_state(run.opt, opt_state)
    if (path / "old_logprobs.pt").exists():
        run.old_logprobs = torch.load(path / "old_logprobs.pt", weights_only=True)
    _set_rng_state(_read_rng_state(path))


def _trainable(turns: list[Turn], cfg: TrainConfig) -> list[Turn]:
    keep = trainable_indices(turns, cfg.objective)
    if not keep:
        what = "advantage 0 or weight 0" if cfg.objective == "ppo" else "weight 0"
        raise DataMismatch(
            f"fit: all {len(turns)} turns have {what}; nothing to train ({cfg.objective})"
        )
    return [turns[i] for i in keep]


def _write_checkpoint(run: _Run, out_dir: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``checkpoint-<step>`` atomically (temporary folder, then rename): rank 0 writes,
    every rank takes part in gathering a sharded module's state."""
    eng = run.engine
    module_state = eng.module_state()
    opt_state = eng.optimizer_state(run.opt)
    final = out_dir / f"{CHECKPOINT_PREFIX}{step}"
    if eng.is_main:
        tmp = out_dir / f".tmp-{CHECKPOINT_PREFIX}{step}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        if eng.fsdp:
            run.model.save(tmp, state_dict=module_state)  # type: ignore[call-arg]
        else:
            with eng.unwrapped(run.model):
                run.model.save(tmp)
        torch.save(module_state, tmp / "module.pt")
        torch.save(opt_state, tmp / "optimizer.pt")
        (tmp / RNG_FILE).write_text(json.dumps(_rng_state()), encoding="utf-8")
        if run.old_logprobs is not None:
            torch.save(run.old_logprobs, tmp / "old_logprobs.pt")
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    eng.barrier()
    return final


def _checkpoint(run: _Run, out_dir: Path, step: int, plan: list, base: dict, metrics: dict) -> Path:
    """Write ``checkpoint-<step>`` with this run's trainer state."""
    epoch, position, _ = plan[step - 1] if step > 0 else (0, 0, None)
    state = {
        **base,
        "step": step,
        "epoch": epoch,
        "batch_position": position,
        "total_steps": len(plan),
        "n_trainable": len(run.turns),
        "metrics": metrics,
        "config_full": dataclasses.asdict(run.cfg),
        "parallel": run.engine.describe(),
    }
    return _write_checkpoint(run, out_dir, step, state)


def _check_inputs(
    model: TrainablePolicy,
    turns: list[Turn],
    cfg: TrainConfig,
    ref_model: TrainablePolicy | None,
    anchor: list[Turn],
) -> None:
    model.check_data(turns)
    if not turns:
        raise DataMismatch("fit: no turns to train on (empty dataset)")
    if cfg.kl_coef > 0 and ref_model is None:
        raise ValueError(f"fit: kl_coef={cfg.kl_coef} needs a ref_model")
    if cfg.anchor_coef > 0 and not anchor:
        raise ValueError(f"fit: anchor_coef={cfg.anchor_coef} needs anchor turns")
    if anchor:
        model.check_data(anchor)


def fit(
    model: TrainablePolicy,
    turns: Sequence[Turn],
    cfg: TrainConfig,
    out_dir: str | Path,
    *,
    ref_model: TrainablePolicy | None = None,
    anchor: Sequence[Turn] = (),
    log: LogFn | None = None,
    on_checkpoint: CheckpointFn | None = None,
    progress: ProgressFn | None = None,
    parallel: ParallelConfig | None = None,
) -> FitResult:
    """Train ``model`` on ``turns`` by ``cfg.objective``, checkpointing into ``out_dir`` and
    resuming from it (see the module docstring).

    ``log(step, metrics)`` gets each step's ``loss``, ``lr``, ``grad_norm`` (before clipping),
    ``covered`` (share of the batch's turns the model can produce), ``examples_per_s``,
    ``tokens_per_s`` (reply tokens), ``epoch`` and for PPO ``clip_fraction``, ``approx_kl``,
    ``ratio_mean``; ``kl`` (k3 to ``ref_model``) when a reference model is given; ``anchor_loss``
    (the SFT loss of the step's ``anchor`` batch) when ``cfg.anchor_coef`` > 0.
    ``on_checkpoint(step, path)`` runs after each checkpoint is in place; ``progress(done,
    total)`` after each step (and once at the start). Under a launcher (many ranks) only rank 0
    calls them.

    ``parallel``: strategy, mixed precision and gradient accumulation (:mod:`training.parallel`);
    the number of processes is the launcher's.

    Raises :class:`DataMismatch` (from ``model.check_data`` or when nothing is trainable) before
    any step, :class:`CheckpointMismatch` when ``out_dir`` belongs to another run,
    :class:`CheckpointRefused` when its latest checkpoint holds files the trainer did not write,
    ``FloatingPointError`` on a non-finite loss (naming the batch's turn keys)."""
    turns, anchor = list(turns), list(anchor)
    _check_inputs(model, turns, cfg, ref_model, anchor)
    train_turns = _trainable(turns, cfg)
    out_dir = Path(out_dir)
    engine = Engine(parallel or ParallelConfig())
    if engine.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in out_dir.glob(f".tmp-{CHECKPOINT_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
    engine.barrier()

    plan = schedule(len(train_turns), cfg)
    total = len(plan) if cfg.max_steps is None else min(cfg.max_steps, len(plan))
    torch.manual_seed(cfg.seed)
    data_fp = data_fingerprint(turns)
    if anchor:  # the anchor is data the run trains on too
        data_fp = hashlib.sha256(f"{data_fp}/{data_fingerprint(anchor)}".encode()).hexdigest()
    base = {
        "config": cfg.fingerprint_fields(),
        "config_fingerprint": config_fingerprint(cfg),
        "data_fingerprint": data_fp,
        "model_fingerprint": model_fingerprint(model),
        "n_turns": len(turns),
    }
    latest = _latest(out_dir, base)
    metrics: dict[str, float] = {}
    if latest is not None:  # the weights go in before the module is wrapped (or sharded)
        state_dict = torch.load(latest[1] / "module.pt", map_location="cpu", weights_only=True)
        model.module.load_state_dict(state_dict)
        metrics = latest[2].get("metrics", {})
    opt = engine.prepare(model, cfg.lr, cfg.weight_decay)
    run = _Run(model, train_turns, cfg, engine, opt, ref_model, anchor=anchor)
    if latest is not None:
        _restore(run, latest[1])
    resumed_from = latest[0] if latest is not None else None
    start = resumed_from or 0
    if cfg.objective == "ppo" and run.old_logprobs is None:
        run.old_logprobs = _behaviour_logprobs(run)
    model.train(True)
    # PPO's ratio compares the policy with its behaviour log-probs, computed without dropout
    # (eval mode): the update runs without it too, else the ratio is not 1 before any step
    # and dropout noise decides what is clipped. Train mode stays (gradient checkpointing).
    restore = no_dropout(model.module) if cfg.objective == "ppo" else {}
    main = engine.is_main

    def checkpoint(step: int) -> Path:
        path = _checkpoint(run, out_dir, step, plan, base, metrics)
        if on_checkpoint is not None and main:
            on_checkpoint(step, path)
        return path

    if progress is not None and main:
        progress(min(start, total), total)
    last_path = latest[1] if latest is not None else None
    last = start
    try:
        for step in range(start + 1, total + 1):
            epoch, _, positions = plan[step - 1]
            metrics = {**_train_step(run, positions, step), "epoch": epoch}
            last = step
            if log is not None and main:
                log(step, metrics)
            if cfg.save_every and step % cfg.save_every == 0:
                last_path = checkpoint(step)
            if progress is not None and main:
                progress(step, total)
        if last_path is None or last_path.name != f"{CHECKPOINT_PREFIX}{last}":
            last_path = checkpoint(last)
    finally:
        model.module = engine.plain  # the caller's model, unwrapped (its weights trained)
        for module, values in restore.items():
            for name, value in values.items():
                setattr(module, name, value)
    return FitResult(
        steps_run=last - start,
        last_step=last,
        total_steps=total,
        resumed_from=resumed_from,
        final_checkpoint=last_path,
        last_metrics=dict(metrics),
        n_trainable=len(train_turns),
        n_skipped=len(turns) - len(train_turns),
    )
