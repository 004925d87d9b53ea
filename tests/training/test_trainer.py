"""The training loop with a toy categorical policy: learning, PPO direction, resume, errors."""

from __future__ import annotations

import json
import os
import random
import shlex

import numpy as np
import pytest
import torch

from tests.training.toy_policy import REPLIES, ToyPolicy
from training.interface import DataMismatch, Turn
from training.trainer import (
    CheckpointMismatch,
    CheckpointRefused,
    TrainConfig,
    fit,
    list_checkpoints,
)

PROMPTS = [f"Task: toy {i}. Current page: p{i}" for i in range(6)]


def test_toy_prompts_do_not_collide():
    assert len({ToyPolicy().bucket(p) for p in PROMPTS}) == len(PROMPTS)


def sft_turns() -> list[Turn]:
    """Each prompt's target reply is REPLIES[i % 4]; three copies of each."""
    return [
        Turn(prompt=p, completion=REPLIES[i % len(REPLIES)], key=f"t{i}/{c}")
        for c in range(3)
        for i, p in enumerate(PROMPTS)
    ]


def ppo_turns() -> list[Turn]:
    """At each prompt reply 0 was good (A = +1), reply 1 bad (A = −1); one zero-advantage turn."""
    turns = []
    for i, p in enumerate(PROMPTS):
        turns.append(Turn(prompt=p, completion=REPLIES[0], advantage=1.0, key=f"p{i}/0"))
        turns.append(Turn(prompt=p, completion=REPLIES[1], advantage=-1.0, key=f"p{i}/1"))
    turns.append(Turn(prompt=PROMPTS[0], completion=REPLIES[2], advantage=0.0, key="zero"))
    return turns


def params(model: ToyPolicy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}


class Recorder:
    """A ``log`` callback; ``fail_at`` raises (before recording) at that step."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.steps: list[int] = []
        self.metrics: dict[int, dict[str, float]] = {}
        self.fail_at = fail_at

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        if step == self.fail_at:
            raise RuntimeError(f"injected failure at step {step}")
        self.steps.append(step)
        self.metrics[step] = metrics


def test_sft_loss_falls_and_checkpoints_and_progress(tmp_path):
    model = ToyPolicy(seed=0)
    rec, ckpts, prog = Recorder(), [], []
    cfg = TrainConfig(objective="sft", epochs=15, lr=0.05, batch_size=6, save_every=10)
    res = fit(
        model,
        sft_turns(),
        cfg,
        tmp_path,
        log=rec,
        on_checkpoint=lambda s, p: ckpts.append((s, p)),
        progress=lambda d, t: prog.append((d, t)),
    )
    assert res.total_steps == 15 * 3 and res.steps_run == 45 and res.last_step == 45
    assert rec.steps == list(range(1, 46))
    first = sum(rec.metrics[s]["loss"] for s in (1, 2, 3)) / 3
    last = sum(rec.metrics[s]["loss"] for s in (43, 44, 45)) / 3
    assert first > 1.0 and last < 0.3 * first
    assert set(rec.metrics[1]) >= {"loss", "lr", "grad_norm", "covered", "examples_per_s"}
    assert rec.metrics[1]["lr"] == 0.05 and rec.metrics[1]["covered"] == 1.0
    assert [s for s, _ in ckpts] == [10, 20, 30, 40, 45]
    assert [s for s, _ in list_checkpoints(tmp_path)] == [10, 20, 30, 40, 45]
    final = res.final_checkpoint
    assert final == tmp_path / "checkpoint-45" and ckpts[-1][1] == final
    for name in ("module.pt", "optimizer.pt", "rng.json", "toy.pt", "config.json"):
        assert (final / name).is_file(), name
    assert not (final / "rng.pt").exists()  # the RNG states are JSON: no pickle to load
    state = json.loads((final / "trainer_state.json").read_text())
    assert state["step"] == 45 and state["epoch"] == 14 and state["batch_position"] == 2
    assert state["config"]["lr"] == 0.05 and len(state["data_fingerprint"]) == 64
    assert prog[0] == (0, 45) and prog[-1] == (45, 45) and len(prog) == 46
    # the trained model prefers each prompt's target reply
    for i, p in enumerate(PROMPTS):
        assert model.logprob_of(p, REPLIES[i % 4]) > max(
            model.logprob_of(p, r) for r in REPLIES if r != REPLIES[i % 4]
        )
    # a re-run over the finished out_dir does nothing
    again = fit(ToyPolicy(seed=0), sft_turns(), cfg, tmp_path, log=rec)
    assert again.steps_run == 0 and again.resumed_from == 45 and again.final_checkpoint == final
    assert again.last_metrics == pytest.approx(res.last_metrics) and rec.steps[-1] == 45


def test_ppo_moves_logprobs_by_advantage_sign(tmp_path):
    model = ToyPolicy(seed=1)
    before = {(p, r): model.logprob_of(p, r) for p in PROMPTS for r in REPLIES[:2]}
    rec = Recorder()
    cfg = TrainConfig(objective="ppo", epochs=4, lr=0.05, batch_size=4, ppo_epochs=2, clip_eps=0.2)
    res = fit(model, ppo_turns(), cfg, tmp_path, log=rec)
    assert res.n_trainable == 12 and res.n_skipped == 1  # the zero-advantage turn is skipped
    assert res.total_steps == 4 * 3 * 2
    for p in PROMPTS:
        assert model.logprob_of(p, REPLIES[0]) > before[(p, REPLIES[0])] + 0.1
        assert model.logprob_of(p, REPLIES[1]) < before[(p, REPLIES[1])] - 0.1
    m = rec.metrics
    assert set(m[1]) >= {"clip_fraction", "approx_kl", "ratio_mean"}
    # first update: new policy == behaviour policy up to dropout noise
    assert m[1]["clip_fraction"] < 1.0 and m[1]["ratio_mean"] == pytest.approx(1.0, abs=0.5)
    assert max(m[s]["clip_fraction"] for s in m) > 0  # later updates move past the clip range
    assert all(m[s]["approx_kl"] >= 0 for s in m)


def test_ppo_kl_to_reference_is_logged_and_needs_ref_model(tmp_path):
    cfg = TrainConfig(objective="ppo", epochs=1, lr=0.05, batch_size=4, kl_coef=0.1)
    with pytest.raises(ValueError, match=r"kl_coef=0\.1 needs a ref_model"):
        fit(ToyPolicy(seed=1), ppo_turns(), cfg, tmp_path / "a")
    rec = Recorder()
    fit(ToyPolicy(seed=1), ppo_turns(), cfg, tmp_path / "b", ref_model=ToyPolicy(seed=1), log=rec)
    kls = [rec.metrics[s]["kl"] for s in rec.steps]
    assert all(k >= 0 for k in kls) and kls[-1] > 0


def test_an_sft_anchor_keeps_the_states_rl_does_not_cover(tmp_path):
    """PPO on prompts 0-2 moves the shared head, and with it the prompts it never saw; the
    anchor's SFT term (PPO-ptx) on prompts 3-5 holds their demonstrated reply up meanwhile."""
    rl = [t for t in ppo_turns() if t.key.split("/")[0] in {"p0", "p1", "p2"}]
    demos = [
        Turn(prompt=p, completion=REPLIES[2], key=f"demo{i}") for i, p in enumerate(PROMPTS[3:])
    ]
    start = ToyPolicy(seed=2)
    before = {p: start.logprob_of(p, REPLIES[2]) for p in PROMPTS[3:]}
    base = dict(objective="ppo", epochs=6, lr=0.05, batch_size=4, ppo_epochs=2)
    plain = ToyPolicy(seed=2)
    fit(plain, rl, TrainConfig(**base), tmp_path / "plain")
    anchored, rec = ToyPolicy(seed=2), Recorder()
    cfg = TrainConfig(**base, anchor_coef=1.0)
    res = fit(anchored, rl, cfg, tmp_path / "anchored", anchor=demos, log=rec)
    for p in PROMPTS[3:]:
        assert anchored.logprob_of(p, REPLIES[2]) > before[p] + 0.1
        assert anchored.logprob_of(p, REPLIES[2]) > plain.logprob_of(p, REPLIES[2]) + 0.1
    for p in PROMPTS[:3]:  # the RL prompts still move by their advantages
        assert anchored.logprob_of(p, REPLIES[0]) > anchored.logprob_of(p, REPLIES[1])
    losses = [rec.metrics[s]["anchor_loss"] for s in rec.steps]
    assert len(losses) == res.steps_run and losses[-1] < losses[0]
    with pytest.raises(ValueError, match=r"anchor_coef=1\.0 needs anchor turns"):
        fit(ToyPolicy(seed=2), rl, cfg, tmp_path / "none")


def test_anchor_batches_cycle_through_every_turn_each_pass():
    from training.trainer import anchor_batch

    demos = [Turn(prompt=p, completion=REPLIES[0], key=f"d{i}") for i, p in enumerate(PROMPTS)]
    batches = [anchor_batch(demos, step, 4, seed=7) for step in range(1, 4)]  # 12 = two passes
    keys = [t.key for b in batches for t in b]
    assert sorted(keys[:6]) == sorted(keys[6:]) == sorted(t.key for t in demos)
    assert keys[:6] != keys[6:]  # each pass its own order
    assert [t.key for t in anchor_batch(demos, 2, 4, seed=7)] == [t.key for t in batches[1]]
    assert len(anchor_batch(demos[:2], 5, 4, seed=7)) == 2  # never more than the anchor holds


def test_awr_weights_and_uncovered_turns(tmp_path):
    p = PROMPTS[0]
    turns = [
        Turn(prompt=p, completion=REPLIES[0], weight=3.0, key="a"),
        Turn(prompt=p, completion=REPLIES[1], weight=0.2, key="b"),
        Turn(prompt=p, completion=REPLIES[2], weight=0.0, key="c"),  # skipped
        Turn(prompt=p, completion="Action: not-a-reply", weight=1.0, key="d"),  # uncovered
    ]
    model = ToyPolicy(seed=2)
    rec = Recorder()
    cfg = TrainConfig(objective="awr", epochs=20, lr=0.05, batch_size=3)
    res = fit(model, turns, cfg, tmp_path, log=rec)
    assert res.n_skipped == 1
    assert rec.metrics[1]["covered"] == pytest.approx(2 / 3)
    assert model.logprob_of(p, REPLIES[0]) > model.logprob_of(p, REPLIES[1]) + 1.0


def _run(tmp, cfg, *, seed=3, log=None, turns_fn=sft_turns):
    model = ToyPolicy(seed=seed)
    return model, fit(model, turns_fn(), cfg, tmp, log=log)


@pytest.mark.parametrize("objective", ["sft", "ppo"])
def test_resume_after_max_steps_and_after_a_crash_is_exact(tmp_path, objective):
    turns_fn = sft_turns if objective == "sft" else ppo_turns
    cfg = TrainConfig(
        objective=objective, epochs=3, lr=0.05, batch_size=4, save_every=2, ppo_epochs=2
    )
    full_rec = Recorder()
    full_model, full = _run(tmp_path / "full", cfg, log=full_rec, turns_fn=turns_fn)
    n = full.total_steps
    assert n >= 10 and full_rec.steps == list(range(1, n + 1))

    # stopped by max_steps after 5 steps, then continued by a fresh process (another init seed:
    # the weights must come from the checkpoint, the PPO behaviour log-probs too)
    rec = Recorder()
    stopped_cfg = TrainConfig(**{**cfg.__dict__, "max_steps": 5})
    _, first = _run(tmp_path / "stop", stopped_cfg, log=rec, turns_fn=turns_fn)
    assert first.last_step == 5 and first.final_checkpoint.name == "checkpoint-5"
    model, second = _run(tmp_path / "stop", cfg, seed=99, log=rec, turns_fn=turns_fn)
    assert second.resumed_from == 5 and second.steps_run == n - 5
    assert rec.steps == list(range(1, n + 1))  # nothing logged twice, nothing missing
    for k, v in params(full_model).items():
        assert torch.equal(params(model)[k], v), k
    for s in range(1, n + 1):
        assert rec.metrics[s]["loss"] == full_rec.metrics[s]["loss"], s

    # crashed in the logger at step 7 (after the checkpoint at 6): resumes at 7
    rec = Recorder(fail_at=7)
    with pytest.raises(RuntimeError, match="injected failure at step 7"):
        _run(tmp_path / "crash", cfg, log=rec, turns_fn=turns_fn)
    assert rec.steps == list(range(1, 7))
    assert [s for s, _ in list_checkpoints(tmp_path / "crash")] == [2, 4, 6]
    rec.fail_at = None
    model, resumed = _run(tmp_path / "crash", cfg, seed=42, log=rec, turns_fn=turns_fn)
    assert resumed.resumed_from == 6 and rec.steps == list(range(1, n + 1))
    for k, v in params(full_model).items():
        assert torch.equal(params(model)[k], v), k


def test_fingerprint_mismatch_names_both(tmp_path):
    cfg = TrainConfig(objective="sft", epochs=1, lr=0.05, batch_size=6)
    fit(ToyPolicy(), sft_turns(), cfg, tmp_path)
    other = TrainConfig(objective="sft", epochs=1, lr=0.01, batch_size=6)
    with pytest.raises(CheckpointMismatch, match=r"another config.*'lr': \(0.05, 0.01\)") as err:
        fit(ToyPolicy(), sft_turns(), other, tmp_path)
    saved = json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text())
    assert saved["config_fingerprint"] in str(err.value)
    changed = [*sft_turns()[:-1], Turn(prompt="Task: else", completion=REPLIES[0], key="x")]
    with pytest.raises(CheckpointMismatch, match="another data") as err:
        fit(ToyPolicy(), changed, cfg, tmp_path)
    assert saved["data_fingerprint"] in str(err.value)
    with pytest.raises(CheckpointMismatch, match="another model"):
        fit(ToyPolicy(dim=4), sft_turns(), cfg, tmp_path)


def test_check_data_error_comes_before_any_step(tmp_path):
    model = ToyPolicy()
    rec = Recorder()
    turns = [*sft_turns(), Turn(prompt="", completion=REPLIES[0], key="empty/0")]
    with pytest.raises(DataMismatch, match=r"turn 18 \('empty/0'\) has an empty prompt"):
        fit(model, turns, TrainConfig(), tmp_path, log=rec)
    assert rec.steps == [] and model.calls == 0 and list_checkpoints(tmp_path) == []
    zero = [Turn(prompt=p, completion=REPLIES[0], advantage=0.0) for p in PROMPTS]
    with pytest.raises(DataMismatch, match="all 6 turns have advantage 0 or weight 0"):
        fit(model, zero, TrainConfig(objective="ppo"), tmp_path, log=rec)
    with pytest.raises(ValueError, match="objective must be 'sft', 'ppo' or 'awr', got 'dpo'"):
        TrainConfig(objective="dpo")


def test_non_finite_loss_names_the_batch(tmp_path):
    model = ToyPolicy()
    with torch.no_grad():
        model.module.head.weight.fill_(float("nan"))
    cfg = TrainConfig(objective="sft", batch_size=2)
    with pytest.raises(FloatingPointError, match=r"non-finite loss nan on the batch \['t"):
        fit(model, sft_turns(), cfg, tmp_path)


# -- RNG states: a checkpoint runs no code ----------------------------------------------------


def old_format_rng(state: dict) -> dict:
    """``rng.json``'s states as webloop pickled them to ``rng.pt`` before (a numpy array in
    it): what ``torch.save(_rng_state(), "rng.pt")`` wrote."""
    alg, key, pos, has_gauss, cached = state["numpy"]
    version, internal, gauss = state["python"]
    return {
        "torch": torch.frombuffer(bytearray.fromhex(state["torch"]), dtype=torch.uint8),
        "numpy": (alg, np.array(key, dtype=np.uint32), pos, has_gauss, cached),
        "python": (version, tuple(internal), gauss),
    }


class Payload:
    """What a planted checkpoint carries: unpickling it runs code (here: creates ``marker``)."""

    def __init__(self, how: str, marker) -> None:
        self.how, self.marker = how, str(marker)

    def __reduce__(self):
        if self.how == "exec":
            return (exec, (f"open({self.marker!r}, 'w').close()",))
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


@pytest.mark.parametrize(("how", "global_name"), [("exec", "exec"), ("system", "posix.system")])
def test_a_planted_rng_pickle_is_refused_and_runs_nothing(tmp_path, how, global_name):
    """A copied or planted checkpoint whose ``rng.pt`` (the old format's name) is a pickle that
    would run code: the resume refuses it, naming the file and what to do; the code never ran."""
    cfg = TrainConfig(objective="sft", epochs=1, lr=0.05, batch_size=6)
    fit(ToyPolicy(), sft_turns(), cfg, tmp_path / "out")
    ckpt = tmp_path / "out" / "checkpoint-3"
    state = json.loads((ckpt / "rng.json").read_text())
    (ckpt / "rng.json").unlink()
    marker = tmp_path / "marker"
    planted = {**old_format_rng(state), "python": Payload(how, marker)}  # all else looks right
    torch.save(planted, ckpt / "rng.pt")
    with pytest.raises(CheckpointRefused) as err:
        fit(ToyPolicy(), sft_turns(), cfg, tmp_path / "out")
    assert not marker.exists()
    msg = str(err.value)
    assert msg.startswith(f"{ckpt / 'rng.pt'}: refused") and f"GLOBAL {global_name} " in msg
    assert f"move {ckpt} out of its folder to resume from the checkpoint before it" in msg


def test_an_old_format_rng_pt_resumes_exactly_with_every_state(tmp_path):
    """Checkpoints written before ``rng.json`` keep resuming: their ``rng.pt`` (tensors and one
    numpy array) is read without unpickling anything else, and the run goes on exactly."""
    cfg = TrainConfig(objective="sft", epochs=2, lr=0.05, batch_size=4, save_every=2)
    full_model, full = _run(tmp_path / "full", cfg)
    stopped = TrainConfig(**{**cfg.__dict__, "max_steps": 4})
    _run(tmp_path / "old", stopped)
    ckpt = tmp_path / "old" / "checkpoint-4"
    state = json.loads((ckpt / "rng.json").read_text())
    (ckpt / "rng.json").unlink()
    torch.save(old_format_rng(state), ckpt / "rng.pt")
    model, resumed = _run(tmp_path / "old", cfg, seed=99)  # the toy's dropout draws from torch
    assert resumed.resumed_from == 4 and resumed.steps_run == full.total_steps - 4
    for k, v in params(full_model).items():
        assert torch.equal(params(model)[k], v), k

    # numpy's and python's states come back too (a cached Gaussian included)
    _run(tmp_path / "states", stopped)
    ckpt = tmp_path / "states" / "checkpoint-4"
    random.seed(11), np.random.seed(12), torch.manual_seed(13), np.random.normal()
    saved = {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}
    saved["python"] = random.getstate()
    torch.save(saved, ckpt / "rng.pt")  # as the old trainer wrote it
    (ckpt / "rng.json").unlink()
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    _, again = _run(tmp_path / "states", stopped)
    assert again.resumed_from == 4 and again.steps_run == 0
    assert random.getstate() == saved["python"] and torch.equal(
        torch.get_rng_state(), saved["torch"]
    )
    alg, key, *rest = np.random.get_state()
    assert alg == "MT19937" and np.array_equal(key, saved["numpy"][1])
    assert rest == list(saved["numpy"][2:]) and rest[1] == 1  # has_gauss


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: {**s, "numpy": [*s["numpy"][:2], 10**6, *s["numpy"][3:]]}, "out of range"),
        (lambda s: {**s, "torch": "00ff"}, "not RNG states this trainer wrote"),
        (lambda s: {**s, "python": [3, ["x"] * 625, None]}, "not an integer"),
        (lambda s: "not json {", "not JSON"),
    ],
)
def test_rng_json_of_another_shape_is_refused(tmp_path, change, reason):
    """``rng.json`` values go to the generators only once checked (numpy itself does not check
    the position: one past the key would read out of bounds)."""
    cfg = TrainConfig(objective="sft", epochs=1, lr=0.05, batch_size=6)
    fit(ToyPolicy(), sft_turns(), cfg, tmp_path)
    path = tmp_path / "checkpoint-3" / "rng.json"
    bad = change(json.loads(path.read_text()))
    path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    with pytest.raises(CheckpointRefused, match=reason) as err:
        fit(ToyPolicy(), sft_turns(), cfg, tmp_path)
    assert str(err.value).startswith(str(path))
