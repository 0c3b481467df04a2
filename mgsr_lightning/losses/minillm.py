"""MiniLLM's objective (Gu et al., ICLR 2024): sequence-level reverse KL minimised by policy gradient.

The student q is trained to minimise ``KL(q‖p) = E_{y~q}[Σ_t log q(y_t|y<t) − log p(y_t|y<t)]`` over
its own responses y. With the per-token reward ``r_t = log p(y_t|y<t) − log q(y_t|y<t)`` (q detached)
the gradient is ``−E[Σ_t G_t ∇ log q(y_t|y<t)]``, G_t a return. MiniLLM's three devices, each a
switch of :class:`MiniLLMConfig`:

- **single-step decomposition** (``single_step``): the current step's part of the return is taken
  out of the estimator and replaced by its exact expectation, the reverse KL of the next-token
  distributions ``Σ_v q_v (log q_v − log p_v)`` at every position, differentiated in closed form.
  The policy gradient then uses the future rewards only, ``G_t = Σ_{t'>t} γ^{t'−t−1} r_t'`` (the
  paper's R_{t+1}); without it, ``G_t = Σ_{t'≥t} γ^{t'−t} r_t'``. (MiniLLM's code keeps r_t in the
  return *and* adds the single-step term, counting the current step twice; this follows the paper.)
- **teacher-mixed sampling** (``teacher_mix`` α > 0): responses are sampled from
  ``p̃ = α·p + (1 − α)·q`` (:mod:`mgsr_lightning.training.minillm_rollout`) and each token's policy-gradient
  term is weighted by the single-step importance weight ``w_t = q(y_t) / p̃(y_t)``, detached.
- **length normalisation** (``length_norm``): G_t is divided by the number of rewards it sums, so
  long responses do not get larger returns.

As in MiniLLM's code, rewards are divided by ``reward_scaling`` and clipped to ``±reward_clip``,
returns are whitened over the batch's tokens (``whiten``; here over real tokens only, MiniLLM's code
includes padding) and ``ratio·w`` is PPO-clipped to ``1 ± clip_ratio``. Each rollout is used for one
update (MiniLLM runs 4 PPO epochs over a store of 256 rollouts), so ``ratio = q/q_old`` is 1 with
gradient ∇log q, and the clip acts on the importance weights only.

MiniLLM's pre-training term (language modelling on OpenWebText, weight ``lm_coef`` = 1) is the
module's SFT term on the ground-truth responses: there is no pre-training corpus offline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mgsr_lightning.losses._common import PADDED_LOG_PROB, upcast
from mgsr_lightning.losses.divergences import reverse_kl


@dataclass
class MiniLLMConfig:
    """MiniLLM's policy-gradient reverse KL (see :mod:`mgsr_lightning.losses.minillm`); MiniLLM's settings.

    Args:
        weight: Weight of the term in the total loss.
        single_step: Single-step decomposition: the exact per-position reverse KL plus a policy
            gradient on future rewards only (off: plain REINFORCE on the whole return-to-go).
        teacher_mix: α of teacher-mixed sampling, ``p̃ = α·p + (1 − α)·q`` (0 = sample the student alone).
        length_norm: Divide each return by the number of rewards it sums.
        gamma: Discount of future rewards.
        reward_scaling: Rewards are divided by it (before clipping).
        reward_clip: Rewards are clipped to ±this (None = no clipping).
        whiten: Whiten the returns over the batch's response tokens.
        clip_ratio: PPO clip of ``ratio·w`` to ``1 ± clip_ratio`` (None = off).
        temperature: Both logits are divided by it.
        chunk_size: Positions per chunk of the single-step term, bounding its extra memory to O(chunk × V).
    """

    weight: float = 1.0
    single_step: bool = True
    teacher_mix: float = 0.2
    length_norm: bool = True
    gamma: float = 0.95
    reward_scaling: float = 0.5
    reward_clip: float | None = 100.0
    whiten: bool = True
    clip_ratio: float | None = 0.2
    temperature: float = 1.0
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.teacher_mix < 1.0:
            raise ValueError(f"teacher_mix is a probability in [0, 1), got {self.teacher_mix}")
        if not 0.0 < self.gamma <= 1.0 or self.reward_scaling <= 0:
            raise ValueError(f"gamma must be in (0, 1] and reward_scaling > 0, got {self.gamma}, {self.reward_scaling}")


def sampled_log_probs(logits: Tensor, tokens: Tensor, mask: Tensor, temperature: float = 1.0) -> Tensor:
    """[B, R] float32 ``log softmax(logits / τ)`` at ``tokens`` [B, R]; 0 where ``mask`` [B, R] is False.

    ``logits`` [B, R, V] may hold -inf; a sampled token of probability 0 gets ``PADDED_LOG_PROB``
    (finite), and masked positions (whose token may be a pad id outside the vocabulary) are never read.
    """
    safe_tokens = tokens.masked_fill(~mask, 0)
    scaled = upcast(logits) / temperature if temperature != 1 else upcast(logits)
    log_probs = -F.cross_entropy(scaled.flatten(0, 1), safe_tokens.flatten(), reduction="none").view_as(tokens)
    return torch.where(mask, log_probs.clamp_min(PADDED_LOG_PROB), torch.zeros_like(log_probs))


def mixture_importance_weights(student_log_probs: Tensor, teacher_log_probs: Tensor, alpha: float) -> Tensor:
    """``w = q / (α·p + (1 − α)·q)`` elementwise from log q and log p of the sampled tokens (any shape).

    Computed as ``1 / ((1 − α) + α·exp(log p − log q))`` in log space: finite for any inputs, 1 at α = 0.
    """
    if alpha == 0:
        return torch.ones_like(student_log_probs)
    log_mixture = torch.logaddexp(math.log1p(-alpha) + student_log_probs, math.log(alpha) + teacher_log_probs)
    return torch.exp(student_log_probs - log_mixture)


def returns(rewards: Tensor, mask: Tensor, *, gamma: float, future_only: bool, length_norm: bool) -> Tensor:
    """[B, R] discounted returns of ``rewards`` [B, R] over each row's real tokens (``mask`` [B, R]).

    ``G_t = Σ_{t'} γ^{t'−t−s} r_t'`` over ``t' ≥ t + s`` (s = 1 with ``future_only``, else 0); with
    ``length_norm`` divided by the number of real rewards summed (at least 1). 0 at masked positions.
    """
    width = rewards.size(1)
    index = torch.arange(width, device=rewards.device)
    lag = index[None, :] - index[:, None] - int(future_only)  # [R, R]: t' − t − s for row t, column t'
    included = lag >= 0
    discount = torch.where(included, gamma ** lag.clamp_min(0).to(rewards.dtype), torch.zeros((), dtype=rewards.dtype))
    rewards = torch.where(mask, rewards, torch.zeros_like(rewards))
    totals = rewards @ discount.T  # [B, R]
    if length_norm:
        counts = mask.to(rewards.dtype) @ included.to(rewards.dtype).T
        totals = totals / counts.clamp_min(1)
    return torch.where(mask, totals, torch.zeros_like(totals))


def whitened(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` [B, R] shifted and scaled to mean 0 and variance 1 over the positions ``mask`` is True."""
    count = mask.sum().clamp_min(1)
    mean = torch.where(mask, values, torch.zeros_like(values)).sum() / count
    variance = torch.where(mask, (values - mean) ** 2, torch.zeros_like(values)).sum() / count
    return torch.where(mask, (values - mean) * torch.rsqrt(variance + 1e-8), torch.zeros_like(values))


def single_step_term(
    student_logits: Tensor, teacher_logits: Tensor, mask: Tensor, temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Tensor:
    """The single-step part: mean over compared positions of ``KL(q_t‖p_t)`` (logits [B, R, V], mask [B, R])."""
    return reverse_kl(student_logits, teacher_logits, mask, temperature=temperature, chunk_size=chunk_size)


def minillm_loss(
    student_logits: Tensor, teacher_logits: Tensor, response_ids: Tensor, mask: Tensor, config: MiniLLMConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """MiniLLM's loss on sampled responses and its diagnostics.

    Args:
        student_logits: [B, R, V] over the responses, with grad (bf16 or float32; -inf allowed).
        teacher_logits: [B, R, V], no grad needed.
        response_ids: [B, R] the sampled tokens (any id where ``mask`` is False).
        mask: [B, R] bool, True on real response tokens.
        config: the switches.

    Returns:
        (loss, diagnostics): ``loss`` = mean over real tokens of the policy-gradient term, plus the
        single-step term when on; diagnostics ``minillm/<name>`` (detached): ``pg``, ``single_step``,
        ``reward`` (mean r_t per token, unscaled), ``importance_weight`` (mean w_t), ``clipped_fraction``.
    """
    mask = mask.bool()
    c = config
    student_log_probs = sampled_log_probs(student_logits, response_ids, mask, c.temperature)
    with torch.no_grad():
        old_log_probs = student_log_probs.detach()
        teacher_log_probs = sampled_log_probs(teacher_logits.detach(), response_ids, mask, c.temperature)
        rewards = teacher_log_probs - old_log_probs
        scaled = rewards / c.reward_scaling
        if c.reward_clip is not None:
            scaled = scaled.clamp(-c.reward_clip, c.reward_clip)
        advantages = returns(scaled, mask, gamma=c.gamma, future_only=c.single_step, length_norm=c.length_norm)
        if c.whiten:
            advantages = whitened(advantages, mask)
        weights = mixture_importance_weights(old_log_probs, teacher_log_probs, c.teacher_mix)
    count = mask.sum().clamp_min(1)
    weighted_ratio = torch.exp(student_log_probs - old_log_probs) * weights  # value w, gradient w·∇log q
    per_token = -advantages * weighted_ratio
    if c.clip_ratio is not None:
        clipped = -advantages * weighted_ratio.clamp(1 - c.clip_ratio, 1 + c.clip_ratio)
        per_token = torch.maximum(per_token, clipped)
        clipped_fraction = ((clipped > -advantages * weighted_ratio.detach()) & mask).sum() / count
    else:
        clipped_fraction = torch.zeros((), device=mask.device)
    pg = torch.where(mask, per_token, torch.zeros_like(per_token)).sum() / count
    diagnostics = {
        "minillm/pg": pg.detach(),
        "minillm/reward": (rewards.sum() / count),
        "minillm/importance_weight": (torch.where(mask, weights, torch.zeros_like(weights)).sum() / count),
        "minillm/clipped_fraction": clipped_fraction.detach(),
    }
    loss = pg
    if c.single_step:
        single_step = single_step_term(student_logits, teacher_logits, mask, c.temperature, c.chunk_size)
        diagnostics["minillm/single_step"] = single_step.detach()
        loss = loss + single_step
    return loss, diagnostics
