"""SCRG: sequence correction and re-generation (MGSR, arXiv 2407.10068).

A student rollout is scored by one teacher and one student forward; among the response positions
where the teacher's token differs from the student's, the one with the largest "semantic cognitive
difference" (a per-token divergence) is the error. The response is cut there, the teacher's token
is written in its place, and the student re-generates the rest:

    prompt  y_0 … y_{j-1}  y_j  y_{j+1} …        rollout; j = argmax_{i: y_i ≠ t_i} D_i
    prompt  y_0 … y_{j-1}  t_j  z_{j+1} …        revised: t_j from the teacher, z from the student

``find_error_positions`` is the pure scoring step on response-aligned logits; ``revise`` runs the
forwards, the corrections and one batched re-generation per round.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import torch
from torch import Tensor, nn

from mgsr_lightning.batch import Rollout, pack_tokens
from mgsr_lightning.distributed import any_rank
from mgsr_lightning.generation import Decoding, eval_mode, response_logits, sample, token_id_tensor
from mgsr_lightning.losses import forward_kl, generalized_jsd, reverse_kl
from mgsr_lightning.seeding import derive_seeds, row_generators

# Per-position divergences with p = teacher, q = student: KL(p‖q), KL(q‖p), JSD with mixture ½(p+q).
DIFFERENCES = {
    "forward_kl": forward_kl,
    "reverse_kl": reverse_kl,
    "jsd": partial(generalized_jsd, beta=0.5),
}


@dataclass
class ScrgConfig:
    """Sequence correction and re-generation.

    Args:
        n_corrections: correction rounds per sequence; each later one only after the previous
            position. 0 turns SCRG off (the paper's ablation: 0, 1, 3, 5; default 1).
        difference: the per-position "semantic cognitive difference": ``forward_kl`` KL(p_teacher‖q_student),
            ``reverse_kl`` KL(q‖p) or ``jsd`` (β = 0.5).
        teacher_token: the teacher's token per position: its ``argmax``, or a ``sample`` from its
            distribution (T = 1, unfiltered).
    """

    n_corrections: int = 1
    difference: Literal["forward_kl", "reverse_kl", "jsd"] = "forward_kl"
    teacher_token: Literal["argmax", "sample"] = "argmax"

    def __post_init__(self) -> None:
        if self.n_corrections < 0:
            raise ValueError(f"n_corrections must be >= 0, got {self.n_corrections}")
        if self.difference not in DIFFERENCES:
            raise ValueError(f"difference must be one of {sorted(DIFFERENCES)}, got {self.difference!r}")
        if self.teacher_token not in ("argmax", "sample"):
            raise ValueError(f"teacher_token must be 'argmax' or 'sample', got {self.teacher_token!r}")


@dataclass
class ErrorPositions:
    """Result of the pure scoring step, one entry per row."""

    positions: Tensor  # [B] long, response index j of the error (0 where has_error is False)
    teacher_tokens: Tensor  # [B] long, the teacher's token at j
    has_error: Tensor  # [B] bool
    scores: Tensor  # [B, R] float, the per-position difference (for diagnostics/tests)


@dataclass
class ScrgResult:
    """The revised rollout, the teacher logits over it when they were computed, and diagnostics."""

    rollout: Rollout
    # Teacher response logits [B, R, V] (``response_logits``) of the final sequence when the last
    # scoring round left every row unchanged, else None; the caller reuses them for its losses.
    teacher_logits: Tensor | None
    stats: dict[str, float] = field(default_factory=dict)


def find_error_positions(
    teacher_logits: Tensor,
    student_logits: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    *,
    start: Tensor | None = None,
    difference: str = "forward_kl",
    teacher_token: str = "argmax",
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
) -> ErrorPositions:
    """Pick each row's error position: the largest difference among positions where the teacher disagrees.

    Args:
        teacher_logits, student_logits: [B, R, V], aligned with the response: [:, r] predicts
            response_ids[:, r] (see ``generation.response_logits``), already cut to the shared vocabulary.
        response_ids: [B, R] the student's tokens.
        response_mask: [B, R] bool, real response tokens incl. the ending EOS (which can be an error:
            the teacher may want to go on).
        start: [B] long or None; only positions >= start[b] are candidates (later corrections).
        difference: ``forward_kl``, ``reverse_kl`` or ``jsd`` (see ``ScrgConfig``).
        teacher_token: ``argmax`` or ``sample`` (T = 1).
        generator: for ``sample``: one generator for the whole batch, or one per row, in which case
            row b draws only for its real positions from ``generator[b]`` (independent of the batch).

    Ties in the difference go to the earliest position. Rows with no candidate get has_error False.
    """
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(
            f"teacher logits {tuple(teacher_logits.shape)} and student logits {tuple(student_logits.shape)} differ; "
            "cut both to the shared tokenizer vocabulary (vocab_size) first"
        )
    batch_size, response_width = response_ids.shape
    response_mask = response_mask.bool()
    scores = DIFFERENCES[difference](student_logits, teacher_logits, response_mask, reduction="none")  # [B, R]
    if response_width == 0:  # no response tokens at all (e.g. a zero length budget): nothing to correct
        nothing = torch.zeros(batch_size, dtype=torch.long, device=response_ids.device)
        return ErrorPositions(nothing, teacher_tokens=nothing.clone(), has_error=nothing.bool(), scores=scores)

    teacher_choice = _teacher_tokens(teacher_logits, response_ids, response_mask, teacher_token, generator)  # [B, R]
    candidates = response_mask & (teacher_choice != response_ids)  # [B, R]
    if start is not None:
        columns = torch.arange(response_width, device=response_ids.device)
        candidates &= columns[None, :] >= start[:, None]
    has_error = candidates.any(-1)  # [B]
    positions = scores.float().masked_fill(~candidates, float("-inf")).argmax(-1)  # [B]
    positions = torch.where(has_error, positions, torch.zeros_like(positions))
    teacher_tokens = teacher_choice.gather(1, positions[:, None]).squeeze(1)  # [B]
    return ErrorPositions(positions=positions, teacher_tokens=teacher_tokens, has_error=has_error, scores=scores)


def _teacher_tokens(
    teacher_logits: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
    teacher_token: str,
    generator: torch.Generator | Sequence[torch.Generator] | None,
) -> Tensor:
    """[B, R] the teacher's token per position; at padding it copies response_ids (never a candidate)."""
    if teacher_token == "argmax":
        return teacher_logits.argmax(-1)
    probs = teacher_logits.float().softmax(-1)  # [B, R, V]
    choice = response_ids.clone()
    if generator is None or isinstance(generator, torch.Generator):
        drawn = torch.multinomial(probs.flatten(0, 1), 1, generator=generator).view_as(response_ids)
        return torch.where(response_mask, drawn, choice)
    # Drawing only at a row's real positions keeps its draws the same whatever the batch's width.
    for row, row_generator in enumerate(generator):
        real = response_mask[row]
        if real.any():
            choice[row, real] = torch.multinomial(probs[row, real], 1, generator=row_generator).squeeze(-1)
    return choice


@torch.no_grad()
def revise(
    student: nn.Module,
    teacher: nn.Module,
    rollout: Rollout,
    config: ScrgConfig,
    decoding: Decoding,
    *,
    seeds: Tensor | None = None,
) -> ScrgResult:
    """Correct each rollout up to ``config.n_corrections`` times and let the student re-generate.

    Per round: one teacher and one student forward (eval mode, no grad) over ``rollout.model_inputs()``,
    ``find_error_positions`` from each row's previous correction on, then for the rows with an
    error: keep response[:j], write the teacher's token at j, and unless it is an EOS or the
    length budget is spent, re-generate the rest with one batched ``sample`` call over those rows.
    Rows with no candidate keep their tokens. The loop ends early when a round changes no row.

    Args:
        student, teacher: causal LMs sharing the tokenizer; their train/eval modes are restored.
        rollout: the sequences to revise (student samples, or any prompts + responses).
        config: rounds, difference and teacher-token rule.
        decoding: the re-generation's decoding: sampling, response budget (``max_new_tokens``),
            special ids, vocabulary cut (also applied before scoring), length cap; with ``synced``
            every rank of the process group runs the same number of forwards (a round ends only
            when no rank has an error; re-generation runs on every rank), as FSDP needs.
        seeds: [B] int64 row seeds; re-generation and teacher sampling use ``derive_seeds`` of
            them, so each row's result is independent of the batch. None: global torch RNG.

    Returns:
        ``ScrgResult`` with the revised rollout (prompts unchanged), the teacher's response logits
        [B, R, V] of the final sequence when the last round computed them on it, and stats: ``corrected_fraction`` (rows
        corrected at least once), ``mean_error_position`` (mean j over all corrections, 0.0 if none),
        ``mean_regenerated_tokens`` (student tokens re-generated per corrected row) and ``seconds``.
    """
    started = time.perf_counter()
    batch_size, device = rollout.batch_size, rollout.device
    if seeds is not None:
        seeds = seeds.to(device)  # indexed by rows of the rollout below
    start = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B] first position open to correction
    corrected = torch.zeros(batch_size, dtype=torch.bool, device=device)
    regenerated_tokens = torch.zeros(batch_size, dtype=torch.long, device=device)
    error_position_sum, n_errors = 0, 0
    final_teacher_logits = None

    with eval_mode(student, teacher):
        for round_index in range(config.n_corrections):
            teacher_logits = response_logits(teacher, rollout, decoding.vocab_size)  # [B, R, V]
            student_logits = response_logits(student, rollout, decoding.vocab_size)
            teacher_generators = None
            if config.teacher_token == "sample" and seeds is not None:
                teacher_generators = row_generators(derive_seeds(seeds, round_index, "teacher_token"), device)
            errors = find_error_positions(
                teacher_logits,
                student_logits,
                rollout.response_ids,
                rollout.response_mask,
                start=start,
                difference=config.difference,
                teacher_token=config.teacher_token,
                generator=teacher_generators,
            )
            if not any_rank(errors.has_error.any(), decoding.synced):
                final_teacher_logits = teacher_logits
                break
            round_seeds = derive_seeds(seeds, round_index, "regenerate") if seeds is not None else None
            rollout, regenerated = _correct_and_regenerate(student, rollout, errors, decoding, round_seeds)
            corrected |= errors.has_error
            regenerated_tokens += regenerated
            error_position_sum += int(errors.positions[errors.has_error].sum())
            n_errors += int(errors.has_error.sum())
            start = torch.where(errors.has_error, errors.positions + 1, start)

    n_corrected = int(corrected.sum())
    stats = {
        "corrected_fraction": n_corrected / batch_size if batch_size else 0.0,
        "mean_error_position": error_position_sum / n_errors if n_errors else 0.0,
        "mean_regenerated_tokens": int(regenerated_tokens.sum()) / n_corrected if n_corrected else 0.0,
        "seconds": time.perf_counter() - started,
    }
    return ScrgResult(rollout=rollout, teacher_logits=final_teacher_logits, stats=stats)


def _correct_and_regenerate(
    student: nn.Module,
    rollout: Rollout,
    errors: ErrorPositions,
    decoding: Decoding,
    seeds: Tensor | None,
) -> tuple[Rollout, Tensor]:
    """Write the teacher token at each error, drop what follows, re-generate; returns (rollout, [B] new tokens)."""
    pad_token_id, synced = decoding.pad_token_id, decoding.synced
    batch_size, response_width = rollout.response_ids.shape
    device = rollout.device
    columns = torch.arange(response_width, device=device)[None, :]  # [1, R]
    error_at = errors.positions[:, None]  # [B, 1]
    has_error = errors.has_error[:, None]

    # Corrected rows keep response[:j] and the teacher token at j; other rows keep everything.
    keep = rollout.response_mask & (~has_error | (columns <= error_at))  # [B, R]
    prefix_ids = torch.where(has_error & (columns == error_at), errors.teacher_tokens[:, None], rollout.response_ids)
    prefix_ids = prefix_ids.masked_fill(~keep, pad_token_id)  # [B, R]

    # The budget the rollout was sampled under: max_new_tokens response tokens, max_length in all.
    prompt_lengths = rollout.prompt_lengths()
    length_caps = prompt_lengths + decoding.sampling.max_new_tokens  # [B] most prompt + response tokens
    if decoding.max_length is not None:
        length_caps = length_caps.clamp_max(decoding.max_length)
    needs_regeneration = (
        errors.has_error
        & ~torch.isin(errors.teacher_tokens, token_id_tensor(decoding.eos_token_id, device))
        & (prompt_lengths + keep.sum(-1) < length_caps)
    )  # [B]

    continuation_ids = rollout.response_ids.new_full((batch_size, 0), pad_token_id)  # [B, C]
    continuation_mask = keep.new_zeros(batch_size, 0)
    if any_rank(needs_regeneration.any(), synced):
        # Synced: every row takes part (the others with no budget) so that all ranks run the same forwards.
        rows = torch.arange(batch_size, device=device) if synced else needs_regeneration.nonzero().squeeze(-1)  # [N]
        contexts_end = prompt_lengths + keep.sum(-1)
        caps = torch.where(needs_regeneration, length_caps, contexts_end)[rows]
        # The new prompts (prompt + corrected prefix) differ in length: re-left-pad them.
        context_ids, context_mask = pack_tokens(
            torch.cat([rollout.prompt_ids, prefix_ids], dim=1)[rows],
            torch.cat([rollout.prompt_mask, keep], dim=1)[rows],
            pad_token_id=pad_token_id,
            side="left",
        )  # [N, L], L = the longest prompt + corrected prefix
        continuation = sample(
            student, context_ids, context_mask, decoding, seeds=seeds[rows] if seeds is not None else None, max_length=caps
        )
        continuation_ids = continuation_ids.new_full((batch_size, continuation.response_ids.size(1)), pad_token_id)
        continuation_mask = continuation_mask.new_zeros(batch_size, continuation.response_ids.size(1))
        continuation_ids[rows] = continuation.response_ids
        continuation_mask[rows] = continuation.response_mask

    response_ids, response_mask = pack_tokens(
        torch.cat([prefix_ids, continuation_ids], dim=1),
        torch.cat([keep, continuation_mask], dim=1),
        pad_token_id=pad_token_id,
        side="right",
    )  # [B, R'], R' = the longest revised response
    revised = Rollout(rollout.prompt_ids, rollout.prompt_mask, response_ids, response_mask)
    return revised, continuation_mask.sum(-1)
