"""DAC-KL, MGSR's token-level loss (distribution-adaptive clipping KL), and ClipNet, its learnable
sub-network ``f_sub`` (paper.md §3, §8.7–8.8). Why each choice below was made, what it was measured
against, and what it costs: docs/dac_kl.md.

At each compared position, with ``p = softmax(z_teacher / τ)`` and ``q = softmax(z_student / τ)``:

    π = argsort(p, descending)                 the only sort: one per [chunk, V] block
    p_(k) = p[π_k],  q_(k) = q[π_k]            the student gathered at the teacher's order, k = 1..V
    c_k = Σ_{r<k} p_(r)                        band coordinate: exclusive cumulative teacher mass
    (l, u) = ClipNet(p_(·))  or  fixed_bounds  0 ≤ l < u ≤ 1
    m_k = σ((c_k − l)/β) · σ((u − c_k)/β)      soft band, differentiable in l and u
    w_1 = 1 (the target class, the teacher's top-1),  w_k = m_k for k ≥ 2
    t_k = w_k p_(k),  s_k = w_k q_(k)          clipped teacher and student vectors

Two ways to make the clipped vectors probability vectors (``variant``):

    "rest" (default):  one more entry each, t_rest = Σ_k (1 − w_k) p_(k),  s_rest = Σ_k (1 − w_k) q_(k)
    "paper":           t ← t / Σt,  s ← s / Σs  (the paper's Eq. 7–8)

and then ``L_DAC = D_base(t ‖ s)``, the chosen base divergence (``base``, default ``forward_kl``:
``Σ_k t_k log(t_k / s_k)``, the paper's KL) applied entry by entry to the two vectors, with the base's
own parameters (``base_params``, e.g. ``{alpha: 0.1}`` for ``skew_forward_kl``). Any divergence of
:mod:`mgsr_lightning.losses.divergences` can be the base: each is a sum of per-entry terms
(``fn.terms``), so the band decides which entries are compared one by one, and the base how. With
"rest" the loss is a divergence whatever the base (zero with zero gradient iff the student matches the
teacher on every kept entry and on its total out-of-band mass); a band that keeps everything gives the
base divergence itself. "paper" compares the vectors only up to scale (docs/dac_kl.md).

The band ``c ∈ [l, u]`` is a contiguous block of the sorted teacher distribution: ``l > 0`` drops
the dominant head (which the target class adds back), ``u < 1`` drops the long tail. The alternative
reading, ``band="value_quantile"``, puts the band on the quantile level of each probability value
among the V' non-padded entries instead, ``c_k = (V' − k)/(V' − 1)`` (1 for the top-1, 0 for the
smallest), so that ``[l, u]`` keeps the entries whose value lies between the l- and u-quantiles.

Anti-collapse guard (not in the paper; on by default, ClipNet only): ClipNet minimises the same loss
as the student, and shrinking the band lowers it. So

    kept = Σ_{k≥2} m_k p_(k) / Σ_{k≥2} p_(k)     share of the clippable (non-target) teacher mass in the band
    coverage_penalty = relu(ρ_min − kept)        the loss gets + λ_cov · coverage_penalty
    at positions with kept < ρ_min the band enters L_DAC detached: there the bounds answer to the penalty only

and ClipNet's parametrisation keeps ``l ∈ (0, l_max)``, ``u ∈ (max(l, u_min), 1)`` with non-zero
gradients everywhere.

Cost: one sort of each row plus about ten elementwise passes more than the base. The "rest"
variant over forward KL, or over ``alpha_beta`` with α > 0 and β > 0, with a constant teacher (training)
sorts and runs ``RestKL`` (:mod:`mgsr_lightning.losses.dac_kl_backward`, the bases' terms in
:mod:`mgsr_lightning.losses.dac_kl_terms`) in blocks of rows, its backward written out, bf16 and fp16
teachers sorted on 16-bit keys; ``written_backward=False`` runs the taped formulas, the reference the
tests compare it with. Other bases and α-β's limits (β = 0, α = 0, α = −β, negative powers) run taped.
What each path costs against forward KL is measured by ``experiments/benchmarks/bench_dac_kl_cost.py``
(figures: docs/dac_kl.md, "Cost", "Ties", and ``experiments/results/speed/``). Real vocabularies want
``chunk_size``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mgsr_lightning.losses._common import PADDED_LOG_PROB, check_inputs, log_softmax_pair, reduce_positions
from mgsr_lightning.losses.dac_kl_backward import RestKL
from mgsr_lightning.losses.dac_kl_band import band_coordinate, log_out_of_band, sort_descending, sort_teacher
from mgsr_lightning.losses.dac_kl_terms import written_terms
from mgsr_lightning.losses.divergences import DIVERGENCES, check_terms_params

MODES = ("learned", "fixed")
VARIANTS = ("rest", "paper")
BANDS = ("mass", "value_quantile")
DIAGNOSTICS = ("kl", "coverage_penalty", "lower", "upper", "kept_mass")


class ClipNet(nn.Module):
    """``f_sub``: predicts the band ``(lower, upper)`` of each teacher distribution (paper.md §3.2, §8.8).

    Input: the teacher's probabilities sorted in descending order, [n, V]. Features: the top-k
    (zero-padded when V < k) and the tail mass beyond them, [n, k + 1]. Then
    ``Linear(k + 1, hidden) → GELU → Linear(hidden, 2) → (a, b)`` and

        lower = l_max · σ(a) ∈ (0, l_max)
        upper = f + (1 − f) · σ(b) ∈ (f, 1),  f = max(lower, u_min)

    so ``lower < upper`` by construction, and the bound clamps of the anti-collapse guard
    (``l < l_max``, ``u > u_min``) hold with non-zero gradients everywhere. The output layer starts
    with zero weights and a bias that gives ``init_bounds``, so an untrained ClipNet is the fixed
    band ``init_bounds`` at every position. The default (0.005, 0.98) keeps about 98% of the teacher's
    mass in the band from the first step (``l = l_max·σ(a)`` cannot be 0 itself). The earlier default
    (0.02, 0.9) kept only 25-36% of the non-target mass on Zipf-like teachers. Train it jointly with
    the student in its own optimizer
    parameter group (its own learning rate, e.g. 1e-3, no weight decay).
    """

    def __init__(
        self,
        k: int = 256,
        hidden: int = 256,
        l_max: float = 0.5,
        u_min: float = 0.6,
        init_bounds: tuple[float, float] = (0.005, 0.98),
    ):
        super().__init__()
        lower, upper = init_bounds
        if not (0 < l_max < 1 and 0 <= u_min < 1):
            raise ValueError(f"l_max must be in (0, 1) and u_min in [0, 1), got l_max={l_max}, u_min={u_min}")
        if not (0 < lower < l_max and max(lower, u_min) < upper < 1):
            raise ValueError(
                f"init_bounds must satisfy 0 < lower < l_max = {l_max} and max(lower, u_min = {u_min}) < upper < 1, "
                f"got {init_bounds}"
            )
        self.k = k
        self.l_max = l_max
        self.u_min = u_min
        self.mlp = nn.Sequential(nn.Linear(k + 1, hidden), nn.GELU(), nn.Linear(hidden, 2))
        output = self.mlp[-1]
        nn.init.zeros_(output.weight)
        with torch.no_grad():
            upper_floor = max(lower, u_min)
            output.bias.copy_(torch.tensor([_logit(lower / l_max), _logit((upper - upper_floor) / (1 - upper_floor))]))

    def forward(self, sorted_teacher_probs: Tensor) -> tuple[Tensor, Tensor]:
        """sorted_teacher_probs [n, V] (descending) -> (lower [n], upper [n]) in its dtype."""
        top = sorted_teacher_probs[:, : self.k]  # [n, min(k, V)]
        tail = sorted_teacher_probs[:, self.k :].sum(-1, keepdim=True)  # [n, 1]
        features = torch.cat([F.pad(top, (0, self.k - top.size(-1))), tail], dim=-1)  # [n, k + 1]
        a, b = self.mlp(features.to(self.mlp[0].weight.dtype)).to(sorted_teacher_probs.dtype).unbind(-1)
        lower = self.l_max * torch.sigmoid(a)
        upper_floor = lower.clamp(min=self.u_min)
        upper = upper_floor + (1 - upper_floor) * torch.sigmoid(b)
        return lower, upper


def _logit(x: float) -> float:
    return math.log(x / (1 - x))


def dac_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    *,
    clip_net: ClipNet | None = None,
    temperature: float = 1.0,
    reduction: str = "mean",
    mode: str = "learned",
    variant: str = "rest",
    fixed_bounds: tuple[float, float] = (0.0, 0.98),
    beta: float = 0.02,
    normalize: bool = True,
    band: str = "mass",
    target_class: bool = True,
    rho_min: float = 0.5,
    lam_cov: float = 10.0,
    base: str = "forward_kl",
    base_params: dict[str, float] | None = None,
    chunk_size: int | None = None,
    written_backward: bool = True,
    sixteen_bit_keys: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DAC-KL between teacher and student at the compared positions (formulas in the module docstring).

    Args:
        student_logits, teacher_logits: [B, T, V], aligned position by position.
        mask: [B, T] bool, the compared (response) positions; None compares all.
        clip_net: the ClipNet predicting ``(l, u)`` per position; required when ``mode="learned"``.
        temperature: τ, dividing both logits before the softmax.
        reduction: "mean" over compared positions, "sum", or "none" ([B, T], zeros outside the mask).
        mode: "learned" (ClipNet's bounds) or "fixed" (``fixed_bounds`` everywhere; the paper's
            Appendix D.1 baseline). The default fixed band (0, 0.98) is the top-0.98 nucleus.
        variant: "rest" (default: the out-of-band mass of each model as one extra entry, a proper
            divergence) or "paper" (the paper's clipped vectors renormalised); see module docstring.
        beta: softness of the band edges, in units of the band coordinate.
        normalize: must be True. "paper" renormalises the clipped vectors; "rest" needs no
            renormalisation (its vectors sum to 1). False, the paper's Eq. 8 as reported, is refused
            with a ValueError: it is not a divergence (non-zero gradient at q = p, negative minimum).
        band: "mass" (cumulative teacher mass, default) or "value_quantile" (see module docstring).
        target_class: keep the teacher's top-1 with weight 1 whatever the band (the paper's
            "target class"); with False the top-1 is in or out of the band like any other entry.
        rho_min, lam_cov: the coverage floor on ``kept_mass`` and the weight of its hinge penalty
            (learned mode only; ``lam_cov=0`` or ``rho_min=0`` turns the coverage guard off). The
            bound clamps are ClipNet's own ranges (``l_max``, ``u_min``).
        base: the divergence applied to the clipped vectors: any name of
            :data:`mgsr_lightning.losses.divergences.DIVERGENCES` (``forward_kl``, the paper's, by default;
            ``reverse_kl``, ``skew_forward_kl``, ``skew_reverse_kl``, ``generalized_jsd``,
            ``total_variation``, ``alpha_beta``, ...).
        base_params: that divergence's own parameters, e.g. ``{alpha: 0.1}`` or ``{alpha: 0.2, beta: 0.7}``.
        chunk_size: positions per chunk, bounding the extra memory to O(chunk_size·V) (about 25
            float32 [chunk_size, V] blocks); set it for real vocabularies (see Cost above).
        written_backward: run the "rest" variant over forward KL, or over ``alpha_beta`` with α > 0 and
            β > 0, with a constant teacher through ``RestKL``'s written-out backward (the default); False
            runs the taped formulas, the reference. Other bases and α-β's limit cases always run taped.
        sixteen_bit_keys: sort bf16 and fp16 teachers on 16-bit keys (the default); False sorts them as
            float32, the reference (:func:`mgsr_lightning.losses.dac_kl_band.sort_descending`).

    Returns:
        ``(loss, diagnostics)``: loss is L_DAC plus ``lam_cov · coverage_penalty`` in learned mode,
        reduced per ``reduction``. diagnostics holds detached means over compared positions:
        ``kl`` (L_DAC alone), ``coverage_penalty``, ``lower``, ``upper`` and ``kept_mass`` (the
        share of non-target teacher mass in the band). Log them every step.
    """
    check_inputs(student_logits, teacher_logits, mask, temperature, reduction, chunk_size)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if band not in BANDS:
        raise ValueError(f"band must be one of {BANDS}, got {band!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if not normalize:
        raise ValueError(
            "normalize=False (the unnormalised Eq. 8) is not a divergence: its gradient at student == teacher is "
            'not zero and its minimum is negative. Use variant="rest" (the default, a proper divergence that also '
            'sees the student\'s mass outside the band) or variant="paper" with normalize=True'
        )
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if mode == "learned" and clip_net is None:
        raise ValueError('mode="learned" needs a clip_net (a ClipNet); use mode="fixed" for constant bounds')
    if mode == "fixed" and clip_net is not None:
        raise ValueError('mode="fixed" uses fixed_bounds; pass clip_net=None (or use mode="learned")')
    if mode == "fixed" and not 0 <= fixed_bounds[0] < fixed_bounds[1] <= 1:
        raise ValueError(f"fixed_bounds must satisfy 0 <= lower < upper <= 1, got {fixed_bounds}")
    if base not in DIVERGENCES:
        raise ValueError(f"base must be one of {', '.join(DIVERGENCES)}, got {base!r}")
    if base_params is not None and not isinstance(base_params, Mapping):
        raise ValueError(f"base_params must be a mapping of the base's parameters (e.g. {{alpha: 0.2, beta: 0.7}}) "
                         f"or left out, got {base_params!r}")
    base_params = dict(base_params or {})
    base_terms = DIVERGENCES[base].terms
    check_terms_params(base_terms, base_params)
    learned = mode == "learned"
    guarded = learned and lam_cov > 0 and rho_min > 0
    # the written backward: "rest" over forward KL, or over alpha_beta with α > 0 and β > 0 (dac_kl_terms)
    rest_terms = written_terms(base, base_params) if variant == "rest" and written_backward else None

    def divergence_terms(log_s: Tensor, log_t: Tensor) -> Tensor:  # D_base's per-entry terms, [n, m]
        return base_terms(log_s, log_t, **base_params)

    def row_fn(student_rows: Tensor, teacher_rows: Tensor) -> Tensor:  # [n, V], [n, V] -> [n, 1 + 5]
        if rest_terms is not None and not teacher_rows.requires_grad:
            return _rest_rows(student_rows, teacher_rows)
        student_log_probs, teacher_log_probs = log_softmax_pair(student_rows, teacher_rows, temperature)
        teacher_sorted, order = sort_descending(teacher_log_probs, teacher_rows, student_rows=student_rows,
                                                sixteen_bit_keys=sixteen_bit_keys)  # [n, V]
        student_sorted = student_log_probs.gather(-1, order)  # [n, V]
        teacher_sorted_probs = teacher_sorted.exp()
        lower, upper = bounds(teacher_sorted_probs)
        position = band_coordinate(band, teacher_sorted_probs, student_rows, teacher_rows) / beta  # c_k / β, [n, V]
        log_band = F.logsigmoid(position - (lower / beta)[:, None]) + F.logsigmoid((upper / beta)[:, None] - position)

        first_band_entry = 1 if target_class else 0
        clippable = teacher_sorted_probs[:, first_band_entry:].sum(-1)  # [n]
        in_band = (log_band[:, first_band_entry:].exp() * teacher_sorted_probs[:, first_band_entry:]).sum(-1)
        kept = torch.where(clippable > 0, in_band / clippable.clamp_min(torch.finfo(clippable.dtype).tiny), 1.0)
        if guarded:  # below the floor the bounds answer to the penalty only (same values, no KL gradient)
            log_band = torch.where((kept < rho_min)[:, None], log_band.detach(), log_band)

        log_weight = torch.cat([torch.zeros_like(log_band[:, :1]), log_band[:, 1:]], -1) if target_class else log_band
        teacher_clipped = log_weight + teacher_sorted  # log t_k, [n, V]
        student_clipped = log_weight + student_sorted  # log s_k, [n, V]
        if variant == "rest":  # log t_rest, log s_rest: entry V + 1, added as its own term (no [n, V + 1] copies)
            teacher_rest = log_out_of_band(log_weight, teacher_sorted)  # [n, 1]
            student_rest = log_out_of_band(log_weight, student_sorted)
            # no mass outside the band on either side: an empty entry, finite so that no base meets -inf − (-inf)
            empty = torch.isneginf(teacher_rest) & torch.isneginf(student_rest)
            rest = divergence_terms(student_rest.masked_fill(empty, PADDED_LOG_PROB),
                                    teacher_rest.masked_fill(empty, PADDED_LOG_PROB))
            kl = divergence_terms(student_clipped, teacher_clipped).sum(-1) + rest.squeeze(-1)  # [n]
        else:
            teacher_clipped = teacher_clipped - teacher_clipped.logsumexp(-1, keepdim=True)
            student_clipped = student_clipped - student_clipped.logsumexp(-1, keepdim=True)
            kl = divergence_terms(student_clipped, teacher_clipped).sum(-1)  # [n]
        return _row_values(kl, kept, lower, upper)

    def _rest_rows(student_rows: Tensor, teacher_rows: Tensor) -> Tensor:
        """The "rest" variant with the teacher constant: the same values through ``RestKL``'s own
        backward, the teacher's side sorted once without autograd (in blocks of rows)."""
        summary_k = getattr(clip_net, "k", student_rows.size(-1)) if learned else None
        teacher_sorted, order, real, summary = sort_teacher(student_rows, teacher_rows, temperature, band=band,
                                                            summary_k=summary_k, sixteen_bit_keys=sixteen_bit_keys)
        lower, upper = bounds(teacher_sorted if summary is None else summary)  # ClipNet: the top-k and tail mass
        kl, kept = RestKL.apply(
            student_rows, lower, upper, teacher_sorted, order, real, band, temperature, beta, target_class,
            rho_min if guarded else None, rest_terms,
        )
        return _row_values(kl, kept, lower, upper)

    def bounds(teacher_sorted_probs: Tensor) -> tuple[Tensor, Tensor]:  # [n, V] -> (lower [n], upper [n])
        if learned:
            return clip_net(teacher_sorted_probs)
        lower = teacher_sorted_probs.new_full(teacher_sorted_probs.shape[:1], fixed_bounds[0])
        return lower, teacher_sorted_probs.new_full(teacher_sorted_probs.shape[:1], fixed_bounds[1])

    def _row_values(kl: Tensor, kept: Tensor, lower: Tensor, upper: Tensor) -> Tensor:  # -> [n, 1 + 5]
        coverage_penalty = F.relu(rho_min - kept)
        objective = kl + lam_cov * coverage_penalty if guarded else kl
        diagnostics = [kl, coverage_penalty, lower, upper, kept]  # in the order of DIAGNOSTICS
        return torch.stack([objective, *(value.detach() for value in diagnostics)], -1)

    params = tuple(clip_net.parameters()) if learned else ()
    loss, diagnostics = reduce_positions(
        row_fn, student_logits, teacher_logits, mask, reduction=reduction, chunk_size=chunk_size, params=params
    )
    return loss, dict(zip(DIAGNOSTICS, diagnostics.unbind(0)))

