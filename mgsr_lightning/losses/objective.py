"""The training objective: which loss terms a method sums, with what weights, as one callable.

    loss = sft_weight · L_SFT  +  distill.weight · L_distill  +  minillm.weight · L_MiniLLM  +  span.weight · L_span

- ``sft``: cross-entropy on the ground-truth response (``sft_on: ground_truth``, the default: never
  on the student's own text) or on the training sequences (``training_sequence``: SeqKD);
- ``distill``: a divergence of :mod:`mgsr_lightning.losses.divergences`, or DAC-KL with its ClipNet,
  over the training sequences' response tokens; across tokenizers (the teacher's logits over its own
  tokens), over the aligned token groups instead (:mod:`mgsr_lightning.losses.cross_tokenizer`);
- ``minillm``: MiniLLM's policy-gradient reverse KL on sampled responses (:mod:`mgsr_lightning.losses.minillm`);
- ``span``: span-level correlation (:mod:`mgsr_lightning.losses.span_correlation`) inside the spans
  the span prior finds in the training sequences.

The configs below are the module's ``distill`` and ``span`` init args.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from mgsr_lightning.batch import Rollout
from mgsr_lightning.losses.cross_tokenizer import AlignedGroups, exact_match_loss, uld_loss
from mgsr_lightning.losses.dac_kl import ClipNet, dac_kl
from mgsr_lightning.losses.divergences import DIVERGENCES
from mgsr_lightning.losses.gradient_ratio import gradient_norm_ratio
from mgsr_lightning.losses.minillm import MiniLLMConfig, minillm_loss
from mgsr_lightning.losses.span_correlation import span_correlation_loss, span_pair_mask

DistillLossName = Literal[
    "forward_kl", "reverse_kl", "symmetric_kl", "skew_forward_kl", "skew_reverse_kl",
    "generalized_jsd", "total_variation", "abkd", "alpha_beta", "dac_kl",
]


@dataclass
class DistillLoss:
    """The token-level distillation term, computed on the training sequences' response tokens.

    Args:
        name: ``forward_kl``, ``reverse_kl``, ``symmetric_kl``, ``skew_forward_kl``, ``skew_reverse_kl``,
            ``generalized_jsd``, ``total_variation``, ``abkd`` (the α-β divergence) or ``dac_kl``
            (see :mod:`mgsr_lightning.losses`).
        weight: Weight of the term in the total loss.
        temperature: Both logits are divided by it before the softmax.
        params: Extra keyword arguments of the loss function, e.g. ``{alpha: 0.1}`` for the skew KLs,
            ``{beta: 0.5}`` for ``generalized_jsd``, ``{lam: 0.9}`` for ``symmetric_kl``, ``{alpha: 0.2,
            beta: 0.7}`` for ``abkd``, or DAC-KL's ``{variant: rest, mode: learned, beta: 0.02, rho_min: 0.5,
            lam_cov: 10.0}`` (``variant: paper`` is the paper's renormalised reading).
        chunk_size: Tokens per chunk, bounding the loss's extra memory to O(chunk × V).
        clip_net: DAC-KL only: keyword arguments of :class:`mgsr_lightning.losses.ClipNet`, the
            learnable sub-network that predicts the clipping bounds.
        clip_net_lr: DAC-KL only: learning rate of ClipNet's own optimizer parameter group.
        cross_tokenizer: Only when the teacher has its own tokenizer with another vocabulary: ``exact_match``
            (the default: ``name`` with ``params`` between the two sides' probabilities of the token strings
            both vocabularies hold, the rest as one entry) or ``uld`` (Universal Logit Distillation: the sorted
            probabilities' L1 distance; ``name`` and ``params`` are not used). Both compare aligned token
            groups (:mod:`mgsr_lightning.losses.cross_tokenizer`); ``chunk_size`` then counts groups.
    """

    name: DistillLossName = "forward_kl"
    weight: float = 1.0
    temperature: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    chunk_size: int | None = None
    clip_net: dict[str, Any] = field(default_factory=dict)
    clip_net_lr: float = 1e-3
    cross_tokenizer: Literal["exact_match", "uld"] = "exact_match"


@dataclass
class SpanLoss:
    """The span-level correlation term (0 weight = off).

    Args:
        weight: Weight of the term in the total loss.
        prior: ``tokens`` (data-free segmentation on token ids, the default) or ``spacy``
            (a linguistic chunker on decoded text; needs spaCy with an English model installed).
        relation: How adjacent distributions are related and compared: ``normalized`` (KL between
            the normalised Hadamard products, the default) or ``product`` (squared L2 between the
            raw products: the paper's reading, whose gradient is ~1e-5 of the distillation term's)
            or ``cosine`` (see :mod:`mgsr_lightning.losses.span_correlation`).
        chunk_size: Adjacent pairs per chunk, bounding the extra memory.
        grad_ratio_every: Every N training steps, log ``span/grad_ratio``: the norm of the span
            term's gradient on the student's logits over the distillation term's (0 = never).
    """

    weight: float = 0.0
    prior: Literal["tokens", "spacy"] = "tokens"
    relation: Literal["normalized", "product", "cosine"] = "normalized"
    chunk_size: int | None = None
    grad_ratio_every: int = 10


def build_clip_net(distill: DistillLoss | None) -> ClipNet | None:
    """DAC-KL's learnable bound predictor, or None when the distillation term has none to learn."""
    if distill is None or distill.name != "dac_kl" or distill.params.get("mode", "learned") != "learned":
        return None
    return ClipNet(**distill.clip_net)


def response_cross_entropy(logits: Tensor, sequences: Rollout) -> Tensor:
    """Mean cross-entropy over the real response tokens of ``sequences``.

    ``logits`` [B, R, V] are response-aligned (``response_logits``): [:, r] predicts ``response_ids[:, r]``.
    Prompt and padding never count; with no response token at all the result is 0, not NaN.
    """
    per_token = F.cross_entropy(logits.float().flatten(0, 1), sequences.response_ids.flatten(), reduction="none")
    mask = sequences.response_mask.flatten()
    return (per_token * mask).sum() / mask.sum().clamp_min(1)


class Objective:
    """``objective(...) -> (loss, metrics)``: the weighted sum of the configured terms and what to log.

    Args:
        sft_weight, sft_on, distill, span, minillm: the module's init args of the same names.
        clip_net: DAC-KL's ClipNet (``build_clip_net``), owned and optimised by the module.
        span_prior: token ids [B, R] and mask -> span ids [B, R] (:mod:`mgsr_lightning.spans.token_prior`);
            needed when the span term is on.
        shared_ids: Across tokenizers, the exact-match map ``(student_ids [S], teacher_ids [S])``: entry j of
            both is the same token string (:func:`mgsr_lightning.cross_tokenizer.shared_vocabulary`).
    """

    def __init__(
        self,
        sft_weight: float,
        sft_on: Literal["ground_truth", "training_sequence"],
        distill: DistillLoss | None,
        span: SpanLoss,
        clip_net: ClipNet | None = None,
        span_prior: Callable[[Tensor, Tensor], Tensor] | None = None,
        minillm: MiniLLMConfig | None = None,
    ):
        self.sft_weight, self.sft_on, self.distill, self.span = sft_weight, sft_on, distill, span
        self.minillm = minillm
        self.clip_net, self.span_prior = clip_net, span_prior
        self.shared_ids: tuple[Tensor, Tensor] | None = None

    @property
    def weights(self) -> dict[str, float]:
        return {
            "sft": self.sft_weight,
            "distill": self.distill.weight if self.distill is not None else 0.0,
            "minillm": self.minillm.weight if self.minillm is not None else 0.0,
            "span": self.span.weight,
        }

    @property
    def uses_teacher(self) -> bool:
        return self.distill is not None or self.minillm is not None or self.span.weight > 0

    @property
    def sft_on_ground_truth(self) -> bool:
        """The SFT term needs the student's logits over the ground truth, not the training sequences."""
        return self.sft_weight > 0 and self.sft_on == "ground_truth"

    def terms(
        self,
        sequences: Rollout,
        student_logits: Tensor,
        teacher_logits: Tensor | None,
        ground_truth: Rollout | None = None,
        ground_truth_logits: Tensor | None = None,
        measure_gradients: bool = False,
        groups: AlignedGroups | None = None,
    ) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Each named term, unweighted, and the terms' diagnostics.

        ``student_logits``/``teacher_logits`` [B, R, V] are over ``sequences``; ``ground_truth_logits``
        the student's over ``ground_truth`` when the SFT term reads it and it differs from ``sequences``.
        Across tokenizers ``teacher_logits`` [B, Rt, Vt] are over the teacher's own tokens and ``groups``
        aligns them with the student's; the distillation term compares the groups (the only teacher term
        that works across tokenizers).
        With ``measure_gradients`` (and both span and distillation terms on), the diagnostics hold
        ``span/grad_ratio``, measured on detached copies of the logits (no effect on training).
        """
        mask = sequences.response_mask
        terms: dict[str, Tensor] = {}
        diagnostics: dict[str, Any] = {}
        if self.sft_weight > 0:
            if ground_truth_logits is not None:
                terms["sft"] = response_cross_entropy(ground_truth_logits, ground_truth)
            else:
                terms["sft"] = response_cross_entropy(student_logits, sequences)
        if self.distill is not None and groups is not None:
            terms["distill"], distill_diagnostics = self._distill_across(student_logits, teacher_logits, groups)
            diagnostics |= distill_diagnostics
        elif self.distill is not None:
            terms["distill"], distill_diagnostics = self._distill(student_logits, teacher_logits, mask)
            diagnostics |= distill_diagnostics
        if self.minillm is not None:
            terms["minillm"], minillm_diagnostics = minillm_loss(
                student_logits, teacher_logits, sequences.response_ids, mask, self.minillm
            )
            diagnostics |= minillm_diagnostics
        if self.span.weight > 0:
            spans = self.span_prior(sequences.response_ids, mask)
            terms["span"] = self._span(student_logits, teacher_logits, mask, spans)
            diagnostics["span/pairs_per_row"] = span_pair_mask(spans, mask).sum(-1).float().mean()
            if measure_gradients and self.distill is not None:
                probe = student_logits.detach().requires_grad_()
                with torch.enable_grad():
                    span_term = self._span(probe, teacher_logits, mask, spans)
                    distill_term = self._distill(probe, teacher_logits, mask)[0]
                diagnostics["span/grad_ratio"] = gradient_norm_ratio(span_term, distill_term, [probe])
        return terms, diagnostics

    def _distill(self, student_logits: Tensor, teacher_logits: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, Any]]:
        d = self.distill
        common = dict(temperature=d.temperature, chunk_size=d.chunk_size)
        if d.name == "dac_kl":
            loss, dac_kl_diagnostics = dac_kl(
                student_logits, teacher_logits, mask, clip_net=self.clip_net, **common, **d.params
            )
            return loss, {f"dac_kl/{k}": v for k, v in dac_kl_diagnostics.items()}
        return DIVERGENCES[d.name](student_logits, teacher_logits, mask, **common, **d.params), {}

    def _distill_across(self, student_logits: Tensor, teacher_logits: Tensor,
                        groups: AlignedGroups) -> tuple[Tensor, dict[str, Any]]:
        d = self.distill
        common = dict(temperature=d.temperature, chunk_size=d.chunk_size)
        if d.cross_tokenizer == "uld":
            return uld_loss(student_logits, teacher_logits, groups, **common), {}
        if self.shared_ids is None:
            raise RuntimeError("exact_match across tokenizers needs the shared vocabulary (Objective.shared_ids)")
        student_ids, teacher_ids = (ids.to(student_logits.device) for ids in self.shared_ids)
        loss, diagnostics = exact_match_loss(student_logits, teacher_logits, groups, student_ids, teacher_ids,
                                             divergence=d.name, params=d.params, clip_net=self.clip_net, **common)
        return loss, {f"dac_kl/{k}": v for k, v in diagnostics.items()}

    def _span(self, student_logits: Tensor, teacher_logits: Tensor, mask: Tensor, spans: Tensor) -> Tensor:
        return span_correlation_loss(student_logits, teacher_logits, mask, spans=spans, relation=self.span.relation,
                                     chunk_size=self.span.chunk_size)

    def __call__(self, *args, **kwargs) -> tuple[Tensor, dict[str, Any]]:
        """The weighted sum of the terms, and ``train/<term>`` of each with the terms' diagnostics
        (arguments as for :meth:`terms`)."""
        terms, diagnostics = self.terms(*args, **kwargs)
        weights = self.weights
        loss = sum(weights[name] * value for name, value in terms.items())
        return loss, {f"train/{name}": value for name, value in terms.items()} | diagnostics
