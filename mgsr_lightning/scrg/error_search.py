"""SCRG's error search: the pure scoring step that picks, per row, the response position to correct.

Given response-aligned teacher and student logits over a rollout, the candidates are the real
response positions where the teacher's token differs from the student's; a ``criterion`` picks one:

- ``max_difference`` (the paper's reading): the largest per-position divergence D_i between the two
  distributions (``difference``: forward KL, reverse KL or JSD);
- ``first_unlikely`` (the library default): the earliest candidate whose token the teacher gives
  probability below ``unlikely_below``;
- ``max_teacher_nll``: the candidate the teacher finds least likely.

No model runs here: :func:`mgsr_lightning.scrg.revise.revise` runs the forwards and the re-generation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from mgsr_lightning.losses import forward_kl, generalized_jsd, reverse_kl

# Per-position divergences with p = teacher, q = student: KL(p‖q), KL(q‖p), JSD with mixture ½(p+q).
DIFFERENCES = {
    "forward_kl": forward_kl,
    "reverse_kl": reverse_kl,
    "jsd": partial(generalized_jsd, beta=0.5),
}
CRITERIA = ("max_difference", "first_unlikely", "max_teacher_nll")
STUDENT_CRITERIA = ("max_difference",)  # the criteria that read the student's distribution
DEFAULT_CRITERION = "first_unlikely"
DEFAULT_UNLIKELY_BELOW = 0.02



@dataclass
class ErrorPositions:
    """Result of the pure scoring step, one entry per row."""

    positions: Tensor  # [B] long, response index j of the error (0 where has_error is False)
    teacher_tokens: Tensor  # [B] long, the teacher's token at j
    has_error: Tensor  # [B] bool
    scores: Tensor  # [B, R] float, the criterion's per-position score: D_i, or −log p_teacher(y_i) (diagnostics/tests)


def find_error_positions(
    teacher_logits: Tensor,
    student_logits: Tensor | None,
    response_ids: Tensor,
    response_mask: Tensor,
    *,
    start: Tensor | None = None,
    criterion: str = DEFAULT_CRITERION,
    unlikely_below: float = DEFAULT_UNLIKELY_BELOW,
    difference: str = "forward_kl",
    teacher_token: str = "argmax",
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
) -> ErrorPositions:
    """Pick each row's error position among the positions where the teacher's token differs from the student's.

    Args:
        teacher_logits, student_logits: [B, R, V], aligned with the response: [:, r] predicts
            response_ids[:, r] (see ``generation.scoring.response_logits``), already cut to the shared vocabulary;
            ``student_logits`` may be None for a criterion outside ``STUDENT_CRITERIA``.
        response_ids: [B, R] the student's tokens.
        response_mask: [B, R] bool, real response tokens incl. the ending EOS (which can be an error:
            the teacher may want to go on).
        start: [B] long or None; only positions >= start[b] are candidates (later corrections).
        criterion: ``first_unlikely`` (earliest with p_teacher(y_i) < ``unlikely_below``),
            ``max_difference`` (largest ``difference``) or ``max_teacher_nll``; defaults as ``revise.ScrgConfig``.
        unlikely_below: ``first_unlikely``'s probability threshold.
        difference: ``forward_kl``, ``reverse_kl`` or ``jsd`` (see ``revise.ScrgConfig``).
        teacher_token: ``argmax`` or ``sample`` (T = 1).
        generator: for ``sample``: one generator for the whole batch, or one per row, in which case
            row b draws only for its real positions from ``generator[b]`` (independent of the batch).

    Ties in the score go to the earliest position. Rows with no candidate get has_error False.
    """
    if student_logits is None and criterion in STUDENT_CRITERIA:
        raise ValueError(f"criterion {criterion!r} reads the student's distribution: pass student_logits")
    if student_logits is not None and teacher_logits.shape != student_logits.shape:
        raise ValueError(
            f"teacher logits {tuple(teacher_logits.shape)} and student logits {tuple(student_logits.shape)} differ; "
            "cut both to the shared tokenizer vocabulary (vocab_size) first"
        )
    batch_size, response_width = response_ids.shape
    response_mask = response_mask.bool()
    if criterion == "max_difference":
        scores = DIFFERENCES[difference](student_logits, teacher_logits, response_mask, reduction="none")  # [B, R]
    else:
        scores = token_nll(teacher_logits, response_ids).masked_fill(~response_mask, 0.0)  # [B, R]
    if response_width == 0:  # no response tokens at all (e.g. a zero length budget): nothing to correct
        nothing = torch.zeros(batch_size, dtype=torch.long, device=response_ids.device)
        return ErrorPositions(nothing, teacher_tokens=nothing.clone(), has_error=nothing.bool(), scores=scores)

    teacher_choice = _teacher_tokens(teacher_logits, response_ids, response_mask, teacher_token, generator)  # [B, R]
    candidates = response_mask & (teacher_choice != response_ids)  # [B, R]
    if start is not None:
        columns = torch.arange(response_width, device=response_ids.device)
        candidates &= columns[None, :] >= start[:, None]
    if criterion == "first_unlikely":
        candidates &= scores > -math.log(unlikely_below)
        scores_to_rank = candidates.float()  # argmax returns the first of equal maxima: the earliest candidate
    else:
        scores_to_rank = scores.float().masked_fill(~candidates, float("-inf"))
    has_error = candidates.any(-1)  # [B]
    positions = scores_to_rank.argmax(-1)  # [B]
    positions = torch.where(has_error, positions, torch.zeros_like(positions))
    teacher_tokens = teacher_choice.gather(1, positions[:, None]).squeeze(1)  # [B]
    return ErrorPositions(positions=positions, teacher_tokens=teacher_tokens, has_error=has_error, scores=scores)


def token_nll(logits: Tensor, token_ids: Tensor) -> Tensor:
    """[B, R] −log softmax(logits)[token]: each token's NLL under response-aligned logits [B, R, V], in float32."""
    logits = logits.float()
    return logits.logsumexp(-1) - logits.gather(-1, token_ids[..., None]).squeeze(-1)


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
