"""Distillation losses between a teacher and a student with different tokenizers, over aligned token groups.

The two sides tokenise the same text differently, so positions cannot be compared one by one. The
alignment (:mod:`mgsr_lightning.cross_tokenizer.alignment`) cuts the text where both tokenizations
cut and numbers the pieces in text order: group ``g`` is a run of consecutive student tokens and a run
of consecutive teacher tokens that spell the same characters; one token on each side is a one-to-one
group, anything else many-to-many. The losses here only see tensors (:class:`AlignedGroups`), never a
tokenizer.

**A group's distribution** (TRL GOLD's reading; Boizard et al. 2024 compare positions directly). For
a group of tokens ``y_1 .. y_n`` on one side, with ``P(· | prefix)`` that side's softmax(logits / τ)
at the position predicting ``y_1``:

    g(v) = P(y_1 = v | prefix) · c,      c = Π_{i=2..n} P(y_i | prefix, y_1, .., y_{i-1})   (the observed tokens)

``g(y_1)`` is the chain-rule probability of the whole group; for other ``v`` it reuses the observed
continuation probability, a known bias for counterfactual first tokens (the model was never asked how it
would continue after ``v``). ``Σ_v g(v) = c ≤ 1``; one-token groups have ``c = 1``.

**ULD** (:func:`uld_loss`, Universal Logit Distillation): per compared group, the Wasserstein-1
distance between the two sides' ``g`` under uniform cost, which is the L1 distance of the values sorted
in descending order, the smaller vocabulary zero-padded to the larger:

    ULD = Σ_k | g_s(k) − g_t(k) |,   g_(k) the k-th largest value, 0 beyond the vocabulary's size

**Exact match** (:func:`exact_match_loss`): the group's own text is one entry on both sides, the ``S``
token strings both vocabularies hold (a map ``student_shared_ids [S] ↔ teacher_shared_ids [S]``,
:mod:`mgsr_lightning.cross_tokenizer.vocabulary_map`) are compared entry by entry, and everything else is
one "rest" entry per side. With ``o`` the side's observed first token of the group:

    x_s = ( g_s(o_s),  g_s(student_shared_ids[0]), .., g_s(student_shared_ids[S−1]),  rest_s ),
          shared entry j set to 0 where its string is o_s or o_t,   rest_s = 1 − (the other entries)
    x_t  likewise on the teacher side;   loss = D(x_t ‖ x_s)

``x`` is a probability vector over ``S + 2`` outcomes ("the group's text", "the group starts with shared
token j, the observed first token of neither side, and continues as observed", and "anything else"), so
``D`` is any divergence of :data:`mgsr_lightning.losses.divergences.DIVERGENCES` or DAC-KL, applied
unchanged. The rest entry is ``c · (mass of the other first tokens) + (1 − c)``, written in log space.

Why the group's text is its own entry: where the two sides cut a group differently, their first tokens are
different strings (the student's one token "Bulen" against the teacher's "B", "ul", "en"), and "starts
with shared token j and continues as observed" is not the same event on both sides. Matched by string, the
teacher's probability of the whole name would land on the student's "B" (a start the student continues
otherwise) and the student's "Bulen" in its rest entry, so the loss would push the right token down; on
facts' test answers one group in ten is cut differently, among them most names. With the observed text as
one entry, both sides give the probability of the same characters; a shared string that is the other side's
first token (the student's "B" where the teacher starts "B", "ul", "en" and the student "Bulen") would again
be two different events, so it goes to the rest on both sides. Where the first tokens are the same string
(every one-to-one group), the entry is only moved, so nothing changes for divergences that sum over entries
(all of them, and DAC-KL, which orders the entries by the teacher's probability).

Why one "rest" entry and not ULD for the unmatched mass: (1) the loss stays one divergence between two
distributions, zero iff they agree on every shared string and on the total unshared mass, with no second
term whose weight against the first is a free parameter (GOLD weighs its ULD part by the share of the
vocabulary that matched); (2) ULD's sorting pairs unrelated tokens by rank, which is the weakest signal
and costs a sort over V; (3) it is DAC-KL's own "rest" variant, so DAC-KL's band and any base divergence
apply as they are; (4) with the same tokenizer on both sides every string is shared, every group is one
token, the rest entry is empty on both sides, and the loss is exactly the same-tokenizer loss.

Shapes: ``B`` batch, ``Ts``/``Tt`` student/teacher positions, ``Vs``/``Vt`` vocabularies, ``G`` groups
per row, ``P`` compared groups, ``S`` shared strings. Logits are position-aligned with the ids of their
own side: ``logits[:, t]`` is the distribution of ``ids[:, t]`` (response logits). Computation in
float32 (float64 stays float64); ``-inf`` logits are zero probabilities, and entries with zero
probability on both sides contribute nothing with finite gradients. "mean" averages over compared groups
(0 when there are none), "sum" adds, "none" returns [B, G] with zeros at groups not compared. Memory: each
side's first-token log-probabilities are a [P, V] block; ``chunk_size`` groups at a time under activation
checkpointing bound it to [chunk_size, V] (:func:`per_group_chunks`), for real vocabularies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from mgsr_lightning.losses._common import check_options, log_softmax
from mgsr_lightning.losses.dac_kl import DIAGNOSTICS as DAC_KL_DIAGNOSTICS
from mgsr_lightning.losses.dac_kl import ClipNet, dac_kl
from mgsr_lightning.losses.divergences import DIVERGENCES

EXACT_MATCH_DIVERGENCES = (*DIVERGENCES, "dac_kl")


@dataclass(frozen=True)
class AlignedGroups:
    """Which tokens of each side make up each aligned group.

    student_ids [B, Ts], teacher_ids [B, Tt]: the token ids (long), position-aligned with the logits.
    student_groups [B, Ts], teacher_groups [B, Tt]: the group (long, in [0, G)) of each token, −1 for a
    token in no compared group (special, padding, a group cut by truncation). A group's tokens are
    consecutive on each side.
    group_mask [B, G] bool: the groups to compare (both sides have tokens in them).
    """

    student_ids: Tensor
    student_groups: Tensor
    teacher_ids: Tensor
    teacher_groups: Tensor
    group_mask: Tensor

    @property
    def num_groups(self) -> int:
        return self.group_mask.size(1)

    def masked(self, keep: Tensor) -> AlignedGroups:
        """The same groups with only those where ``keep`` [B, G] is True compared (e.g. the response)."""
        return replace(self, group_mask=self.group_mask & keep)


def group_log_probs(logits: Tensor, ids: Tensor, groups: Tensor, rows: Tensor, num_groups: int,
                    temperature: float) -> tuple[Tensor, Tensor]:
    """One side's group distributions at the compared groups (module docstring: ``log g = log P(y_1 = ·) + log c``).

    logits [B, T, V], ids [B, T], groups [B, T] (−1 = none), rows [P]: flat group indices ``b·G + g``.
    Returns ``(first_log_probs [P, V], log_continuation [P], first_ids [P])``: the log-probabilities at each
    group's first token, the summed log-probability of the group's other (observed) tokens, float32, and the
    observed first token's id. Only the rows of ``rows``' groups are read.
    """
    batch, length = groups.shape
    selected = torch.zeros(batch * num_groups + 1, dtype=torch.bool, device=groups.device)
    selected[rows] = True
    key = torch.arange(batch, device=groups.device)[:, None] * num_groups + groups  # [B, T] flat group index
    in_group = (groups >= 0) & selected[key.where(groups >= 0, batch * num_groups)]  # the last entry: False
    previous = torch.cat([groups.new_full((batch, 1), -1), groups[:, :-1]], 1)
    first = in_group & (groups != previous)  # [B, T]
    position = torch.arange(batch * length, device=groups.device).view(batch, length)  # flat b·T + t
    first_position = groups.new_zeros(batch * num_groups).index_put_((key[first],), position[first])
    flat_logits = logits.reshape(batch * length, -1)
    first_log_probs = log_softmax(flat_logits[first_position[rows]], temperature)  # [P, V]

    later = in_group & ~first  # [B, T]: tokens after a group's first
    later_logits = flat_logits[position[later]]  # [Q, V]
    later_log_probs = log_softmax(later_logits, temperature).gather(-1, ids[later][:, None]).squeeze(-1)  # [Q]
    continuation = first_log_probs.new_zeros(batch * num_groups).index_add(0, key[later], later_log_probs)
    return first_log_probs, continuation[rows], ids.reshape(-1)[first_position[rows]]


def uld_loss(student_logits: Tensor, teacher_logits: Tensor, groups: AlignedGroups, *, temperature: float = 1.0,
             reduction: str = "mean", chunk_size: int | None = None) -> Tensor:
    """Universal Logit Distillation over aligned groups (module docstring): the sorted-probability L1
    (Wasserstein-1) distance between the two sides' group distributions, zero-padding the smaller vocabulary.

    student_logits [B, Ts, Vs], teacher_logits [B, Tt, Vt] -> [] ("mean", "sum") or [B, G] ("none").
    ``chunk_size``: compared groups per chunk (see :func:`per_group_chunks`).
    """
    rows = _check(student_logits, teacher_logits, groups, temperature, reduction, chunk_size)

    def distances(chunk_rows: Tensor) -> Tensor:  # [n] -> [n]
        student = _sorted_group_probs(student_logits, groups.student_ids, groups.student_groups, chunk_rows, groups,
                                      temperature)
        teacher = _sorted_group_probs(teacher_logits, groups.teacher_ids, groups.teacher_groups, chunk_rows, groups,
                                      temperature)
        shorter, longer = sorted((student, teacher), key=lambda probs: probs.size(-1))
        common = shorter.size(-1)
        # beyond the smaller vocabulary the padded side is 0: |0 − g| = g
        return (shorter - longer[:, :common]).abs().sum(-1) + longer[:, common:].sum(-1)

    return _reduce(per_group_chunks(distances, rows, chunk_size), rows, groups.group_mask, reduction)


def _sorted_group_probs(logits: Tensor, ids: Tensor, token_groups: Tensor, rows: Tensor, groups: AlignedGroups,
                        temperature: float) -> Tensor:
    """g at each compared group in descending order, [P, V]."""
    first_log_probs, continuation, _ = group_log_probs(logits, ids, token_groups, rows, groups.num_groups, temperature)
    return (first_log_probs.sort(-1, descending=True).values + continuation[:, None]).exp()


def per_group_chunks(values_fn: Callable[[Tensor], Tensor], rows: Tensor, chunk_size: int | None) -> Tensor:
    """``values_fn(rows) -> [P, ...]``, run ``chunk_size`` groups at a time under activation checkpointing:
    each chunk's [chunk, V] intermediates are freed after its forward and recomputed in the backward, so
    the extra memory is O(chunk_size · V) instead of O(P · V), for about one more forward of the loss."""
    if chunk_size is None or rows.numel() <= chunk_size:
        return values_fn(rows)
    return torch.cat([checkpoint(values_fn, rows[start:start + chunk_size], use_reentrant=False)
                      for start in range(0, rows.numel(), chunk_size)])


def exact_match_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    groups: AlignedGroups,
    student_shared_ids: Tensor,
    teacher_shared_ids: Tensor,
    *,
    divergence: str = "forward_kl",
    params: dict[str, Any] | None = None,
    clip_net: ClipNet | None = None,
    temperature: float = 1.0,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """A registered divergence (or DAC-KL) between the two sides' group distributions projected on the
    shared strings plus one "rest" entry (module docstring).

    Args:
        student_logits, teacher_logits: [B, Ts, Vs], [B, Tt, Vt].
        groups: the alignment.
        student_shared_ids, teacher_shared_ids: [S] long, entry j of both is the same string; no id twice.
        divergence: a name of ``DIVERGENCES`` or ``"dac_kl"``; ``params`` its keyword arguments (for
            DAC-KL ``mode``, ``variant``, ``fixed_bounds``, ... and ``clip_net`` in learned mode).
        temperature: τ, dividing both logits before the softmax.
        reduction: "mean" over compared groups, "sum", or "none" ([B, G]).
        chunk_size: compared groups per chunk, projection and divergence together (:func:`per_group_chunks`).

    Returns:
        ``(loss, diagnostics)``: diagnostics are DAC-KL's means over compared groups (empty for the other
        divergences).
    """
    if divergence not in EXACT_MATCH_DIVERGENCES:
        raise ValueError(f"divergence must be one of {', '.join(EXACT_MATCH_DIVERGENCES)}, got {divergence!r}")
    reserved = {"temperature", "reduction", "chunk_size", "mask", "clip_net"} & set(params or {})
    if reserved:
        raise ValueError(f"params must not hold {sorted(reserved)}: they are exact_match_loss's own arguments")
    if student_shared_ids.dim() != 1 or student_shared_ids.shape != teacher_shared_ids.shape:
        raise ValueError(f"student_shared_ids {tuple(student_shared_ids.shape)} and teacher_shared_ids "
                         f"{tuple(teacher_shared_ids.shape)} must be [S] each")
    rows = _check(student_logits, teacher_logits, groups, temperature, reduction, chunk_size)
    params = dict(params or {})

    def values(chunk_rows: Tensor) -> Tensor:  # [n] -> [n, 1 + d]: the loss, then DAC-KL's diagnostics
        student = group_log_probs(student_logits, groups.student_ids, groups.student_groups, chunk_rows,
                                  groups.num_groups, temperature)
        teacher = group_log_probs(teacher_logits, groups.teacher_ids, groups.teacher_groups, chunk_rows,
                                  groups.num_groups, temperature)
        # a shared string that is either side's observed first token: in neither side's shared entries
        excluded = (student_shared_ids[None] == student[2][:, None]) | (teacher_shared_ids[None] == teacher[2][:, None])
        student = _text_shared_and_rest(*student, student_shared_ids, excluded)
        teacher = _text_shared_and_rest(*teacher, teacher_shared_ids, excluded)
        # the projected vectors are log-probabilities already: log_softmax leaves them as they are (τ applied above)
        if divergence != "dac_kl":
            return DIVERGENCES[divergence](student[None], teacher[None], reduction="none", **params)[0][:, None]
        loss, diagnostics = dac_kl(student[None], teacher[None], clip_net=clip_net, reduction="none", **params)
        means = torch.stack(list(diagnostics.values())) if diagnostics else loss.new_zeros(0)  # over the chunk
        return torch.cat([loss[0][:, None], means.expand(loss.size(1), -1)], 1)

    per_group = per_group_chunks(values, rows, chunk_size)  # [P, 1 + d]
    names = DAC_KL_DIAGNOSTICS if divergence == "dac_kl" else ()
    diagnostics = {name: per_group[:, 1 + i].detach().mean() if rows.numel() else per_group.new_zeros(())
                   for i, name in enumerate(names)}
    return _reduce(per_group[:, 0], rows, groups.group_mask, reduction), diagnostics


def _text_shared_and_rest(first_log_probs: Tensor, continuation: Tensor, first_ids: Tensor, shared_ids: Tensor,
                          excluded: Tensor) -> Tensor:
    """log x at each compared group, [P, S + 2]: the group's text, the shared strings' log g (−inf where
    ``excluded`` [P, S], the strings that are either side's observed first token), then log of the rest (every
    other first token, the excluded shared strings' included, and the unobserved continuations)."""
    observed = first_log_probs.gather(-1, first_ids[:, None]).squeeze(-1) + continuation  # [P]: the group's text
    others = first_log_probs.scatter(-1, first_ids[:, None], float("-inf"))  # [P, V]: the observed first token out
    shared = (others[:, shared_ids] + continuation[:, None]).masked_fill(excluded, float("-inf"))  # [P, S]
    kept = torch.zeros_like(others, dtype=torch.bool)
    kept[:, shared_ids] = ~excluded
    rest_first = others.masked_fill(kept, float("-inf"))  # [P, V]: the first tokens in the rest entry
    rest = _log_add(_log_sum_exp(rest_first) + continuation, _log_one_minus_exp(continuation))  # [P]
    return torch.cat([observed[:, None], shared, rest[:, None]], -1)


def _log_sum_exp(log_values: Tensor) -> Tensor:
    """logsumexp over the last dim, [n, V] -> [n]: −inf with zero gradient for all −inf rows (no NaN)."""
    empty = torch.isneginf(log_values).all(-1)
    total = torch.where(empty[:, None], 0.0, log_values).logsumexp(-1)
    return torch.where(empty, float("-inf"), total)


def _log_one_minus_exp(log_value: Tensor) -> Tensor:
    """log(1 − e^x) for x ≤ 0, [n]: −inf with zero gradient at x = 0 (a certain continuation)."""
    certain = log_value >= 0
    safe = torch.where(certain, -1.0, log_value)
    # log(−expm1(x)) is exact near 0, log1p(−e^x) far from it
    value = torch.where(safe > -0.6931, torch.log(-torch.expm1(safe)), torch.log1p(-torch.exp(safe)))
    return torch.where(certain, float("-inf"), value)


def _log_add(log_a: Tensor, log_b: Tensor) -> Tensor:
    """log(e^a + e^b), [n]: −inf with zero gradients where both are −inf."""
    empty = torch.isneginf(log_a) & torch.isneginf(log_b)
    total = torch.logaddexp(torch.where(empty, 0.0, log_a), torch.where(empty, 0.0, log_b))
    return torch.where(empty, float("-inf"), total)


def _check(student_logits: Tensor, teacher_logits: Tensor, groups: AlignedGroups, temperature: float,
           reduction: str, chunk_size: int | None) -> Tensor:
    """Validate the inputs; the compared groups' flat indices ``b·G + g``, [P] (one host sync)."""
    for side, logits, ids, token_groups in (
        ("student", student_logits, groups.student_ids, groups.student_groups),
        ("teacher", teacher_logits, groups.teacher_ids, groups.teacher_groups),
    ):
        if logits.dim() != 3 or ids.shape != logits.shape[:2] or token_groups.shape != ids.shape:
            raise ValueError(f"{side}_logits {tuple(logits.shape)} must be [B, T, V] with {side}_ids "
                             f"{tuple(ids.shape)} and {side}_groups {tuple(token_groups.shape)} both [B, T]")
    if student_logits.size(0) != teacher_logits.size(0) or groups.group_mask.size(0) != student_logits.size(0):
        raise ValueError("student, teacher and group_mask must have the same batch size")
    if groups.group_mask.dtype != torch.bool:
        raise ValueError(f"group_mask must be bool, got {groups.group_mask.dtype}")
    check_options(temperature, reduction, chunk_size, "groups")
    return groups.group_mask.reshape(-1).nonzero().squeeze(1)


def _reduce(values: Tensor, rows: Tensor, group_mask: Tensor, reduction: str) -> Tensor:
    """[P] per-group values -> the reduction over compared groups."""
    if reduction == "none":
        return values.new_zeros(group_mask.numel()).index_add(0, rows, values).view(group_mask.shape)
    total = values.sum()
    return total / max(rows.numel(), 1) if reduction == "mean" else total

