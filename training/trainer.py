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
the path's save format), ``optimizer.pt``, ``rng.pt`` (torch / numpy / python RNG states),
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
from training.losses import awr_loss, kl_penalty, ppo_clip_loss, sft_loss

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
        default=0.0, metadata={"help": "Weight of the k3 KL to ref_model (needs ref_model)."}
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
    """sha256 over every turn's key, prompt, completion, images, weight, advantage, old log-prob."""
    h = hashlib.sha256()
    for t in turns:
        images = [hashlib.sha256(b).hexdigest() for b in t.images]
        rec = [t.key, t.prompt, t.completion, images, t.weight, t.advantage, t.old_logprob]
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


def _rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():  # dropout on a GPU draws from the CUDA generators
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _write_checkpoint(
    out_dir: Path,
    step: int,
    model: TrainablePolicy,
    opt: torch.optim.Optimizer,
    state: dict[str, Any],
    old_logprobs: torch.Tensor | None,
) -> Path:
    """Write ``checkpoint-<step>`` atomically (temporary folder, then rename)."""
    final = out_dir / f"{CHECKPOINT_PREFIX}{step}"
    tmp = out_dir / f".tmp-{CHECKPOINT_PREFIX}{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save(tmp)
    torch.save(model.module.state_dict(), tmp / "module.pt")
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    torch.save(_rng_state(), tmp / "rng.pt")
    if old_logprobs is not None:
        torch.save(old_logprobs, tmp / "old_logprobs.pt")
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


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
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    ref_model: TrainablePolicy | None
    old_logprobs: torch.Tensor | None = None
    anchor: list[Turn] = field(default_factory=list)


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


def _step_loss(
    run: _Run, batch: list[Turn], idx: list[int], step: int
) -> tuple[torch.Tensor, dict, Any, bool]:
    """The step's loss, its metrics, the batch's covered mask and whether anything in the loss
    has a gradient (a covered turn, or the anchor term)."""
    lp: TurnLogprobs = run.model.logprobs(batch)
    logprob = lp.logprob
    covered = torch.as_tensor(lp.covered, dtype=torch.bool, device=logprob.device)
    metrics: dict[str, float] = {}
    if run.cfg.objective == "sft":
        loss = sft_loss(lp, [t.weight for t in batch])
    elif run.cfg.objective == "awr":
        loss = awr_loss(lp, [t.weight for t in batch])
    else:
        old = run.old_logprobs[idx].to(logprob.device, logprob.dtype)
        covered = covered & ~torch.isnan(old)
        old = torch.nan_to_num(old)
        adv = [t.advantage for t in batch]
        loss, metrics = ppo_clip_loss(logprob, old, adv, run.cfg.clip_eps, covered)
    trains = bool(covered.any())
    if run.cfg.anchor_coef > 0 and run.anchor:
        demo = anchor_batch(run.anchor, step, run.cfg.batch_size, run.cfg.seed)
        demo_lp = run.model.logprobs(demo)
        anchor_loss = sft_loss(demo_lp, [t.weight for t in demo])
        metrics["anchor_loss"] = float(anchor_loss.detach())
        loss = loss + run.cfg.anchor_coef * anchor_loss
        trains = trains or bool(torch.as_tensor(demo_lp.covered).any())
    if run.ref_model is not None and bool(covered.any()):
        ref = _policy_logprobs(run.ref_model, batch, len(batch)).to(logprob.device, logprob.dtype)
        mask = covered & ~torch.isnan(ref)
        kl = kl_penalty(logprob, torch.nan_to_num(ref))
        kl_mean = torch.where(mask, kl, torch.zeros_like(kl)).sum() / mask.sum().clamp_min(1)
        metrics["kl"] = float(kl_mean.detach())
        if run.cfg.kl_coef > 0:
            loss = loss + run.cfg.kl_coef * kl_mean
    return loss, metrics, covered, trains


def _train_step(run: _Run, batch: list[Turn], idx: list[int], step: int) -> dict[str, float]:
    t0 = time.perf_counter()
    run.opt.zero_grad(set_to_none=True)
    loss, metrics, covered, trains = _step_loss(run, batch, idx, step)
    grad_norm = 0.0
    if not bool(torch.isfinite(loss.detach())):
        keys = [t.key for t in batch]
        raise FloatingPointError(f"non-finite loss {float(loss.detach())} on the batch {keys}")
    if trains:
        loss.backward()
        max_norm = run.cfg.grad_clip if run.cfg.grad_clip is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(run.params, max_norm))
        run.opt.step()
    elapsed = max(time.perf_counter() - t0, 1e-9)
    return {
        "loss": float(loss.detach()),
        "lr": run.opt.param_groups[0]["lr"],
        "grad_norm": grad_norm,
        "covered": float(covered.float().mean()) if len(batch) else 0.0,
        "examples_per_s": len(batch) / elapsed,
        **metrics,
    }


def _resume(run: _Run, out_dir: Path, current: dict[str, Any]) -> tuple[int | None, dict]:
    """Load the latest checkpoint (if any) into ``run``; its step and last metrics."""
    found = list_checkpoints(out_dir)
    if not found:
        return None, {}
    step, path = found[-1]
    saved = json.loads((path / STATE_FILE).read_text())
    _check_fingerprints(path, saved, current)
    state_dict = torch.load(path / "module.pt", map_location="cpu", weights_only=True)
    run.model.module.load_state_dict(state_dict)
    run.opt.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    if (path / "old_logprobs.pt").exists():
        run.old_logprobs = torch.load(path / "old_logprobs.pt", weights_only=True)
    _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return step, saved.get("metrics", {})


def _trainable(turns: list[Turn], cfg: TrainConfig) -> list[Turn]:
    keep = trainable_indices(turns, cfg.objective)
    if not keep:
        what = "advantage 0 or weight 0" if cfg.objective == "ppo" else "weight 0"
        raise DataMismatch(
            f"fit: all {len(turns)} turns have {what}; nothing to train ({cfg.objective})"
        )
    return [turns[i] for i in keep]


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
    }
    return _write_checkpoint(out_dir, step, run.model, run.opt, state, run.old_logprobs)


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
) -> FitResult:
    """Train ``model`` on ``turns`` by ``cfg.objective``, checkpointing into ``out_dir`` and
    resuming from it (see the module docstring).

    ``log(step, metrics)`` gets each step's ``loss``, ``lr``, ``grad_norm`` (before clipping),
    ``covered`` (share of the batch's turns the model can produce), ``examples_per_s``, ``epoch``
    and for PPO ``clip_fraction``, ``approx_kl``, ``ratio_mean``; ``kl`` (k3 to ``ref_model``) when
    a reference model is given; ``anchor_loss`` (the SFT loss of the step's ``anchor`` batch)
    when ``cfg.anchor_coef`` > 0. ``on_checkpoint(step, path)`` runs after each checkpoint is in
    place; ``progress(done, total)`` after each step (and once at the start).

    Raises :class:`DataMismatch` (from ``model.check_data`` or when nothing is trainable) before
    any step, :class:`CheckpointMismatch` when ``out_dir`` belongs to another run,
    ``FloatingPointError`` on a non-finite loss (naming the batch's turn keys)."""
    turns = list(turns)
    model.check_data(turns)
    if not turns:
        raise DataMismatch("fit: no turns to train on (empty dataset)")
    if cfg.kl_coef > 0 and ref_model is None:
        raise ValueError(f"fit: kl_coef={cfg.kl_coef} needs a ref_model")
    anchor = list(anchor)
    if cfg.anchor_coef > 0 and not anchor:
        raise ValueError(f"fit: anchor_coef={cfg.anchor_coef} needs anchor turns")
    if anchor:
        model.check_data(anchor)
    train_turns = _trainable(turns, cfg)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(f".tmp-{CHECKPOINT_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)

    plan = schedule(len(train_turns), cfg)
    total = len(plan) if cfg.max_steps is None else min(cfg.max_steps, len(plan))
    torch.manual_seed(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    run = _Run(model, train_turns, cfg, params, opt, ref_model, anchor=anchor)
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
    resumed_from, metrics = _resume(run, out_dir, base)
    start = resumed_from or 0
    if cfg.objective == "ppo" and run.old_logprobs is None:
        run.old_logprobs = _behaviour_logprobs(run)
    model.train(True)

    def checkpoint(step: int) -> Path:
        path = _checkpoint(run, out_dir, step, plan, base, metrics)
        if on_checkpoint is not None:
            on_checkpoint(step, path)
        return path

    if progress is not None:
        progress(min(start, total), total)
    last_path = list_checkpoints(out_dir)[-1][1] if resumed_from is not None else None
    last = start
    for step in range(start + 1, total + 1):
        epoch, _, positions = plan[step - 1]
        batch = [train_turns[i] for i in positions]
        metrics = {**_train_step(run, batch, positions, step), "epoch": epoch}
        last = step
        if log is not None:
            log(step, metrics)
        if cfg.save_every and step % cfg.save_every == 0:
            last_path = checkpoint(step)
        if progress is not None:
            progress(step, total)
    if last_path is None or last_path.name != f"{CHECKPOINT_PREFIX}{last}":
        last_path = checkpoint(last)
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
