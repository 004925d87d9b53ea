"""The ranker's side of the trainer contract: data checks, differentiable candidate log-probs
(covered / not covered, actions equal by parsed value), SFT raising the target's log-prob,
per-prompt caching, and the checkpoint round trip."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch

from rollouts.prompts import PromptConfig, Turn, build_messages, render
from rollouts.ranker import RankerModel
from tests.rollouts.ranker.fixture import TREE, HashEncoder
from training.interface import DataMismatch
from training.interface import Turn as TrainTurn
from training.ranker import RankerTrainable

WIKI_TREE = """- generic [ref=e1]:
  - search [ref=e4]:
    - searchbox "Search Openpedia" [ref=e5]
    - button "Search" [ref=e6] [cursor=pointer]
  - main [ref=e7]:
    - heading "Asridorville" [level=1] [ref=e8]
    - table "Asridorville" [ref=e9]:
      - rowgroup [ref=e11]:
        - row [ref=e12]:
          - rowheader "Country" [ref=e13]
          - cell "Veyland" [ref=e14]
        - row [ref=e18]:
          - rowheader "Founded" [ref=e19]
          - cell "1431" [ref=e20]
  - dialog "Cookie consent" [ref=e41]:
    - button "Accept all" [ref=e44] [cursor=pointer]
    - button "Reject optional" [ref=e45] [cursor=pointer]"""


def prompt(instruction: str, tree: str, history: tuple[str, ...] = (), mode: str = "a11y") -> str:
    turns = [Turn("http://h/a", "A", a11y="-", action_text=a) for a in history]
    turns.append(Turn("http://h/wiki/x", "Asridorville — Openpedia", screenshot=b"p", a11y=tree))
    return render(build_messages(instruction, turns, PromptConfig(mode=mode)))


ROWS = [
    ("What year was Asridorville founded?", WIKI_TREE, (), "Action: click(e44)"),
    ("What year was Asridorville founded?", WIKI_TREE, ("click(e44)",), 'Action: answer("1431")'),
    ("Which country is Asridorville in?", WIKI_TREE, ("click(e44)",), 'answer("Veyland")'),
    ("Search Openpedia for Hamarton", WIKI_TREE, ("click(e44)",), 'type(e5, "Hamarton")'),
    ("Search Openpedia for Hamarton", WIKI_TREE, ("click(e44)", 'type(e5, "Hamarton")'),
     "Thought: now search.\nAction: click(e6)"),
    ("Book a flight from Mias on 2026-06-17", TREE, (), 'Action: type(e19, "2026-06-17")'),
]  # fmt: skip


def turns() -> list[TrainTurn]:
    return [TrainTurn(prompt(i, t, h), c, key=f"t/{k}") for k, (i, t, h, c) in enumerate(ROWS)]


@pytest.fixture
def trainable() -> RankerTrainable:
    torch.manual_seed(0)
    return RankerTrainable(RankerModel(seed=0, dropout=0.0), encoder=HashEncoder())


def test_check_data_names_what_is_wrong(trainable: RankerTrainable) -> None:
    trainable.check_data(turns())
    with pytest.raises(DataMismatch, match="no turns"):
        trainable.check_data([])
    with pytest.raises(DataMismatch, match="not a webloop prompt"):
        trainable.check_data([TrainTurn(json.dumps([{"role": "user", "content": "hi"}]), "x")])
    with pytest.raises(DataMismatch, match="not a webloop prompt"):
        trainable.check_data([TrainTurn("plain text", "Action: click(e1)", key="k9")])
    shot = TrainTurn(prompt("x", WIKI_TREE, mode="screenshot"), "Action: click(e6)", key="s/0")
    with pytest.raises(DataMismatch, match=r"s/0.*no accessibility tree"):
        trainable.check_data([*turns(), shot])


def test_logprobs_cover_targets_by_parsed_value(trainable: RankerTrainable) -> None:
    batch = turns()
    extra = [
        TrainTurn(batch[4].prompt, "Action: click( e6 )"),  # same action, other spelling
        TrainTurn(batch[3].prompt, "Action: type(e5, 'Hamarton')"),
        TrainTurn(batch[1].prompt, 'Action: answer("1432")'),  # not on the page
        TrainTurn(batch[1].prompt, "I don't know"),  # no action at all
    ]
    out = trainable.logprobs(batch + extra)
    assert out.logprob.shape == (len(batch) + 4,) and out.logprob.requires_grad
    assert out.covered.tolist() == [True] * len(batch) + [True, True, False, False]
    assert torch.allclose(out.logprob[len(batch)], out.logprob[4])
    assert torch.allclose(out.logprob[len(batch) + 1], out.logprob[3])
    assert (out.logprob[out.covered] < 0).all()
    assert (out.logprob[~out.covered] == 0).all()
    assert out.n_tokens.tolist() == [1.0] * (len(batch) + 4)
    with pytest.raises(DataMismatch):
        trainable.logprobs([])


def test_sft_steps_raise_the_targets_logprob_and_cache_the_prompt_work(
    trainable: RankerTrainable,
) -> None:
    batch = turns()
    trainable.prepare(batch)
    misses = trainable.encoder.misses
    before = trainable.logprobs(batch).logprob.detach()
    params = [p.detach().clone() for p in trainable.parameters()]
    opt = torch.optim.AdamW(trainable.parameters(), lr=1e-3)
    trainable.train(True)
    losses = []
    for _ in range(30):
        out = trainable.logprobs(batch)
        loss = -(out.logprob[out.covered]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    after = trainable.logprobs(batch).logprob.detach()
    assert losses[-1] < 0.5 * losses[0]
    assert (after > before).all(), (before, after)
    assert any(not torch.equal(p, q) for p, q in zip(params, trainable.parameters(), strict=True))
    # every prompt was encoded once: later epochs ran only the scorer
    assert trainable.encoder.misses == misses
    trainable.train(False)
    for t in batch:
        best, target = trainable.greedy_and_target(t)
        assert best == target  # the toy rows are learnt


def test_save_load_round_trip(trainable: RankerTrainable, tmp_path) -> None:
    batch = turns()
    trainable.train(False)
    before = trainable.logprobs(batch).logprob.detach()
    trainable.save(tmp_path / "ck")
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert cfg["model_type"] == "webloop-ranker"
    loaded = RankerTrainable.load(tmp_path / "ck")
    loaded.encoder = trainable.encoder
    assert loaded.kind == "ranker" and loaded.module is not trainable.module
    after = loaded.train(False).logprobs(batch).logprob.detach()
    assert torch.equal(before, after)
    fresh = RankerTrainable.new(seed=1)
    assert sum(p.numel() for p in fresh.parameters()) == sum(
        p.numel() for p in trainable.parameters()
    )


def test_one_ppo_update_moves_the_ranker_by_the_advantage_sign(
    trainable: RankerTrainable, tmp_path
) -> None:
    """The RL path through the real trainer: PPO-clip raises the log-prob of a positive-advantage
    action and lowers a negative one at the same state."""
    from training.trainer import TrainConfig, fit

    state = prompt("What year was Asridorville founded?", WIKI_TREE, ("click(e44)",))
    good = TrainTurn(state, 'Action: answer("1431")', advantage=1.0, key="s/good")
    bad = TrainTurn(state, "Action: click(e6)", advantage=-1.0, key="s/bad")
    before = trainable.logprobs([good, bad]).logprob.detach()
    cfg = TrainConfig(objective="ppo", epochs=1, ppo_epochs=4, lr=1e-3, batch_size=2)
    res = fit(trainable, [good, bad], cfg, tmp_path / "ppo")
    after = trainable.logprobs([good, bad]).logprob.detach()
    assert res.steps_run == 4
    assert after[0] > before[0] and after[1] < before[1], (before, after)


def test_the_same_rows_and_seed_train_the_same_checkpoint_whatever_the_encoder_had_cached(
    tmp_path,
) -> None:
    """SFT with the real MiniLM encoder, twice: once cold, once after the encoder had cached
    other texts (so other texts are encoded together). The checkpoints are byte-identical."""
    from rollouts.encoder import TextEncoder
    from training.trainer import TrainConfig, fit

    cfg = TrainConfig(objective="sft", epochs=3, lr=2e-3, batch_size=4, seed=5)
    files = []
    for run, warm in enumerate(([], [r[0] for r in ROWS] + ["button Search", "Veyland 1431"])):
        encoder = TextEncoder()
        encoder.encode(warm)
        torch.manual_seed(0)
        model = RankerTrainable(RankerModel(seed=0), encoder=encoder)
        fit(model, turns(), cfg, tmp_path / f"run{run}")
        model.save(tmp_path / f"final{run}")
        data = (tmp_path / f"final{run}" / "model.safetensors").read_bytes()
        files.append(hashlib.sha256(data).hexdigest())  # (a bytes diff takes minutes to print)
    assert files[0] == files[1]


def test_ppo_runs_without_dropout_so_the_first_ratio_is_exactly_one(tmp_path) -> None:
    """The behaviour log-probs come from the policy without dropout: the PPO update must run
    without it too. With the scorer's Dropout(0.1) on, the first minibatch's ratio would not be
    1 and dropout noise would decide what is clipped."""
    from training.trainer import TrainConfig, fit

    torch.manual_seed(0)
    policy = RankerTrainable(RankerModel(seed=0, dropout=0.1), encoder=HashEncoder())
    rows = [dataclasses.replace(t, advantage=(-1.0) ** i) for i, t in enumerate(turns())]
    logged: list = []
    cfg = TrainConfig(objective="ppo", epochs=1, ppo_epochs=2, lr=1e-2, batch_size=len(rows))
    fit(policy, rows, cfg, tmp_path / "ppo", log=lambda s, v: logged.append(v))
    first, second = logged
    assert abs(first["ratio_mean"] - 1.0) < 1e-6 and first["clip_fraction"] == 0.0
    assert abs(first["approx_kl"]) < 1e-9
    assert second["approx_kl"] > 1e-6  # the update moved the policy
    rates = [m.p for m in policy.module.modules() if isinstance(m, torch.nn.Dropout)]
    assert rates and all(p == 0.1 for p in rates)  # the caller's model keeps its dropout


def test_the_kl_to_the_reference_is_exact_over_the_candidates(tmp_path) -> None:
    """The ranker enumerates its actions: the KL term is Σ_c π(c)·(log π(c) − log ref(c)) over
    each state's candidates, not the k3 estimate on the one reply in the data."""
    from training.losses import kl_penalty
    from training.trainer import TrainConfig, fit

    policy = RankerTrainable(RankerModel(seed=0, dropout=0.0), encoder=HashEncoder())
    ref = RankerTrainable(RankerModel(seed=1, dropout=0.0), encoder=HashEncoder())
    torch.manual_seed(1)
    with torch.no_grad():  # (fresh rankers score near-uniformly: move the reference away)
        for p in ref.module.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    rows = [dataclasses.replace(t, advantage=1.0) for t in turns()]
    with torch.no_grad():
        pairs = zip(policy.candidate_logprobs(rows), ref.candidate_logprobs(rows), strict=True)
        exact = [float((p.exp() * (p - q)).sum()) for p, q in pairs]
        mine, theirs = policy.logprobs(rows), ref.logprobs(rows)
    covered = [bool(c) for c in mine.covered]
    expected = sum(k for k, c in zip(exact, covered, strict=True) if c) / sum(covered)
    k3 = kl_penalty(mine.logprob, theirs.logprob)
    k3_mean = sum(float(k) for k, c in zip(k3, covered, strict=True) if c) / sum(covered)
    logged: list = []
    cfg = TrainConfig(objective="ppo", epochs=1, lr=1e-3, batch_size=len(rows), kl_coef=0.5)
    fit(policy, rows, cfg, tmp_path / "kl", ref_model=ref, log=lambda s, v: logged.append(v))
    assert logged[0]["kl"] == pytest.approx(expected, rel=1e-5)  # measured before the update
    assert expected > 0 and abs(k3_mean - expected) > 1e-3  # the estimate on one reply differs
