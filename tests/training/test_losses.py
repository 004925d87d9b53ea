"""Losses against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from training.interface import TurnLogprobs
from training.losses import awr_loss, kl_penalty, ppo_clip_loss, sft_loss


def _lp():
    logprob = torch.tensor([-1.0, -3.0, -5.0], requires_grad=True)
    lp = TurnLogprobs(logprob, torch.tensor([1.0, 2.0, 4.0]), torch.tensor([True, True, False]))
    return logprob, lp


def test_sft_loss_is_weighted_token_mean_over_covered():
    logprob, lp = _lp()
    loss = sft_loss(lp, [1.0, 2.0, 1.0])
    # (1·1 + 2·3) / (1·1 + 2·2) = 7 / 5; the uncovered turn (−5, 4 tokens) is out
    assert float(loss.detach()) == pytest.approx(1.4)
    loss.backward()
    assert logprob.grad.tolist() == pytest.approx([-0.2, -0.4, 0.0])


def test_awr_loss_is_weighted_per_token_nll_mean():
    _, lp = _lp()
    # turn 0: 1 · 1/1 = 1; turn 1: 2 · 3/2 = 3; mean over the 2 covered turns = 2
    assert float(awr_loss(lp, [1.0, 2.0, 7.0]).detach()) == pytest.approx(2.0)


def test_losses_with_nothing_covered_are_zero_and_backpropagate():
    logprob = torch.tensor([-1.0, -2.0], requires_grad=True)
    lp = TurnLogprobs(logprob, torch.ones(2), torch.tensor([False, False]))
    for loss in (sft_loss(lp, [1.0, 1.0]), awr_loss(lp, [1.0, 1.0])):
        assert float(loss.detach()) == 0.0
        loss.backward()
    assert logprob.grad.tolist() == [0.0, 0.0]


def test_ppo_clip_loss_values_stats_and_clipped_gradient():
    logprob = torch.tensor([math.log(1.5), math.log(0.5), math.log(1.1), 0.0], requires_grad=True)
    old = torch.zeros(4)
    adv = torch.tensor([1.0, -1.0, 2.0, 5.0])
    covered = torch.tensor([True, True, True, False])
    loss, stats = ppo_clip_loss(logprob, old, adv, 0.2, covered)
    # ratios 1.5, 0.5, 1.1: min(1.5, 1.2)·1 = 1.2; min(−0.5, −0.8) = −0.8; 1.1·2 = 2.2
    # loss = −(1.2 − 0.8 + 2.2) / 3 = −0.866667
    assert float(loss.detach()) == pytest.approx(-2.6 / 3)
    assert stats["clip_fraction"] == pytest.approx(2 / 3)
    assert stats["ratio_mean"] == pytest.approx(3.1 / 3)
    # k3: (0.5 − ln 1.5) + (−0.5 − ln 0.5) + (0.1 − ln 1.1) = 0.292372, / 3
    assert stats["approx_kl"] == pytest.approx(0.0974573, abs=1e-6)
    loss.backward()
    # clipped turns (0: ρ > 1.2 with A > 0; 1: ρ < 0.8 with A < 0) and the uncovered one get 0;
    # turn 2: d/dlp of −ρ·A/3 = −1.1·2/3
    assert logprob.grad.tolist() == pytest.approx([0.0, 0.0, -2.2 / 3, 0.0])


def test_ppo_unclipped_side_keeps_gradient():
    # ρ = 1.5 > 1 + ε but A < 0: the unclipped term is the minimum, the gradient flows
    logprob = torch.tensor([math.log(1.5)], requires_grad=True)
    loss, stats = ppo_clip_loss(logprob, torch.zeros(1), torch.tensor([-1.0]), 0.2)
    assert float(loss.detach()) == pytest.approx(1.5)
    loss.backward()
    assert logprob.grad.tolist() == pytest.approx([1.5])
    assert stats["clip_fraction"] == 1.0


def test_kl_penalty_k3():
    lp = torch.tensor([0.0, -1.0, 0.5])
    ref = torch.tensor([0.0, 0.0, 0.0])
    # d = ref − lp: 0 -> 0; 1 -> e − 2 = 0.718282; −0.5 -> e^−0.5 − 0.5 = 0.106531
    assert kl_penalty(lp, ref).tolist() == pytest.approx([0.0, math.e - 2, 0.1065307], abs=1e-6)
