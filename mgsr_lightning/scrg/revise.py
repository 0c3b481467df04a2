"""SCRG: sequence correction and re-generation (MGSR, arXiv 2407.10068).

A student rollout is scored by one teacher and one student forward; among the response positions
where the teacher's token differs from the student's, a ``criterion`` picks the error. The response
is cut there, the teacher's token is written in its place, and the student re-generates the rest:

    prompt  y_0 … y_{j-1}  y_j  y_{j+1} …        rollout; j = the criterion's pick among {i: y_i ≠ t_i}
    prompt  y_0 … y_{j-1}  t_j  z_{j+1} …        revised: t_j from the teacher, z from the student

Criteria (``ScrgConfig.criterion``):

- ``max_difference`` (the paper's reading): j = argmax_i D_i, the largest "semantic cognitive
  difference" (a per-token divergence of the two distributions).
- ``first_unlikely`` (the library default): the earliest i with p_teacher(y_i | prefix) below
  ``unlikely_below``. The re-generated suffix then starts from a prefix the teacher accepts, whereas
  the largest divergence tends to sit late in a response that already went wrong much earlier.
- ``max_teacher_nll``: j = argmax_i −log p_teacher(y_i | prefix), the token the teacher finds least likely.

On the tiny pair, ``first_unlikely`` (p < 0.02) lowers the teacher's NLL of the revised rollouts more
than ``max_difference`` does (measured by ``experiments/probes/scrg_criteria.py``; the figures:
``experiments/results/scrg/criteria.txt``). ``revise`` reports that NLL before and after revision.

``find_error_positions`` (:mod:`mgsr_lightning.scrg.error_search`) is the pure scoring step on
response-aligned logits; ``revise`` runs the forwards, the corrections and one batched re-generation
per round.

Only ``max_difference`` reads the student's distribution. For the other criteria the first round runs no
student forward: the rollout's own decode state (``generation.decode.DecodeState``: its KV cache and the
sampled tokens' NLL) stands in for it. Re-generation (:mod:`mgsr_lightning.scrg.regeneration`) continues
from a student KV cache cut at each row's error (the rollout's, or the student scoring forward's when the
criterion ran one), so the kept prefix is never re-encoded; caches that cannot be realigned (sliding
windows, quantised, static) fall back to re-encoding it in the re-generation's one batched prefill, as do
later rounds without a scoring forward and ``reuse_cache=False``; all give the same tokens. The
teacher's logits over the final sequences, which the losses reuse, come the same way from its last
scoring forward: only the columns from the earliest corrected position on go through the teacher again
(``generation.scoring.response_logits_from_prefix``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from mgsr_lightning.batch import Rollout
from mgsr_lightning.distributed import any_rank
from mgsr_lightning.generation.decode import DecodeState, Decoding, eval_mode
from mgsr_lightning.generation.scoring import response_logits, response_logits_and_cache, response_logits_from_prefix
from mgsr_lightning.losses import response_cross_entropy
from mgsr_lightning.scrg.error_search import CRITERIA, DIFFERENCES, STUDENT_CRITERIA, find_error_positions
from mgsr_lightning.scrg.regeneration import correct_and_regenerate
from mgsr_lightning.seeding import derive_seeds, row_generators


@dataclass
class ScrgConfig:
    """Sequence correction and re-generation.

    Args:
        n_corrections: correction rounds per sequence; each later one only after the previous
            position. 0 turns SCRG off (the paper's ablation: 0, 1, 3, 5; default 1).
        criterion: which mismatched position is the error: ``first_unlikely`` (the earliest whose
            student token has teacher probability below ``unlikely_below``; the default),
            ``max_difference`` (the largest ``difference``; the paper's reading) or
            ``max_teacher_nll`` (the student token the teacher finds least likely).
        unlikely_below: ``first_unlikely``: teacher probability under which a student token is an error
            (0.02: over n_corrections 1, 3 and 5 the lowest teacher NLL after revision of 0.1, 0.02, 0.005).
        difference: ``max_difference``: the per-position "semantic cognitive difference":
            ``forward_kl`` KL(p_teacher‖q_student), ``reverse_kl`` KL(q‖p) or ``jsd`` (β = 0.5).
        teacher_token: the teacher's token per position: its ``argmax``, or a ``sample`` from its
            distribution (T = 1, unfiltered).
        reuse_cache: re-generate from a student KV cache cut at the error, the rollout's own or the student
            scoring forward's (default); False re-encodes prompt + kept prefix (same tokens, more compute).
        reuse_teacher_cache: when the last round changed rows, score the final sequences from the
            teacher's scoring cache, past the earliest error only, instead of a full teacher forward
            (default; logits equal up to float rounding). The cache is held through the
            re-generation: 2 · layers · hidden size values per token (~0.5 MB per token for a 7B
            teacher in bf16); False frees it and runs the full forward.
    """

    n_corrections: int = 1
    criterion: Literal["first_unlikely", "max_difference", "max_teacher_nll"] = "first_unlikely"
    unlikely_below: float = 0.02
    difference: Literal["forward_kl", "reverse_kl", "jsd"] = "forward_kl"
    teacher_token: Literal["argmax", "sample"] = "argmax"
    reuse_cache: bool = True
    reuse_teacher_cache: bool = True

    def __post_init__(self) -> None:
        if self.n_corrections < 0:
            raise ValueError(f"n_corrections must be >= 0, got {self.n_corrections}")
        if self.criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {list(CRITERIA)}, got {self.criterion!r}")
        if not 0.0 < self.unlikely_below <= 1.0:
            raise ValueError(f"unlikely_below is a probability in (0, 1], got {self.unlikely_below}")
        if self.difference not in DIFFERENCES:
            raise ValueError(f"difference must be one of {sorted(DIFFERENCES)}, got {self.difference!r}")
        if self.teacher_token not in ("argmax", "sample"):
            raise ValueError(f"teacher_token must be 'argmax' or 'sample', got {self.teacher_token!r}")


@dataclass
class ScrgResult:
    """The revised rollout, the teacher logits over it when they were computed, and diagnostics."""

    rollout: Rollout
    # Teacher response logits [B, R, V] (``response_logits``) over exactly the final sequences (None
    # only with n_corrections = 0); the caller reuses them for its losses.
    teacher_logits: Tensor | None
    stats: dict[str, float] = field(default_factory=dict)


@torch.no_grad()
def revise(
    student: nn.Module,
    teacher: nn.Module,
    rollout: Rollout,
    config: ScrgConfig,
    decoding: Decoding,
    *,
    seeds: Tensor | None = None,
    rollout_state: DecodeState | None = None,
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
        rollout_state: what sampling ``rollout`` computed (``sample(..., state=...)``); with a criterion that
            does not read the student, the first round uses it in place of a student forward.

    Returns:
        ``ScrgResult`` with the revised rollout (prompts unchanged), the teacher's response logits
        [B, R, V] over it (from the last scoring round, or one more teacher forward when that round
        changed a row) and stats: ``corrected_fraction`` (rows corrected at least once),
        ``mean_error_position`` (mean j over all corrections, 0.0 if none), ``mean_regenerated_tokens``
        (student tokens re-generated per corrected row), ``regenerated_tokens`` (re-generated response
        tokens of the whole batch, the extra decoding SCRG costs), ``unchanged_fraction`` (rows no round
        changed: 1 - corrected_fraction), ``teacher_nll_before`` / ``teacher_nll_after``
        (the teacher's mean NLL per real response token of the rollout and of the revised rollout),
        ``student_nll_before`` (the student's, on the rollout: from its scoring forward, or from
        ``rollout_state``; absent when neither was there) and ``seconds``. With n_corrections = 0
        nothing is scored: no NLL stats and no teacher logits.
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
    nll_stats: dict[str, float] = {}

    # The teacher's cache lets the final scoring skip the prompt and the prefix no row changed; in
    # lockstep (synced) mode every rank runs the plain forward, so all ranks run the same forwards.
    reuse_teacher_cache = config.reuse_teacher_cache and not decoding.synced
    teacher_cache, unchanged = None, 0
    with eval_mode(student, teacher):
        for round_index in range(config.n_corrections):
            teacher_cache = None
            if reuse_teacher_cache:
                # [B, R, V]
                teacher_logits, teacher_cache = response_logits_and_cache(teacher, rollout, decoding.vocab_size)
            else:
                teacher_logits = response_logits(teacher, rollout, decoding.vocab_size)  # [B, R, V]
            student_logits, student_cache = None, None
            if config.criterion in STUDENT_CRITERIA:
                if config.reuse_cache:
                    student_logits, student_cache = response_logits_and_cache(student, rollout, decoding.vocab_size)
                else:
                    student_logits = response_logits(student, rollout, decoding.vocab_size)
            elif round_index == 0 and rollout_state is not None and config.reuse_cache:
                student_cache = rollout_state.cache
            if round_index == 0:
                nll_stats["teacher_nll_before"] = float(response_cross_entropy(teacher_logits, rollout))
                if student_logits is not None:
                    nll_stats["student_nll_before"] = float(response_cross_entropy(student_logits, rollout))
                elif rollout_state is not None and rollout_state.token_nll is not None:
                    real = rollout.response_mask
                    nll_stats["student_nll_before"] = float(rollout_state.token_nll.sum() / real.sum().clamp_min(1))
            teacher_generators = None
            if config.teacher_token == "sample" and seeds is not None:
                teacher_generators = row_generators(derive_seeds(seeds, round_index, "teacher_token"), device)
            errors = find_error_positions(
                teacher_logits,
                student_logits,
                rollout.response_ids,
                rollout.response_mask,
                start=start,
                criterion=config.criterion,
                unlikely_below=config.unlikely_below,
                difference=config.difference,
                teacher_token=config.teacher_token,
                generator=teacher_generators,
            )
            if not any_rank(errors.has_error.any(), decoding.synced):
                final_teacher_logits = teacher_logits
                break
            round_seeds = derive_seeds(seeds, round_index, "regenerate") if seeds is not None else None
            rollout, regenerated = correct_and_regenerate(
                student, rollout, errors, decoding, round_seeds, student_cache
            )
            del student_cache, student_logits
            if rollout_state is not None:  # it described the rollout before this round's revision: free its cache
                rollout_state.cache, rollout_state = None, None
            corrected |= errors.has_error
            regenerated_tokens += regenerated
            error_positions = errors.positions[errors.has_error]  # [corrected rows of this round]
            error_position_sum += int(error_positions.sum())
            n_errors += error_positions.numel()
            start = torch.where(errors.has_error, errors.positions + 1, start)
            # response columns before the earliest error of this round are the same in every row
            unchanged = int(error_positions.min()) if error_positions.numel() else 0
        if config.n_corrections > 0 and final_teacher_logits is None:
            # The last round changed rows: score the final sequences once, here rather than again in the
            # caller, from the last scoring forward's cache where the sequences did not change.
            if teacher_cache is not None:
                final_teacher_logits = response_logits_from_prefix(
                    teacher, rollout, teacher_logits, teacher_cache, unchanged, decoding.vocab_size
                )
            if final_teacher_logits is None:
                final_teacher_logits = response_logits(teacher, rollout, decoding.vocab_size)
        del teacher_cache
    if final_teacher_logits is not None:
        nll_stats["teacher_nll_after"] = float(response_cross_entropy(final_teacher_logits, rollout))

    n_corrected = int(corrected.sum())
    stats = {
        "corrected_fraction": n_corrected / batch_size if batch_size else 0.0,
        "mean_error_position": error_position_sum / n_errors if n_errors else 0.0,
        "mean_regenerated_tokens": int(regenerated_tokens.sum()) / n_corrected if n_corrected else 0.0,
        "regenerated_tokens": float(regenerated_tokens.sum()),
        "unchanged_fraction": 1.0 - n_corrected / batch_size if batch_size else 1.0,
        **nll_stats,
        "seconds": time.perf_counter() - started,
    }
    return ScrgResult(rollout=rollout, teacher_logits=final_teacher_logits, stats=stats)
