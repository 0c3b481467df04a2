"""Distillation losses as pure functions of aligned logits.

Each loss is ``fn(student_logits [B, T, V], teacher_logits [B, T, V], mask [B, T] | None = None, *,
temperature=1.0, reduction="mean", chunk_size=None, **params)``; see ``divergences`` for the shared
conventions. ``DIVERGENCES`` maps each baseline's config name to its function. ``objective`` combines
the configured terms into the training loss. ``fused_head_loss`` computes the same terms from the
hidden states and the output head chunk by chunk, never holding whole [B, T, V] logits (``fused_head``).
"""

from mgsr_lightning.losses.dac_kl import ClipNet, dac_kl
from mgsr_lightning.losses.divergences import (
    DIVERGENCES,
    alpha_beta_divergence,
    forward_kl,
    generalized_jsd,
    reverse_kl,
    skew_forward_kl,
    skew_reverse_kl,
    symmetric_kl,
    total_variation,
)
from mgsr_lightning.losses.fused_head import CachedTeacher, TeacherHead, fused_head_loss
from mgsr_lightning.losses.fused_terms import cross_entropy_term, dac_kl_term, divergence_term, span_term
from mgsr_lightning.losses.gradient_ratio import gradient_norm_ratio
from mgsr_lightning.losses.objective import (
    DistillLoss,
    Objective,
    SpanLoss,
    build_clip_net,
    response_cross_entropy,
)
from mgsr_lightning.losses.span_correlation import span_correlation_loss, span_pair_mask

__all__ = [
    "DIVERGENCES",
    "CachedTeacher",
    "ClipNet",
    "DistillLoss",
    "Objective",
    "SpanLoss",
    "TeacherHead",
    "alpha_beta_divergence",
    "build_clip_net",
    "cross_entropy_term",
    "dac_kl",
    "dac_kl_term",
    "divergence_term",
    "forward_kl",
    "fused_head_loss",
    "generalized_jsd",
    "gradient_norm_ratio",
    "response_cross_entropy",
    "reverse_kl",
    "skew_forward_kl",
    "skew_reverse_kl",
    "span_correlation_loss",
    "span_pair_mask",
    "span_term",
    "symmetric_kl",
    "total_variation",
]
