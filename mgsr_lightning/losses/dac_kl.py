"""DAC-KL, MGSR's token-level loss (distribution-adaptive clipping KL), and ClipNet, its learnable
sub-network ``f_sub`` (paper.md §3, §8.7–8.8).

At each compared position, with ``p = softmax(z_teacher / τ)`` and ``q = softmax(z_student / τ)``:

    π = argsort(p, descending)                 the only sort: one per [chunk, V] block
    p_(k) = p[π_k],  q_(k) = q[π_k]            the student gathered at the teacher's order, k = 1..V
    c_k = Σ_{r<k} p_(r)                        band coordinate: exclusive cumulative teacher mass
    (l, u) = ClipNet(p_(·))  or  fixed_bounds  0 ≤ l < u ≤ 1
    m_k = σ((c_k − l)/β) · σ((u − c_k)/β)      soft band, differentiable in l and u
    w_1 = 1 (the target class, the teacher's top-1),  w_k = m_k for k ≥ 2
    t_k = w_k p_(k),  s_k = w_k q_(k)          clipped teacher and student vectors

Two ways to compare the clipped vectors (``variant``):

    "rest" (default):  t_rest = Σ_k (1 − w_k) p_(k),  s_rest = Σ_k (1 − w_k) q_(k)
                       L_DAC = Σ_k t_k log(t_k / s_k) + t_rest log(t_rest / s_rest)
    "paper":           t ← t / Σt,  s ← s / Σs,  L_DAC = Σ_k t_k log(t_k / s_k)

"rest" appends one aggregated entry holding the out-of-band mass of each model, so t and s are
probability vectors on V + 1 outcomes without renormalising: L_DAC is a KL divergence (≥ 0, zero iff
the student matches the teacher on every kept entry and on the total mass it puts outside the band),
and by the data-processing inequality it is at most the forward KL. The band still decides what the
student is asked to match entry by entry (the clipping); the mass outside it is matched in total,
not in shape. "paper" is the paper's Eq. 7–8 with renormalisation (paper.md §3.2): it compares the
two vectors only up to scale, so it sees the student's mass outside the band only through the
band's soft edges (weights down to σ((u − 1)/β)). Free student logits trained on it alone
(``experiments/probe_dac_kl.py``, V = 4,096, Zipf-like teacher) end, with a hard edge (β = 0.001,
band (0, 0.9)), at forward KL 1.77 with 39% of the student's mass past the teacher's 0.975
cumulative mass (the teacher has 2.5% there) while L_DAC reads 0; with the default soft edges Adam
still gets there, slowly (ClipNet from (0.02, 0.9): forward KL 0.037 after 600 steps). "rest"
reaches forward KL ≤ 0.008 with every fixed band, the hard edge included, and 0.002 with ClipNet
from the default (0.005, 0.98) (0.015 from the earlier (0.02, 0.9)). Eq. 8 without renormalisation
(``normalize=False``) is refused: it has a non-zero gradient at q = p and a negative minimum, so it
is not a divergence.

The band ``c ∈ [l, u]`` is a contiguous block of the sorted teacher distribution: ``l > 0`` drops
the dominant head (which the target class adds back), ``u < 1`` drops the long tail. The alternative
reading, ``band="value_quantile"``, puts the band on the quantile level of each probability value
among the V' non-padded entries instead, ``c_k = (V' − k)/(V' − 1)`` (1 for the top-1, 0 for the
smallest), so that ``[l, u]`` keeps the entries whose value lies between the l- and u-quantiles.

Anti-collapse guard (paper.md §3.3; not in the paper). ClipNet minimises the same loss as the
student, and shrinking the band lowers it: with "paper" an empty band leaves t = s = e_1 and
L_DAC = 0; with "rest" it leaves the binary KL between (p_(1), 1 − p_(1)) and (q_(1), 1 − q_(1)),
the smallest value any band gives (merging entries never raises a KL). The guard acts on ClipNet
only and is on by default:

    kept = Σ_{k≥2} m_k p_(k) / Σ_{k≥2} p_(k)     share of the clippable (non-target) teacher mass in the band
    coverage_penalty = relu(ρ_min − kept)        the loss gets + λ_cov · coverage_penalty
    at positions with kept < ρ_min the band enters L_DAC detached: there the bounds answer to the penalty only
    bound clamps: l ∈ (0, l_max), u ∈ (max(l, u_min), 1), built into ClipNet's parametrisation

Why this shape (measured by optimising ClipNet alone on fixed random logits, V = 64):
- ``kept`` is a share, not an absolute mass, so the floor can be met at confident positions too
  (with p_(1) = 0.9 no band holds 0.5 of the absolute mass outside the target class).
- A hinge, not a squared hinge: a squared hinge has zero slope at the floor and settles below it.
- ClipNet is shared by all positions, so the positions above the floor keep pulling the shared
  weights towards smaller bands. With λ_cov = 1 that pull won on peaked teachers (logit scale 3-5,
  L_DAC ≈ 2-6 nats) and kept fell to 0.23-0.38; detaching the band below the floor plus
  λ_cov = 10 held it (0.54-0.55 after 150 Adam steps). Raise λ_cov if the logged ``kept_mass``
  sits below ``rho_min``.
- Clamps as hard ``clamp()`` calls would zero the gradient outside the range, so a bound that had
  crossed a clamp could never be pushed back by the penalty; ClipNet's parametrisation keeps the
  ranges with non-zero gradients everywhere (``ClipNet(u_min=0)`` removes the u clamp).

Cost. One ``torch.sort`` of each [n, V] block (O(V log V) per row, plus an int64 index block twice
the size of a float32 block), one gather of the student at the sorted indices, and about ten more
[n, V] elementwise passes than forward KL for the band. The "rest" variant with a constant teacher
(training) runs ``_RestKL``, whose backward is written out (the formulas in its docstring) instead
of taped by autograd; ``WRITTEN_BACKWARD = False`` runs the taped reference, which tests compare it
with. Measured on CPU at V = 50,257, 512 positions, bf16 logits, one thread
(``experiments/bench_dac_kl_cost.py``): forward + backward 2.5-2.7 times ``forward_kl`` (the taped
version 4.6-4.7 times), of which the sort alone is 1.2 times ``forward_kl``: the sort plus the two
log-softmaxes and the KL that any DAC-KL computes already exceed 2 times on this CPU. On CPU most of
the rest is allocating fresh [n, V] blocks (page faults cost about as much as the arithmetic), which
is why ``_RestKL`` works in place where it can. Memory (``experiments/bench_loss_memory.py --tokens
2048 --losses forward_kl dac_kl dac_kl_taped --paths chunked``, chunk 512): 1.53 GiB beyond the
gradient, about 16 float32 [chunk, V] blocks (taped: 2.80 GiB, ~29 blocks; forward KL 0.87 GiB), so
real vocabularies want ``chunk_size``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from mgsr_lightning.losses._common import (
    PADDED_LOG_PROB,
    check_inputs,
    kl_terms,
    log_softmax,
    log_softmax_pair,
    reduce_positions,
)

MODES = ("learned", "fixed")
VARIANTS = ("rest", "paper")
BANDS = ("mass", "value_quantile")
DIAGNOSTICS = ("kl", "coverage_penalty", "lower", "upper", "kept_mass")
# The "rest" variant with a constant teacher (training) runs `_RestKL`, whose backward is written out;
# False (or a teacher that needs gradients) runs the same formulas with plain autograd, the reference.
WRITTEN_BACKWARD = True


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
    chunk_size: int | None = None,
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
        chunk_size: positions per chunk, bounding the extra memory to O(chunk_size·V) (about 25
            float32 [chunk_size, V] blocks); set it for real vocabularies (see Cost above).

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
    learned = mode == "learned"
    guarded = learned and lam_cov > 0 and rho_min > 0

    def row_fn(student_rows: Tensor, teacher_rows: Tensor) -> Tensor:  # [n, V], [n, V] -> [n, 1 + 5]
        if variant == "rest" and WRITTEN_BACKWARD and not teacher_rows.requires_grad:
            return _rest_rows(student_rows, teacher_rows)
        student_log_probs, teacher_log_probs = log_softmax_pair(student_rows, teacher_rows, temperature)
        teacher_sorted, order = teacher_log_probs.sort(dim=-1, descending=True)  # [n, V], [n, V] int64
        student_sorted = student_log_probs.gather(-1, order)  # [n, V]
        teacher_sorted_probs = teacher_sorted.exp()
        lower, upper = bounds(teacher_sorted_probs)
        position = _band_coordinate(band, teacher_sorted_probs, student_rows, teacher_rows) / beta  # c_k / β, [n, V]
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
            rest = kl_terms(_log_out_of_band(log_weight, teacher_sorted), _log_out_of_band(log_weight, student_sorted))
            kl = kl_terms(teacher_clipped, student_clipped).sum(-1) + rest.squeeze(-1)  # [n]
        else:
            teacher_clipped = teacher_clipped - teacher_clipped.logsumexp(-1, keepdim=True)
            student_clipped = student_clipped - student_clipped.logsumexp(-1, keepdim=True)
            kl = kl_terms(teacher_clipped, student_clipped).sum(-1)  # [n]
        return _row_values(kl, kept, lower, upper)

    def _rest_rows(student_rows: Tensor, teacher_rows: Tensor) -> Tensor:
        """The "rest" variant with the teacher constant: the same values through ``_RestKL``'s own
        backward, the teacher's side computed once without autograd."""
        with torch.no_grad():
            padded = torch.isneginf(student_rows) & torch.isneginf(teacher_rows)
            teacher_log_probs = log_softmax(teacher_rows, temperature).masked_fill_(padded, PADDED_LOG_PROB)
            teacher_sorted, order = teacher_log_probs.sort(dim=-1, descending=True)  # [n, V], [n, V] int64
            del teacher_log_probs
            teacher_sorted_probs = teacher_sorted.exp()
            coordinate = _band_coordinate(band, teacher_sorted_probs, student_rows, teacher_rows)  # c_k, [n, V]
        lower, upper = bounds(teacher_sorted_probs)
        kl, kept = _RestKL.apply(
            student_rows, lower, upper, teacher_sorted, teacher_sorted_probs, order, coordinate,
            temperature, beta, target_class, rho_min if guarded else None,
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


def _log_out_of_band(log_weight: Tensor, sorted_log_probs: Tensor) -> Tensor:
    """log Σ_k (1 − w_k)·prob_k, [n, 1]; -inf where the band keeps everything.

    Summed in probability space, with ``1 − w = −expm1(log w)`` exact near w = 1: the mass outside a
    band that keeps almost everything is a sum of small positive terms, not ``1 − Σ w·prob``.
    """
    rest = (-torch.expm1(log_weight) * sorted_log_probs.exp()).sum(-1, keepdim=True)
    return torch.where(rest > 0, rest.clamp_min(torch.finfo(rest.dtype).tiny).log(), float("-inf"))


def _band_coordinate(band: str, teacher_sorted_probs: Tensor, student_rows: Tensor, teacher_rows: Tensor) -> Tensor:
    """c_k for the sorted entries, [n, V]: exclusive cumulative mass, or the value-quantile level."""
    if band == "mass":
        return teacher_sorted_probs.cumsum(-1).sub_(teacher_sorted_probs)
    padded = torch.isneginf(student_rows) & torch.isneginf(teacher_rows)  # sorted last: their probability is 0
    real = (padded.size(-1) - padded.sum(-1, keepdim=True)).to(teacher_sorted_probs.dtype)  # V' [n, 1]
    rank = torch.arange(teacher_sorted_probs.size(-1), device=real.device, dtype=real.dtype)  # k − 1
    return (real - 1 - rank) / (real - 1).clamp_min(1)


class _RestKL(torch.autograd.Function):
    """L_DAC ("rest" variant) and ``kept`` per row, with the gradient written out instead of taped.

    Inputs: the student's logits [n, V] and the bounds ``lower``, ``upper`` [n] (differentiable);
    the teacher's side, constant: its sorted log-probabilities and probabilities, the sort ``order``
    and the band coordinate ``c`` [n, V]. With ``q`` the student's probabilities gathered in the
    teacher's order, ``a = (c − l)/β``, ``b = (u − c)/β``, the band ``m = σ(a)σ(b)``, the weight ``w``
    (``m`` with ``w_1 = 1`` for the target class) and ``r = t_rest / s_rest``:

        ∂L/∂z_k  = (q_k (1 − (1 − w_k) r) − w_k p_k) / τ        (zero where student = teacher)
        ∂L/∂w_k  = p_k log(p_k / q_k) − p_k (log r + 1) + r q_k  (k ≥ 2 with the target class)
        ∂w_k/∂l = −w_k σ(−a_k) / β,   ∂w_k/∂u = w_k σ(−b_k) / β

    and ``kept``'s own gradient to the bounds through ``m``. ``1 − w`` is summed as
    ``σ(−a) + σ(a)σ(−b)`` (two positive terms), exact where the band keeps almost everything. With
    ``guard_floor`` set, rows whose ``kept`` is below it pass no KL gradient to the bounds (the
    anti-collapse guard); the student's gradient is unchanged. It keeps eight float32 [n, V] blocks
    and the int64 sort order for backward; the taped version keeps about twice as many.
    """

    @staticmethod
    def forward(
        ctx, student_rows, lower, upper, teacher_sorted, teacher_probs, order, coordinate,
        temperature, beta, target_class, guard_floor,
    ):
        # Every [n, V] block is allocated once and then updated in place: on CPU a fresh block costs
        # about as much as the arithmetic on it (page faults), so fewer blocks is most of the speed.
        student_sorted = log_softmax(student_rows, temperature).gather(-1, order)  # log q, [n, V]
        student_probs = student_sorted.exp()
        sig_neg_a = torch.sub(coordinate, lower[:, None]).div_(beta)  # a = (c − l)/β, then σ(−a) in place
        sig_a = torch.sigmoid(sig_neg_a)
        sig_neg_a.neg_().sigmoid_()
        sig_neg_b = torch.sub(upper[:, None], coordinate).div_(beta)  # b = (u − c)/β, then σ(−b) in place
        band = torch.sigmoid(sig_neg_b).mul_(sig_a)  # m = σ(a)σ(b)
        sig_neg_b.neg_().sigmoid_()
        out_of_band = sig_a.mul_(sig_neg_b).add_(sig_neg_a)  # 1 − m = σ(−a) + σ(a)σ(−b), two positive terms
        first = 1 if target_class else 0
        kept_in_band = _row_dot(band[:, first:], teacher_probs[:, first:])
        clippable = teacher_probs[:, first:].sum(-1)
        kept = torch.where(clippable > 0, kept_in_band / clippable.clamp_min(torch.finfo(clippable.dtype).tiny), 1.0)
        if first:  # the target class: w_1 = 1, so m becomes w (kept above read m at k ≥ 2 only)
            band[:, 0] = 1
            out_of_band[:, 0] = 0
        weight = band
        # log(p / q) where p > 0
        log_ratio = torch.sub(teacher_sorted, student_sorted).masked_fill_(teacher_probs == 0, 0.0)
        del student_sorted
        weighted_teacher = weight * teacher_probs  # t_k = w_k p_k
        in_band = _row_dot(weighted_teacher, log_ratio)
        teacher_rest = _row_dot(out_of_band, teacher_probs)  # [n]
        student_rest = _row_dot(out_of_band, student_probs)
        rest_active = (teacher_rest > 0) & (student_rest > 0)
        rest = torch.where(teacher_rest > 0, teacher_rest * (teacher_rest.log() - student_rest.log()), 0.0)
        ratio = torch.where(rest_active, teacher_rest / student_rest.clamp_min(torch.finfo(student_rest.dtype).tiny), 0.0)
        ctx.save_for_backward(
            teacher_probs, student_probs, log_ratio, weight, weighted_teacher, out_of_band, sig_neg_a, sig_neg_b,
            order, ratio, rest_active, clippable, kept,
        )
        ctx.settings = (temperature, beta, first, guard_floor)
        ctx.student_dtype = student_rows.dtype
        return in_band + rest, kept

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_kl, grad_kept):
        (teacher_probs, student_probs, log_ratio, weight, weighted_teacher, out_of_band, sig_neg_a, sig_neg_b,
         order, ratio, rest_active, clippable, kept) = ctx.saved_tensors
        temperature, beta, first, guard_floor = ctx.settings
        grad_student = grad_lower = grad_upper = None
        if ctx.needs_input_grad[0]:  # q (1 − (1 − w) r) − w p, scaled, back in vocabulary order
            grad_sorted = torch.mul(out_of_band, -ratio[:, None]).add_(1).mul_(student_probs).sub_(weighted_teacher)
            grad_sorted.mul_((grad_kl / temperature)[:, None])
            grad_student = torch.empty_like(grad_sorted).scatter_(-1, order, grad_sorted).to(ctx.student_dtype)
            del grad_sorted
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            # ∂L/∂w = p log(p/q) − [rest] (p (log r + 1) − r q); saved blocks stay unchanged (gradcheck re-runs backward)
            log_rest_ratio = torch.where(rest_active, ratio.clamp_min(torch.finfo(ratio.dtype).tiny).log(), 0.0)
            rest_scale = torch.where(rest_active, log_rest_ratio + 1, 0.0)
            grad_weight = log_ratio * teacher_probs
            grad_weight.addcmul_(teacher_probs, -rest_scale[:, None]).addcmul_(student_probs, ratio[:, None])
            kl_scale = grad_kl if guard_floor is None else torch.where(kept < guard_floor, 0.0, grad_kl)
            kept_scale = torch.where(clippable > 0, grad_kept / clippable.clamp_min(torch.finfo(clippable.dtype).tiny), 0.0)
            # ∂(kl_scale·L + kept_scale·kept)/∂w at k ≥ first (kept reads m p there, which is w p)
            through = grad_weight.mul_(weight).mul_(kl_scale[:, None]).addcmul_(weighted_teacher, kept_scale[:, None])
            through[:, :first] = 0
            grad_lower = -_row_dot(through, sig_neg_a) / beta  # ∂w/∂l = −w σ(−a)/β
            grad_upper = _row_dot(through, sig_neg_b) / beta  # ∂w/∂u = w σ(−b)/β
        return grad_student, grad_lower, grad_upper, None, None, None, None, None, None, None, None


def _row_dot(x: Tensor, y: Tensor) -> Tensor:
    """Σ_v x[i, v] y[i, v] per row, [n, V] × [n, V] -> [n]."""
    return torch.linalg.vecdot(x, y, dim=-1)
