"""Losses over per-turn reply log-probs (:class:`training.interface.TurnLogprobs`), in torch.

Every loss works on sequence-level numbers: ``logprob[i]`` is the (weighted) sum of the reply's
token log-probs of turn ``i`` and ``n_tokens[i]`` the (weighted) count it ran over. Turns with
``covered[i] == False`` (the model cannot produce the reply at all) are left out of every loss
and every statistic. When no turn of a batch is covered a loss is an exact zero that is still
attached to the graph (``backward`` works and gives zero gradients).
"""

from __future__ import annotations

import torch

from training.interface import TurnLogprobs


def _as_tensor(x, like: torch.Tensor, dtype=None) -> torch.Tensor:
    """``x`` (tensor, list or number) as a tensor on ``like``'s device, broadcast to its shape."""
    t = torch.as_tensor(x, device=like.device, dtype=dtype or like.dtype)
    if t.shape != like.shape:
        t = t.expand_as(like)
    return t


def _mask(covered, like: torch.Tensor) -> torch.Tensor:
    if covered is None:
        return torch.ones_like(like, dtype=torch.bool)
    return _as_tensor(covered, like, dtype=torch.bool)


def _zero(like: torch.Tensor) -> torch.Tensor:
    """An exact 0 that keeps the graph (so ``backward`` still runs)."""
    return (like * 0.0).sum()


def sft_loss(lp: TurnLogprobs, weights) -> torch.Tensor:
    """Per-token mean negative log-likelihood, each token weighted by its turn's example weight:

    ``L = Σ_i w_i · (−logprob_i) / Σ_i w_i · n_tokens_i`` over covered turns ``i``.

    With all weights 1 this is the usual token-mean cross-entropy of the batch's replies."""
    logprob = lp.logprob
    mask = _mask(lp.covered, logprob)
    w = _as_tensor(weights, logprob) * mask
    n = _as_tensor(lp.n_tokens, logprob)
    denom = (w * n).sum()
    if not bool(mask.any()) or float(denom) <= 0:
        return _zero(logprob)
    return -(w * torch.where(mask, logprob, torch.zeros_like(logprob))).sum() / denom


def awr_loss(lp: TurnLogprobs, weights) -> torch.Tensor:
    """Advantage-weighted regression (DigiRL): weighted per-token negative log-likelihood,
    averaged over covered turns, weights NOT renormalised (they carry ``exp(A/β)``):

    ``L = (1/|C|) Σ_{i∈C} w_i · (−logprob_i / n_tokens_i)``."""
    logprob = lp.logprob
    mask = _mask(lp.covered, logprob)
    if not bool(mask.any()):
        return _zero(logprob)
    w = _as_tensor(weights, logprob)
    n = _as_tensor(lp.n_tokens, logprob).clamp_min(1e-8)
    per_turn = torch.where(mask, -w * logprob / n, torch.zeros_like(logprob))
    return per_turn.sum() / mask.sum()


def ppo_clip_loss(
    logprob: torch.Tensor,
    old_logprob,
    advantage,
    clip_eps: float,
    covered=None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate (sequence-level ratio per turn), negated to be minimised:

    ``ρ_i = exp(logprob_i − old_logprob_i)``,
    ``L = −(1/|C|) Σ_{i∈C} min(ρ_i A_i, clip(ρ_i, 1−ε, 1+ε) A_i)``.

    Where the clipped term is the minimum (``ρ > 1+ε`` with ``A > 0``, ``ρ < 1−ε`` with ``A < 0``)
    the turn's gradient is zero. Stats over covered turns: ``clip_fraction`` (share with
    ``|ρ − 1| > ε``), ``approx_kl`` (``mean((ρ − 1) − log ρ)``, the k3 estimate of
    KL(old‖new), ≥ 0), ``ratio_mean``."""
    mask = _mask(covered, logprob)
    old = _as_tensor(old_logprob, logprob).detach()
    adv = _as_tensor(advantage, logprob).detach()
    if not bool(mask.any()):
        zero = {"clip_fraction": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0}
        return _zero(logprob), zero
    log_ratio = torch.where(mask, logprob - old, torch.zeros_like(logprob))
    ratio = torch.exp(log_ratio)
    surr = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    n = mask.sum()
    loss = -torch.where(mask, surr, torch.zeros_like(surr)).sum() / n
    with torch.no_grad():
        r, lr = ratio[mask], log_ratio[mask]
        stats = {
            "clip_fraction": float(((r - 1).abs() > clip_eps).float().mean()),
            "approx_kl": float(((r - 1) - lr).mean()),
            "ratio_mean": float(r.mean()),
        }
    return loss, stats


def kl_penalty(logprob: torch.Tensor, ref_logprob) -> torch.Tensor:
    """Per-turn k3 estimate of KL(π‖π_ref) from samples of π (Schulman 2020), ``[B]``:

    ``k3 = exp(ref − lp) − (ref − lp) − 1`` (≥ 0, unbiased, low variance). The reference is
    detached; reduce it (masked mean) in the caller."""
    d = _as_tensor(ref_logprob, logprob).detach() - logprob
    return torch.exp(d) - d - 1
