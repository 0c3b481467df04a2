"""Exposure bias as MiniLLM's ExAccErr (Gu et al., 2024, §3.3 and Appendix B.5, Eq. 30–32, after
Arora et al., 2022, "Why Exposure Bias Matters"): how much more error a student accumulates when it
generates from its own prefixes than when it is teacher-forced on the teacher's.

With the teacher p as the oracle, the student q_θ, a prompt x and response steps t = 1 … l:

    e_t(y_<t) = KL(p(·|x, y_<t) ‖ q_θ(·|x, y_<t))        the student's error at one step
    R(l)      = Σ_{t≤l} E_{y_<t ~ q_θ(·|x)} e_t(y_<t)    accumulated regret, free-running (student prefixes)
    l·ε(l)    = Σ_{t≤l} E_{y_<t ~ p(·|x)}   e_t(y_<t)    the same error with the teacher's prefixes
    ExAccErr(l) = (R(l) − l·ε(l)) / (l·ε(l)) × 100%      excess accumulated error, in percent

(MiniLLM writes the step error as E_{y_t ~ p} log p(y_t|·)/q_θ(y_t|·), which is the KL above.) A
student whose errors do not depend on where its prefix came from has ExAccErr = 0; exposure bias
makes it grow with l. As MiniLLM's ``evaluate_exposure_bias.py`` computes it: ``samples``
responses per prompt are drawn from each model (MiniLLM: 10, top-p 1, temperature 1); at each step
the error is averaged over the samples still running at that step (0 when none is), summed over
steps per prompt, and averaged over prompts. Where l·ε(l) = 0 the ratio is 0 if R(l) = 0 too (no
error at all, e.g. student == teacher) and +inf otherwise.

Shapes: ``B`` prompts, ``L`` = ``decoding.sampling.max_new_tokens`` steps, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mgsr_lightning.batch import Rollout
from mgsr_lightning.generation.decode import Decoding, eval_mode, sample
from mgsr_lightning.generation.scoring import response_logits
from mgsr_lightning.losses import forward_kl


@dataclass
class ExposureBias:
    """Per-step curves, [L] each, index l − 1 for length l.

    regret: R(l), accumulated error of the free-running student. forced_error: l·ε(l), the same on
    the teacher's generations. ex_acc_err: ExAccErr(l) in percent. prompts: the number of prompts.
    """

    regret: Tensor
    forced_error: Tensor
    ex_acc_err: Tensor
    prompts: int


def step_errors(
    teacher: nn.Module,
    student: nn.Module,
    rollout: Rollout,
    *,
    vocab_size: int | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """[B, R] KL(p‖q) at each response position of ``rollout`` (both models teacher-forced on it),
    0 at padding."""
    with torch.no_grad(), eval_mode(teacher, student):
        teacher_logits = response_logits(teacher, rollout, vocab_size)
        student_logits = response_logits(student, rollout, vocab_size)
        return forward_kl(
            student_logits, teacher_logits, rollout.response_mask, reduction="none", chunk_size=chunk_size
        )


def accumulated_errors(
    generator: nn.Module,
    teacher: nn.Module,
    student: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    decoding: Decoding,
    *,
    seeds: Tensor,
    chunk_size: int | None = None,
) -> Tensor:
    """[B, L] Σ_{t≤l} of the student's step error on responses sampled from ``generator``.

    seeds: [S, B] int64, one row of per-prompt seeds per sample. At each step the error is averaged
    over the samples that reach it (0 when none does), then summed over steps.
    """
    steps = decoding.sampling.max_new_tokens
    total = prompt_ids.new_zeros(prompt_ids.size(0), steps, dtype=torch.float32)  # [B, L]
    count = torch.zeros_like(total)
    for sample_seeds in seeds:
        rollout = sample(generator, prompt_ids, prompt_mask, decoding, seeds=sample_seeds)
        errors = step_errors(teacher, student, rollout, vocab_size=decoding.vocab_size, chunk_size=chunk_size)  # [B, R]
        width = errors.size(1)
        total[:, :width] += errors.float()
        count[:, :width] += rollout.response_mask.float()
    return (total / count.clamp_min(1)).cumsum(-1)


def ex_acc_err(regret: Tensor, forced_error: Tensor) -> Tensor:
    """ExAccErr(l) = (R(l) − l·ε(l)) / (l·ε(l)) × 100, with 0/0 = 0 and x/0 = +inf for x > 0."""
    excess = regret - forced_error
    ratio = 100 * excess / forced_error.clamp_min(torch.finfo(forced_error.dtype).tiny)
    return torch.where(forced_error > 0, ratio, torch.where(excess > 0, float("inf"), 0.0))


def exposure_bias(
    student: nn.Module,
    teacher: nn.Module,
    prompts: Iterable[tuple[Tensor, Tensor]],
    decoding: Decoding,
    *,
    samples: int = 10,
    seed: int = 0,
    chunk_size: int | None = None,
) -> ExposureBias:
    """MiniLLM's ExAccErr curve of ``student`` against ``teacher`` over batches of prompts.

    Args:
        student, teacher: causal LMs sharing a tokenizer (``decoding.vocab_size`` cuts padded vocabularies).
        prompts: batches of ``(prompt_ids [B, P] left-padded, prompt_mask [B, P] bool)``.
        decoding: sampling and special ids for both models' generations (MiniLLM: do_sample, top_p 1,
            temperature 1); ``decoding.sampling.max_new_tokens`` is L, the length of the curves. Greedy decoding
            gives one deterministic response per prompt (``samples`` then only repeats it).
        samples: responses per prompt and model.
        seed: the per-prompt sampling seeds are drawn from a generator seeded with it.
        chunk_size: positions per chunk of the KL, bounding its memory.

    Returns:
        ``ExposureBias`` with R(l), l·ε(l) and ExAccErr(l), each averaged over all prompts.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    seed_generator = torch.Generator().manual_seed(seed)
    regrets, forced_errors = [], []
    for prompt_ids, prompt_mask in prompts:
        for generator, curves in ((student, regrets), (teacher, forced_errors)):
            seeds = torch.randint(2**62, (samples, prompt_ids.size(0)), generator=seed_generator)
            curves.append(
                accumulated_errors(
                    generator, teacher, student, prompt_ids, prompt_mask, decoding, seeds=seeds, chunk_size=chunk_size,
                )
            )
    if not regrets:
        raise ValueError("exposure_bias needs at least one batch of prompts")
    regret, forced_error = torch.cat(regrets).mean(0), torch.cat(forced_errors).mean(0)  # [L] each
    prompt_count = sum(curve.size(0) for curve in regrets)
    return ExposureBias(regret, forced_error, ex_acc_err(regret, forced_error), prompts=prompt_count)
