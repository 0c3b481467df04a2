"""The objective's terms through the fused head: ``Objective``'s loss from hidden states and output heads.

``fused_objective`` returns what ``Objective.__call__`` returns (the weighted sum and ``train/<term>`` with
the diagnostics) from the student's last hidden states and output head instead of its logits, never
holding a whole [B, R, V] tensor (:mod:`mgsr_lightning.losses.fused_head`). The terms are the same pure
losses (:mod:`mgsr_lightning.losses.fused_terms`): the ground-truth CE, any divergence or DAC-KL with its
ClipNet, and the span term. What it cannot fuse, it refuses: MiniLLM's policy gradient (it reads the
sampled tokens' whole-sequence returns) and the cross-tokenizer losses (they compare aligned groups of two
vocabularies); the module keeps the unfused path for those (``fused_objective_refusal``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from mgsr_lightning.batch import Rollout
from mgsr_lightning.losses.fused_head import Teacher, fused_head_loss
from mgsr_lightning.losses.fused_terms import cross_entropy_term, dac_kl_term, divergence_term, span_term
from mgsr_lightning.losses.objective import Objective
from mgsr_lightning.losses.span_correlation import span_pair_mask


def fused_objective_refusal(objective: Objective) -> str | None:
    """Why ``objective`` cannot go through the fused head, or None when it can."""
    if objective.minillm is not None:
        return "MiniLLM's policy-gradient term reads whole-sequence returns"
    if objective.shared_ids is not None:
        return "across tokenizers the distillation term compares aligned groups of two vocabularies"
    return None


def fused_objective(
    objective: Objective,
    sequences: Rollout,
    student_hidden: Tensor,
    student_head: Tensor,
    teacher: Teacher | None,
    *,
    student_bias: Tensor | None = None,
    vocab_size: int | None = None,
    ground_truth: Rollout | None = None,
    ground_truth_hidden: Tensor | None = None,
    measure_gradients: bool = False,
    chunk_size: int = 128,
) -> tuple[Tensor, dict[str, Any]]:
    """``objective(sequences, student_logits, teacher_logits, ground_truth, ground_truth_logits, measure)``
    with every logit computed chunk by chunk from hidden states.

    Args:
        sequences: the step's training sequences.
        student_hidden: [B, R, H] the student's last hidden states, [:, r] predicting ``sequences.response_ids[:,
            r]`` (``response_hidden_states``); ``student_head`` [V', H] and ``student_bias`` [V'] | None its head.
        teacher: the teacher's side over ``sequences`` (``TeacherHead``, ``CachedTeacher`` or ``LogitsTeacher``),
            or None when no term reads it.
        vocab_size: V, the shared vocabulary (the head's first V rows).
        ground_truth, ground_truth_hidden: the ground truth and the student's [B, Rg, H] over it, when the SFT
            term reads the ground truth and it is not ``sequences``.
        measure_gradients: also report ``span/grad_ratio`` (the span term's gradient norm on the student's
            logits over the distillation term's), as the unfused objective does.
        chunk_size: positions per fused chunk.

    Returns:
        ``(loss, metrics)`` as ``Objective.__call__``: ``train/<term>`` unweighted, ``dac_kl/<diagnostic>``,
        ``span/pairs_per_row`` (and ``span/grad_ratio``).
    """
    refusal = fused_objective_refusal(objective)
    if refusal is not None:
        raise ValueError(f"this objective cannot be fused: {refusal}")
    mask = sequences.response_mask
    weights = objective.weights
    terms: dict[str, tuple[float, Any]] = {}
    diagnostics: dict[str, Any] = {}
    separate_sft = objective.sft_weight > 0 and ground_truth_hidden is not None
    if objective.sft_weight > 0 and not separate_sft:
        terms["sft"] = (weights["sft"], cross_entropy_term(sequences.response_ids, mask))
    d = objective.distill
    if d is not None:
        if d.name == "dac_kl":
            distill = dac_kl_term(mask, clip_net=objective.clip_net, temperature=d.temperature,
                                  chunk_size=d.chunk_size, **d.params)
        else:
            distill = divergence_term(d.name, mask, temperature=d.temperature, chunk_size=d.chunk_size, **d.params)
        terms["distill"] = (weights["distill"], distill)
    if objective.span.weight > 0:
        spans = objective.span_prior(sequences.response_ids, mask)
        terms["span"] = (weights["span"], span_term(spans, mask, relation=objective.span.relation,
                                                     chunk_size=objective.span.chunk_size))
        diagnostics["span/pairs_per_row"] = span_pair_mask(spans, mask).sum(-1).float().mean()
    ratio = ("span", "distill") if measure_gradients and "span" in terms and "distill" in terms else None
    common = dict(student_bias=student_bias, vocab_size=vocab_size, chunk_size=chunk_size)
    loss, values = fused_head_loss(student_hidden, student_head, terms, teacher, gradient_ratio=ratio, **common)
    if separate_sft:
        sft_terms = {"sft": (weights["sft"], cross_entropy_term(ground_truth.response_ids, ground_truth.response_mask))}
        sft_loss, sft_values = fused_head_loss(ground_truth_hidden, student_head, sft_terms, None, **common)
        loss, values = loss + sft_loss, values | sft_values
    metrics = {f"train/{name}": values[name] for name in ("sft", "distill", "span") if name in values}
    prefix = "distill/"
    metrics |= {f"dac_kl/{key[len(prefix):]}": value for key, value in values.items() if key.startswith(prefix)}
    if ratio is not None:
        diagnostics["span/grad_ratio"] = values["span/distill gradient ratio"]
    return loss, metrics | diagnostics
