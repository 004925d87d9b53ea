"""Training on several processes (gloo on these CPUs, real ranks started by the launcher): DDP
in micro-batches takes the single-process steps for every loss term, FSDP shards and its
checkpoint resumes in one process with the uninterrupted curve, a killed rank fails the run in
one line and the run resumes on another number of processes."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from training.interface import Turn
from training.launch import Job, RankFailed, fit_processes
from training.load import ModelSpec
from training.parallel import ParallelConfig
from training.trainer import TrainConfig, fit

# float32 sums in another order (per rank, then all-reduced): the curves agree to ~1e-6
TOL = 1e-5
pytestmark = pytest.mark.long(
    reason=(
        "DDP, FSDP and a killed rank at several steps each; twin: two real ranks through the "
        "CLI, tests/cli/test_train_cli.py::"
        "test_two_processes_train_the_tiny_vlm_and_every_tracker_gets_the_warehouse_s_curve"
    )
)
CFG = TrainConfig(objective="sft", epochs=1, lr=1e-3, batch_size=4, seed=0)


def curve_of(record: list) -> dict[int, float]:
    return {step: values["loss"] for step, values in record}


@pytest.fixture(scope="module")
def spec(tiny: Path, tmp_path_factory) -> ModelSpec:
    return ModelSpec(str(tiny), str(tmp_path_factory.mktemp("home")))


@pytest.fixture(scope="module")
def single(spec: ModelSpec, turns: list[Turn], tmp_path_factory):
    """The reference: one process, the same global batch."""
    logged: list = []
    model = spec.load()
    res = fit(
        model, turns, CFG, tmp_path_factory.mktemp("one"), log=lambda s, v: logged.append((s, v))
    )
    return model, curve_of(logged), res


def logprobs(model, turns: list[Turn]) -> torch.Tensor:
    model.train(False)
    with torch.no_grad():
        return model.logprobs(turns).logprob


def test_two_process_ddp_in_micro_batches_takes_the_single_process_steps_and_checkpoint(
    spec, turns, tmp_path
):
    """PPO with a KL term to a reference model and an SFT anchor, on two DDP ranks in
    micro-batches of 1-2 turns, takes one process's whole-batch steps: each term is normalised
    by the whole global batch's counts, not a rank's or a micro-batch's. Rank 0's checkpoint,
    loaded in one process, answers as the single-process model."""
    rl = [
        Turn(t.prompt, t.completion, t.images, 1.0, (-1.0) ** i * (1 + i % 3), key=t.key)
        for i, t in enumerate(turns[:12])
    ]
    anchor = turns[12:20]
    cfg = TrainConfig(
        objective="ppo", lr=3e-4, batch_size=6, seed=1, ppo_epochs=2, kl_coef=0.1, anchor_coef=0.5
    )
    one: list = []
    model = spec.load()
    fit(model, rl, cfg, tmp_path / "one", ref_model=spec.load(), anchor=anchor,
        log=lambda s, v: one.append((s, v)))  # fmt: skip
    two: list = []
    job = Job(
        spec, rl, cfg, str(tmp_path / "two"), ParallelConfig("ddp", grad_accum=2), spec, anchor
    )
    res = fit_processes(job, 2, log=lambda s, v: two.append((s, v)))
    assert [s for s, _ in one] == [s for s, _ in two] == [1, 2, 3, 4]
    for (_, a), (_, b) in zip(one, two, strict=True):
        # micro-batches pad to their own widest turn, and k3 exponentiates: 1e-4 relative
        for key in ("loss", "kl", "anchor_loss", "clip_fraction", "grad_norm"):
            assert abs(a[key] - b[key]) < 1e-4 * max(1.0, abs(a[key])), key
    assert one[-1][1]["kl"] > 0 and one[-1][1]["anchor_loss"] > 0  # every term was at work
    again = ModelSpec(str(res.final_checkpoint), spec.home).load()
    diff = (logprobs(again, rl[:6]) - logprobs(model, rl[:6])).abs().max()
    assert float(diff) < 1e-4
    state = (res.final_checkpoint / "trainer_state.json").read_text()
    assert '"world_size": 2' in state and '"strategy": "ddp"' in state


def test_two_process_fsdp_shards_trains_and_resumes_in_one_process(
    spec,
    turns,
    single,
    tmp_path,
):
    import json

    _model, reference, res1 = single
    logged: list = []
    half = TrainConfig(**{**CFG.__dict__, "max_steps": 5})
    job = Job(spec, turns, half, str(tmp_path), ParallelConfig("fsdp"))
    res = fit_processes(job, 2, log=lambda s, v: logged.append((s, v)))
    state = json.loads((res.final_checkpoint / "trainer_state.json").read_text())
    assert state["parallel"]["strategy"] == "fsdp"
    assert 0.3 < state["parallel"]["rank0_param_share"] < 0.7  # rank 0 held half the weights
    assert res.last_step == 5
    # the gathered checkpoint is a plain model folder one process loads and trains on from
    model = spec.load()
    rest = fit(model, turns, CFG, tmp_path, log=lambda s, v: logged.append((s, v)))
    assert rest.resumed_from == 5 and rest.steps_run == res1.last_step - 5
    curve = curve_of(logged)
    assert list(curve) == list(range(1, res1.last_step + 1))  # no step ran twice
    assert max(abs(curve[s] - reference[s]) for s in curve) < TOL
    assert curve[res1.last_step] < curve[1]


def test_a_killed_rank_fails_the_run_in_one_line_and_it_resumes_on_one_process(
    spec,
    turns,
    single,
    tmp_path,
):
    _model, reference, res1 = single
    pids: list[int] = []
    logged: list = []

    def log(step: int, values: dict) -> None:
        logged.append((step, values))
        if step == 3:
            os.kill(pids[1], signal.SIGKILL)

    cfg = TrainConfig(**{**CFG.__dict__, "save_every": 2})
    job = Job(spec, turns, cfg, str(tmp_path), ParallelConfig("ddp"))
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as failed:
        fit_processes(job, 2, log=log, on_start=pids.extend)
    assert time.monotonic() - t0 < 120  # no hang on the lost peer
    message = str(failed.value)
    assert "\n" not in message
    assert f"training rank 1 of 2 (pid {pids[1]}) was killed by SIGKILL after step" in message
    # the ranks ran on while the kill was on its way: the message says how far
    after = int(re.search(r"after step (\d+)", message)[1])
    kept = re.search(r"checkpoints up to step (\d+) are kept", message)
    last = int(kept[1]) if kept else None
    assert after >= 3 and (last is None or last in (2, 4, 6)) and (last or 0) <= after
    for pid in pids:  # every rank is gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # the same fit on one process resumes from the last checkpoint: the steps after it run
    # (and are logged) once more, as after any crash; the curve is the uninterrupted one
    resumed: list = []
    res = fit(spec.load(), turns, cfg, tmp_path, log=lambda s, v: resumed.append((s, v)))
    assert res.resumed_from == last
    assert [s for s, _ in resumed] == list(range((last or 0) + 1, res1.last_step + 1))
    curve = curve_of(resumed)
    assert max(abs(curve[s] - reference[s]) for s in curve) < TOL
