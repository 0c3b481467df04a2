"""DAC-KL and ClipNet: a float64 loop reference, fixed-mode behaviour, gradients to ClipNet,
chunking, the one-sort-per-chunk rule, the anti-collapse guard against the collapse it prevents, and
the "rest" variant as a divergence (zero with zero gradient at q = p; free student logits reach p)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from mgsr_lightning.losses import DIVERGENCES, ClipNet, dac_kl, forward_kl
from mgsr_lightning.losses.dac_kl import DIAGNOSTICS
from tests.losses.conftest import BoundClipNet, kl64, reference_divergence, written_and_taped

# every base divergence DAC-KL is run over in these tests, with its own parameters
BASES = [
    ("forward_kl", {}),
    ("reverse_kl", {}),
    ("skew_forward_kl", {"alpha": 0.1}),
    ("skew_reverse_kl", {"alpha": 0.1}),
    ("generalized_jsd", {"beta": 0.5}),
    ("total_variation", {}),
    ("alpha_beta", {"alpha": 0.2, "beta": 0.7}),
]
BASE_IDS = [name for name, _ in BASES]


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def dac_reference(p, q, lower, upper, *, beta, variant, band, target_class, base="forward_kl", base_params=None):
    """(L_DAC, kept) at one position, looping over the sorted vocabulary; p, q float lists; the base
    divergence on the clipped vectors from its textbook formula (``reference_divergence``)."""
    real = [v for v in range(len(p)) if not (p[v] == 0 and q[v] == 0)]  # padded entries have p = q = 0
    order = sorted(real, key=lambda v: -p[v])
    p_sorted, q_sorted = [p[v] for v in order], [q[v] for v in order]
    if band == "mass":
        coordinate = [sum(p_sorted[:k]) for k in range(len(order))]
    else:
        coordinate = [(len(order) - 1 - k) / (len(order) - 1) for k in range(len(order))]
    mask = [sigmoid((c - lower) / beta) * sigmoid((upper - c) / beta) for c in coordinate]
    weight = [1.0 if k == 0 and target_class else mask[k] for k in range(len(order))]
    t = [w * x for w, x in zip(weight, p_sorted)]
    s = [w * x for w, x in zip(weight, q_sorted)]
    if variant == "rest":  # one more entry: the mass outside the band
        t.append(sum((1 - w) * x for w, x in zip(weight, p_sorted)))
        s.append(sum((1 - w) * x for w, x in zip(weight, q_sorted)))
    else:
        t_total, s_total = sum(t), sum(s)
        t, s = [x / t_total for x in t], [x / s_total for x in s]
    loss = reference_divergence(base, base_params or {}, t, s, kl64)
    first = 1 if target_class else 0
    clippable = sum(p_sorted[first:])
    kept = sum(m * x for m, x in zip(mask[first:], p_sorted[first:])) / clippable if clippable > 0 else 1.0
    return loss, kept


@pytest.fixture
def reference(softmax_ref):
    def compute(student, teacher, mask, *, temperature, bounds, **options):
        """Per-position (loss, kept) [B][T] lists; bounds(b, t) -> (lower, upper)."""
        losses, kepts = [], []
        for b in range(student.size(0)):
            losses.append([])
            kepts.append([])
            for t in range(student.size(1)):
                p, q = softmax_ref(teacher[b, t], temperature), softmax_ref(student[b, t], temperature)
                loss, kept = dac_reference(p, q, *bounds(b, t), **options)
                losses[-1].append(loss)
                kepts[-1].append(kept)
        return torch.tensor(losses, dtype=torch.float64), torch.tensor(kepts, dtype=torch.float64)

    return compute


OPTIONS = [
    dict(variant="rest", band="mass", target_class=True),
    dict(variant="paper", band="mass", target_class=True),
    dict(variant="rest", band="mass", target_class=False),
    dict(variant="paper", band="mass", target_class=False),
    dict(variant="rest", band="value_quantile", target_class=True),
    dict(variant="paper", band="value_quantile", target_class=False),
]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum()


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("padded", [0, 4])
def test_fixed_mode_matches_float64_reference(options, padded, make_case, reference):
    student, teacher, mask = make_case(padded=padded)
    bounds = (0.1, 0.7)
    loss, diagnostics = dac_kl(
        student, teacher, mask, mode="fixed", fixed_bounds=bounds, beta=0.05, temperature=0.8, reduction="none",
        **options,
    )
    expected, kept = reference(student, teacher, mask, temperature=0.8, bounds=lambda b, t: bounds, beta=0.05,
                               **options)
    torch.testing.assert_close(loss.double(), expected * mask, rtol=1e-5, atol=1e-6)
    mean, _ = dac_kl(student, teacher, mask, mode="fixed", fixed_bounds=bounds, beta=0.05, temperature=0.8, **options)
    torch.testing.assert_close(mean.double(), masked_mean(expected, mask), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(diagnostics["kept_mass"].double(), masked_mean(kept, mask), rtol=1e-5, atol=1e-6)
    assert diagnostics["lower"].item() == pytest.approx(0.1) and diagnostics["upper"].item() == pytest.approx(0.7)
    coverage = masked_mean((0.5 - kept).clamp_min(0), mask).item()
    assert diagnostics["coverage_penalty"] == pytest.approx(coverage, abs=1e-6)


@pytest.mark.parametrize("padded", [0, 4])
def test_learned_mode_matches_reference_with_clipnet_bounds(padded, make_case, reference):
    student, teacher, mask = make_case(padded=padded)
    clip_net = ClipNet(k=8, hidden=16)
    torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.5)  # bounds that differ per position
    loss, diagnostics = dac_kl(student, teacher, mask, clip_net=clip_net, temperature=1.3, reduction="none")

    with torch.no_grad():  # the bounds ClipNet gives each position, computed independently
        probs = torch.softmax(teacher.double() / 1.3, -1).sort(-1, descending=True).values
        lower, upper = clip_net.double()(probs.flatten(0, 1))
        lower, upper = lower.view(mask.shape), upper.view(mask.shape)
    expected, kept = reference(
        student, teacher, mask, temperature=1.3, bounds=lambda b, t: (lower[b, t].item(), upper[b, t].item()),
        beta=0.02, variant="rest", band="mass", target_class=True,
    )
    penalty = (0.5 - kept).clamp_min(0)
    torch.testing.assert_close(loss.double(), (expected + 10.0 * penalty) * mask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(diagnostics["kl"].double(), masked_mean(expected, mask), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(diagnostics["lower"].double(), masked_mean(lower, mask), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(diagnostics["upper"].double(), masked_mean(upper, mask), rtol=1e-5, atol=1e-6)
    assert not any(value.requires_grad for value in diagnostics.values())


def test_bf16_inputs_are_computed_in_float32(make_case, reference):
    student, teacher, mask = make_case()
    student_bf16, teacher_bf16 = student.bfloat16(), teacher.bfloat16()
    loss, _ = dac_kl(student_bf16, teacher_bf16, mask, mode="fixed")
    assert loss.dtype == torch.float32
    expected, _ = reference(
        student_bf16.double(), teacher_bf16.double(), mask, temperature=1.0, bounds=lambda b, t: (0.0, 0.98),
        beta=0.02, variant="rest", band="mass", target_class=True,
    )
    torch.testing.assert_close(loss.double(), masked_mean(expected, mask), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ["rest", "paper"])
def test_band_covering_everything_is_forward_kl(variant, make_case):
    student, teacher, mask = make_case()
    loss, diagnostics = dac_kl(student, teacher, mask, mode="fixed", fixed_bounds=(0.0, 1.0), beta=1e-5,
                               variant=variant)
    torch.testing.assert_close(loss, forward_kl(student, teacher, mask), rtol=1e-5, atol=1e-6)
    assert diagnostics["kept_mass"] > 0.99


def test_empty_band_leaves_the_target_class_and_the_rest(make_case):
    student, teacher, mask = make_case()
    bounds = dict(mode="fixed", fixed_bounds=(0.0, 1e-6), beta=1e-5, reduction="none")
    paper, diagnostics = dac_kl(student, teacher, mask, variant="paper", **bounds)
    assert paper.abs().max() < 1e-6 and diagnostics["kept_mass"] < 1e-6
    rest, _ = dac_kl(student, teacher, mask, variant="rest", **bounds)
    p, q = torch.softmax(teacher.double(), -1), torch.softmax(student.double(), -1)
    top = p.argmax(-1, keepdim=True)
    p_top, q_top = p.gather(-1, top).squeeze(-1), q.gather(-1, top).squeeze(-1)
    binary_kl = p_top * (p_top / q_top).log() + (1 - p_top) * ((1 - p_top) / (1 - q_top)).log()
    torch.testing.assert_close(rest.double(), binary_kl * mask, rtol=1e-5, atol=1e-6)


def test_where_the_student_puts_its_out_of_band_mass(make_case):
    # "paper" ignores the student's mass outside the band; "rest" sees its total but not its shape
    student, teacher, _ = make_case(B=1, T=1, V=40)
    order = torch.softmax(teacher[0, 0], -1).argsort(descending=True)
    cumulative = torch.softmax(teacher[0, 0], -1)[order].cumsum(0)
    tail = order[cumulative > 0.75]  # well past u = 0.5
    moved = student.clone()
    moved[0, 0, tail] += 3.0
    shuffled = student.clone()
    shuffled[0, 0, tail] = student[0, 0, tail.flip(0)]
    options = dict(mode="fixed", fixed_bounds=(0.0, 0.5), beta=1e-3)
    paper = dac_kl(student, teacher, variant="paper", **options)[0]
    torch.testing.assert_close(dac_kl(moved, teacher, variant="paper", **options)[0], paper, rtol=1e-5, atol=1e-6)
    rest = dac_kl(student, teacher, variant="rest", **options)[0]
    assert (dac_kl(moved, teacher, variant="rest", **options)[0] - rest).abs() > 0.1
    torch.testing.assert_close(dac_kl(shuffled, teacher, variant="rest", **options)[0], rest, rtol=1e-5, atol=1e-6)
    assert (forward_kl(moved, teacher) - forward_kl(student, teacher)).abs() > 0.1


def test_unnormalized_eq8_is_refused_and_both_variants_are_non_negative(make_case):
    student, teacher, mask = make_case(B=4, T=8, V=16, scale=3.0)
    with pytest.raises(ValueError, match='normalize=False.*variant="rest"'):
        dac_kl(student, teacher, mask, mode="fixed", normalize=False)
    for variant in ("rest", "paper"):
        loss, _ = dac_kl(student, teacher, mask, mode="fixed", fixed_bounds=(0.1, 0.7), variant=variant,
                         reduction="none")
        assert (loss >= -1e-6).all()


def test_rest_is_at_most_forward_kl(make_case):
    # merging entries into one never raises a KL (data-processing inequality)
    student, teacher, mask = make_case(B=3, T=6, V=20, scale=3.0)
    for bounds in [(0.0, 0.5), (0.1, 0.7), (0.3, 0.98)]:
        loss, _ = dac_kl(student, teacher, mask, mode="fixed", fixed_bounds=bounds, reduction="none")
        assert (loss <= forward_kl(student, teacher, mask, reduction="none") + 1e-6).all()


@pytest.mark.parametrize("chunk_size", [None, 3])
@pytest.mark.parametrize("variant", ["rest", "paper"])
@pytest.mark.parametrize("mode", ["learned", "fixed"])
def test_zero_loss_and_zero_gradient_at_student_equal_teacher(mode, variant, chunk_size, make_case):
    _, teacher, mask = make_case(B=2, T=5, V=12, padded=3, dtype=torch.float64, scale=3.0)
    student = teacher.clone().requires_grad_(True)
    clip_net = ClipNet(k=8, hidden=16).double() if mode == "learned" else None
    if clip_net is not None:
        torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.5)
    parameters = [student, *(clip_net.parameters() if clip_net is not None else ())]
    loss, diagnostics = dac_kl(
        student, teacher, mask, clip_net=clip_net, mode=mode, variant=variant, lam_cov=0.0, chunk_size=chunk_size
    )
    assert loss.abs() < 1e-12 and diagnostics["kl"].abs() < 1e-12
    for grad in torch.autograd.grad(loss, parameters, allow_unused=True):
        assert grad is None or grad.abs().max() < 1e-12


def probe(teacher_logits, steps, **options):
    """Forward KL after Adam on free student logits (from uniform) with DAC-KL alone; ClipNet, if
    asked for with ``init_bounds``, trains jointly in its own parameter group."""
    student_logits = torch.zeros_like(teacher_logits, requires_grad=True)
    init_bounds = options.pop("init_bounds", None)
    clip_net = ClipNet(k=32, hidden=32, init_bounds=init_bounds) if init_bounds is not None else None
    groups = [{"params": [student_logits], "lr": 0.1}]
    if clip_net is not None:
        groups.append({"params": clip_net.parameters(), "lr": 1e-3})
    optimizer = torch.optim.Adam(groups)
    for _ in range(steps):
        loss, diagnostics = dac_kl(
            student_logits, teacher_logits, clip_net=clip_net, mode="learned" if clip_net else "fixed", **options
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return forward_kl(student_logits, teacher_logits).item(), diagnostics


def zipf_teacher(exponent, V=256, N=4, seed=0):
    """[1, N, V] logits of p_k ∝ k^(−exponent) over a random permutation of the vocabulary per row."""
    generator = torch.Generator().manual_seed(seed)
    log_probs = -exponent * torch.arange(1, V + 1, dtype=torch.float32).log()
    return torch.stack([log_probs[torch.randperm(V, generator=generator)] for _ in range(N)])[None]


@pytest.mark.parametrize("exponent", [1.1, 0.5], ids=["peaked", "flat"])
def test_free_student_logits_reach_the_teacher_with_the_default_loss(exponent):
    teacher = zipf_teacher(exponent)
    fixed_kl, _ = probe(teacher, 150)
    learned_kl, diagnostics = probe(teacher, 150, init_bounds=(0.005, 0.98))
    assert fixed_kl < 0.01 and learned_kl < 0.01
    assert diagnostics["kept_mass"] >= 0.5


def student_mass_past(teacher_logits, student_logits, start):
    """Mean student mass where the teacher's exclusive cumulative mass (teacher's order) is >= start."""
    p, q = teacher_logits.softmax(-1), student_logits.softmax(-1)
    sorted_p, order = p.sort(-1, descending=True)
    return ((q.gather(-1, order) * ((sorted_p.cumsum(-1) - sorted_p) >= start)).sum(-1)).mean().item()


def test_with_a_hard_band_edge_only_rest_sees_the_mass_outside_the_band():
    # band (0, 0.9) with a hard edge: past it the weights underflow, so "paper" reads ≈ 0 while the
    # student keeps most of its initial (uniform) mass there; "rest" matches that mass in total
    teacher = zipf_teacher(1.1)
    hard = dict(fixed_bounds=(0.0, 0.9), beta=1e-3)
    results = {}
    for variant in ("paper", "rest"):
        student_logits = torch.zeros_like(teacher, requires_grad=True)
        optimizer = torch.optim.Adam([student_logits], lr=0.1)
        for _ in range(150):
            loss, _ = dac_kl(student_logits, teacher, mode="fixed", variant=variant, **hard)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        fkl = forward_kl(student_logits, teacher).item()
        results[variant] = (loss.item(), fkl, student_mass_past(teacher, student_logits, 0.9))
    teacher_past = student_mass_past(teacher, teacher, 0.9)
    paper_loss, paper_fkl, paper_past = results["paper"]
    assert paper_loss < 1e-3 and paper_fkl > 0.5 and paper_past > 5 * teacher_past
    _, rest_fkl, rest_past = results["rest"]
    assert rest_fkl < 0.01 and abs(rest_past - teacher_past) < 0.01


def test_clipnet_bounds_start_at_init_bounds_and_stay_ordered():
    probs = torch.softmax(torch.randn(6, 50) * 3, -1).sort(-1, descending=True).values
    lower, upper = ClipNet(k=16, hidden=8)(probs)  # the default band keeps almost everything
    torch.testing.assert_close(lower, torch.full((6,), 0.005))
    torch.testing.assert_close(upper, torch.full((6,), 0.98))
    lower, upper = ClipNet(k=16, hidden=8, init_bounds=(0.05, 0.8))(probs)
    torch.testing.assert_close(lower, torch.full((6,), 0.05))
    torch.testing.assert_close(upper, torch.full((6,), 0.8))
    clip_net = ClipNet(k=16, hidden=8, l_max=0.4, u_min=0.6)
    for parameter in clip_net.parameters():
        torch.nn.init.normal_(parameter, std=3.0)
    lower, upper = clip_net(probs)  # saturated sigmoids reach the ends of the ranges in float32
    assert (lower >= 0).all() and (lower <= 0.4).all()
    assert (upper >= 0.6).all() and (upper <= 1).all() and (lower < upper).all()


def test_clipnet_works_when_the_vocabulary_is_smaller_than_k(make_case):
    student, teacher, mask = make_case(V=11)
    loss, diagnostics = dac_kl(student, teacher, mask, clip_net=ClipNet(k=256, hidden=16))
    assert torch.isfinite(loss) and 0 < diagnostics["kept_mass"] <= 1


@pytest.mark.parametrize("lam_cov", [0.0, 10.0])
def test_clipnet_gets_gradients_through_the_loss(lam_cov, make_case):
    student, teacher, mask = make_case()
    clip_net = ClipNet(k=8, hidden=16)
    loss, _ = dac_kl(student, teacher, mask, clip_net=clip_net, lam_cov=lam_cov)
    loss.backward()
    assert clip_net.mlp[-1].weight.grad.abs().sum() > 0  # from the KL alone when lam_cov = 0


@pytest.mark.parametrize("chunk_size", [1, 4, 100])
@pytest.mark.parametrize("variant", ["rest", "paper"])
@pytest.mark.parametrize("mode", ["learned", "fixed"])
def test_chunked_equals_unchunked(mode, variant, chunk_size, make_case):
    student, teacher, mask = make_case(B=3, T=7, V=13)
    student.requires_grad_(True)
    clip_net = ClipNet(k=8, hidden=16) if mode == "learned" else None
    if clip_net is not None:
        torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.5)
    parameters = [student, *(clip_net.parameters() if clip_net is not None else ())]
    options = dict(clip_net=clip_net, mode=mode, variant=variant, temperature=1.5)
    plain, plain_diagnostics = dac_kl(student, teacher, mask, **options)
    chunked, chunked_diagnostics = dac_kl(student, teacher, mask, chunk_size=chunk_size, **options)
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-6)
    for name in plain_diagnostics:
        torch.testing.assert_close(chunked_diagnostics[name], plain_diagnostics[name], rtol=1e-6, atol=1e-6)
    plain_grads, chunked_grads = torch.autograd.grad(plain, parameters), torch.autograd.grad(chunked, parameters)
    for plain_grad, chunked_grad in zip(plain_grads, chunked_grads):
        torch.testing.assert_close(chunked_grad, plain_grad, rtol=1e-5, atol=1e-7)


def test_gradcheck_float64_student_and_clipnet(make_case):
    student, teacher, mask = make_case(B=1, T=3, V=6, dtype=torch.float64)
    student.requires_grad_(True)
    clip_net = ClipNet(k=4, hidden=3).double()
    torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.5)
    names = [name for name, _ in clip_net.named_parameters()]
    weights = [p.detach().clone().requires_grad_(True) for p in clip_net.parameters()]

    def unguarded(s, *w):  # the true gradient; the guard drops the KL's gradient to the bounds on purpose
        return dac_kl(s, teacher, mask, clip_net=BoundClipNet(clip_net, dict(zip(names, w))), temperature=1.3, beta=0.1,
                      lam_cov=0.0)[0]

    def guarded(s):
        return dac_kl(s, teacher, mask, clip_net=clip_net, temperature=1.3, beta=0.1, rho_min=0.9)[0]

    assert torch.autograd.gradcheck(unguarded, (student, *weights))
    assert torch.autograd.gradcheck(guarded, (student,))



class _SortLog(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "sort":
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("chunk_size", "expected"), [(None, [(8, 13)]), (3, [(3, 13), (3, 13), (2, 13)])])
def test_one_sort_per_chunk_per_step(chunk_size, expected, make_case):
    student, teacher, _ = make_case(B=2, T=6, V=13)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[0, :5] = mask[1, 3:] = True  # 8 compared positions
    student.requires_grad_(True)
    clip_net = ClipNet(k=8, hidden=16)
    with _SortLog() as log:
        loss, _ = dac_kl(student, teacher, mask, clip_net=clip_net, chunk_size=chunk_size)
        loss.backward()
    assert log.shapes == expected


def test_guard_keeps_the_kept_mass_above_its_floor_and_without_it_the_band_collapses():
    # ClipNet alone minimises the loss on fixed, fairly peaked logits (L_DAC ≈ 2 nats).
    generator = torch.Generator().manual_seed(0)
    student = torch.randn(4, 16, 64, generator=generator) * 3
    teacher = torch.randn(4, 16, 64, generator=generator) * 3

    def optimise(clip_net, **options):
        optimizer = torch.optim.Adam(clip_net.parameters(), lr=1e-2)
        kept = []
        for _ in range(120):
            loss, diagnostics = dac_kl(student, teacher, clip_net=clip_net, **options)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            kept.append(diagnostics["kept_mass"].item())
        return kept, diagnostics

    torch.manual_seed(1)
    guarded, guarded_diagnostics = optimise(ClipNet(k=32, hidden=32))
    assert min(guarded[60:]) >= 0.5 and guarded_diagnostics["kl"] > 1.0

    # without the guard the band empties; the loss left is the binary KL of (target, rest) ("rest"),
    # or 0 ("paper")
    torch.manual_seed(1)
    unguarded, diagnostics = optimise(ClipNet(k=32, hidden=32, u_min=0.0), lam_cov=0.0)
    assert unguarded[-1] < 0.05 and diagnostics["kl"] < guarded_diagnostics["kl"] - 0.5
    torch.manual_seed(1)
    unguarded, diagnostics = optimise(ClipNet(k=32, hidden=32, u_min=0.0), lam_cov=0.0, variant="paper")
    assert unguarded[-1] < 0.05 and diagnostics["kl"] < 0.05


def test_band_cannot_collapse_when_clipnet_trains_jointly_with_a_student():
    # a linear student that cannot fit the teacher keeps L_DAC large, so ClipNet keeps pulling the
    # band in; trained jointly (Adam, ClipNet at a high learning rate), the guard holds the kept mass
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(4, 16, 4, generator=generator)
    teacher = torch.randn(4, 16, 64, generator=generator) * 3

    def train(**options):
        torch.manual_seed(0)
        student_head, clip_net = torch.nn.Linear(4, 64), ClipNet(k=32, hidden=32, u_min=0.0)
        optimizer = torch.optim.Adam(
            [{"params": student_head.parameters(), "lr": 1e-2}, {"params": clip_net.parameters(), "lr": 3e-2}]
        )
        kept = []
        for _ in range(100):
            loss, diagnostics = dac_kl(student_head(features), teacher, clip_net=clip_net, **options)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            kept.append(diagnostics["kept_mass"].item())
        return kept

    assert min(train()) >= 0.48
    assert train(lam_cov=0.0)[-1] < 0.05  # the same run without the guard collapses


def test_below_the_floor_only_the_penalty_moves_clipnet(make_case):
    # a teacher with p_(1) > 0.9 and a band ending at u ≈ 0.61: every position is below the floor,
    # so ClipNet's gradient is lam_cov times the penalty's, with nothing from the KL
    student, teacher, _ = make_case(B=2, T=4, V=20)
    teacher[..., 3] += 12.0
    clip_net = ClipNet(k=8, hidden=16, init_bounds=(0.02, 0.61))
    parameters = list(clip_net.parameters())

    def clipnet_grads(lam_cov):
        loss, diagnostics = dac_kl(student, teacher, clip_net=clip_net, reduction="none", lam_cov=lam_cov)
        return torch.autograd.grad(loss.sum(), parameters), diagnostics

    (grads_1, diagnostics), (grads_10, _) = clipnet_grads(1.0), clipnet_grads(10.0)
    assert diagnostics["kept_mass"] < 0.5
    for one, ten in zip(grads_1, grads_10):
        torch.testing.assert_close(ten, 10 * one)
    kl_grads, _ = clipnet_grads(0.0)  # guard off: the KL does pull on ClipNet
    assert any(g.abs().sum() > 0 for g in kl_grads)


def test_clipnet_trains_jointly_in_its_own_parameter_group(make_case):
    _, teacher, mask = make_case()
    student_head = torch.nn.Linear(4, teacher.size(-1))
    features = torch.randn(*teacher.shape[:2], 4)
    clip_net = ClipNet(k=8, hidden=16)
    optimizer = torch.optim.AdamW(
        [{"params": student_head.parameters(), "lr": 1e-3},
         {"params": clip_net.parameters(), "lr": 1e-2, "weight_decay": 0.0}]
    )
    before = [p.detach().clone() for p in clip_net.parameters()]
    loss, _ = dac_kl(student_head(features), teacher, mask, clip_net=clip_net, chunk_size=3)
    loss.backward()
    optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, clip_net.parameters()))
    assert optimizer.param_groups[1]["lr"] == 1e-2


def test_bad_configurations_raise(make_case):
    student, teacher, mask = make_case()
    with pytest.raises(ValueError, match="needs a clip_net"):
        dac_kl(student, teacher, mask)
    with pytest.raises(ValueError, match="fixed_bounds"):
        dac_kl(student, teacher, mask, mode="fixed", clip_net=ClipNet(k=4, hidden=4))
    with pytest.raises(ValueError, match="fixed_bounds must satisfy"):
        dac_kl(student, teacher, mask, mode="fixed", fixed_bounds=(0.6, 0.5))
    with pytest.raises(ValueError, match="band"):
        dac_kl(student, teacher, mask, mode="fixed", band="value")
    with pytest.raises(ValueError, match="variant"):
        dac_kl(student, teacher, mask, mode="fixed", variant="normalized")
    with pytest.raises(ValueError, match="base_params must be a mapping.*got 'None'"):  # a command-line null
        dac_kl(student, teacher, mask, mode="fixed", base="alpha_beta", base_params="None")
    with pytest.raises(ValueError, match="init_bounds"):
        ClipNet(init_bounds=(0.02, 0.55))


@pytest.mark.parametrize(
    "options",
    [
        dict(mode="learned"),
        dict(mode="learned", rho_min=0.9),  # the guard active at some positions (kept ≈ 0.90 on average)
        dict(mode="learned", band="value_quantile", target_class=False, temperature=0.7),
        dict(mode="fixed", fixed_bounds=(0.1, 0.6), beta=0.05),
        dict(mode="fixed", fixed_bounds=(0.0, 1.0), target_class=False),
    ],
    ids=["learned", "guard", "quantile", "fixed", "everything"],
)
@pytest.mark.parametrize("padded", [0, 3])
def test_rest_with_its_own_backward_equals_the_taped_loss(options, padded, make_case):
    student, teacher, mask = make_case(B=3, T=6, V=40, padded=padded, scale=3.0)
    clip_net = ClipNet(k=8, hidden=16) if options["mode"] == "learned" else None
    if clip_net is not None:
        torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.5)
    results = []
    for taped in (False, True):
        s = student.clone().requires_grad_(True)
        loss, diagnostics = dac_kl(s, teacher, mask, clip_net=clip_net, written_backward=not taped, **options)
        wrt = [s, *(clip_net.parameters() if clip_net is not None else ())]
        results.append((loss, diagnostics, torch.autograd.grad(loss, wrt)))
    (fused, fused_diagnostics, fused_grads), (taped, taped_diagnostics, taped_grads) = results
    torch.testing.assert_close(fused, taped, rtol=1e-5, atol=1e-6)
    for name in DIAGNOSTICS:
        torch.testing.assert_close(fused_diagnostics[name], taped_diagnostics[name], rtol=1e-5, atol=1e-6)
    for fused_grad, taped_grad in zip(fused_grads, taped_grads):
        torch.testing.assert_close(fused_grad, taped_grad, rtol=1e-4, atol=1e-6)
    assert fused_grads[0].abs().sum() > 0 and all(g.abs().sum() > 0 for g in fused_grads[1:3])


def test_rest_with_its_own_backward_returns_the_gradient_in_the_logits_dtype(make_case):
    student, teacher, mask = make_case(B=2, T=4, V=30, scale=3.0)
    grads = []
    for written in (True, False):
        s = student.bfloat16().requires_grad_(True)
        dac_kl(s, teacher.bfloat16(), mask, clip_net=ClipNet(k=8, hidden=16), written_backward=written)[0].backward()
        grads.append(s.grad)
    assert grads[0].dtype == torch.bfloat16
    torch.testing.assert_close(grads[0].float(), grads[1].float(), rtol=2e-2, atol=1e-3)


# ---- DAC-KL over any base divergence ----


@pytest.mark.parametrize("variant", ["rest", "paper"])
@pytest.mark.parametrize(("base", "base_params"), BASES, ids=BASE_IDS)
@pytest.mark.parametrize("padded", [0, 3])
def test_over_a_base_matches_float64_reference(base, base_params, variant, padded, make_case, reference):
    student, teacher, mask = make_case(B=2, T=4, V=12, padded=padded)
    options = dict(beta=0.05, variant=variant, band="mass", target_class=True)
    loss, _ = dac_kl(student, teacher, mask, mode="fixed", fixed_bounds=(0.1, 0.8), base=base, base_params=base_params,
                     **options)
    expected, _ = reference(student.double(), teacher.double(), mask, temperature=1.0, bounds=lambda b, t: (0.1, 0.8),
                            base=base, base_params=base_params, **options)
    torch.testing.assert_close(loss.double(), masked_mean(expected, mask), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("base", "base_params"), BASES, ids=BASE_IDS)
def test_over_a_base_band_covering_everything_is_the_base(base, base_params, make_case):
    student, teacher, mask = make_case()
    loss, _ = dac_kl(student, teacher, mask, mode="fixed", fixed_bounds=(0.0, 1.0), beta=1e-5, base=base,
                     base_params=base_params)
    torch.testing.assert_close(loss, DIVERGENCES[base](student, teacher, mask, **base_params), rtol=1e-4, atol=1e-5)


def test_forward_kl_is_the_default_base_and_keeps_its_written_backward(make_case):
    student, teacher, mask = make_case(B=2, T=4, V=20, scale=3.0)
    default, _ = dac_kl(student, teacher, mask, mode="fixed", fixed_bounds=(0.1, 0.8))
    explicit, _ = dac_kl(student, teacher, mask, mode="fixed", fixed_bounds=(0.1, 0.8), base="forward_kl",
                         written_backward=False)
    torch.testing.assert_close(default, explicit, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("variant", ["rest", "paper"])
@pytest.mark.parametrize(("base", "base_params"), BASES, ids=BASE_IDS)
def test_over_a_base_zero_loss_and_zero_gradient_at_student_equal_teacher(base, base_params, variant, make_case):
    _, teacher, mask = make_case(B=2, T=5, V=12, padded=3, dtype=torch.float64, scale=3.0)
    student = teacher.clone().requires_grad_(True)
    clip_net = ClipNet(k=8, hidden=16).double()
    torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.5)
    loss, diagnostics = dac_kl(student, teacher, mask, clip_net=clip_net, variant=variant, lam_cov=0.0, base=base,
                               base_params=base_params)
    assert loss.abs() < 1e-12 and diagnostics["kl"].abs() < 1e-12
    for grad in torch.autograd.grad(loss, [student, *clip_net.parameters()], allow_unused=True):
        assert grad is None or grad.abs().max() < 1e-10


@pytest.mark.parametrize(("base", "base_params"), BASES, ids=BASE_IDS)
def test_over_a_base_free_student_logits_reach_the_teacher(base, base_params):
    teacher = zipf_teacher(1.1)
    start = forward_kl(torch.zeros_like(teacher), teacher).item()
    learned_kl, diagnostics = probe(teacher, 200, init_bounds=(0.005, 0.98), base=base, base_params=base_params)
    assert learned_kl < 0.05 * start, (base, start, learned_kl)
    assert diagnostics["kept_mass"] >= 0.5


def test_over_a_base_gradcheck_float64(make_case):
    student, teacher, mask = make_case(B=2, T=3, V=9, dtype=torch.float64, scale=2.0)
    student.requires_grad_(True)
    for base, base_params in BASES:
        for variant in ("rest", "paper"):
            torch.autograd.gradcheck(
                lambda s: dac_kl(s, teacher, mask, mode="fixed", fixed_bounds=(0.1, 0.8), beta=0.05, variant=variant,
                                 base=base, base_params=base_params)[0],
                (student,),
            )


def test_over_a_base_bad_names_and_parameters_are_refused(make_case):
    student, teacher, mask = make_case()
    with pytest.raises(ValueError, match="base must be one of"):
        dac_kl(student, teacher, mask, mode="fixed", base="kl")
    with pytest.raises(TypeError, match="alpah"):
        dac_kl(student, teacher, mask, mode="fixed", base="skew_forward_kl", base_params={"alpah": 0.1})
    with pytest.raises(ValueError, match="alpha must be in"):
        dac_kl(student, teacher, mask, mode="fixed", base="skew_forward_kl", base_params={"alpha": 1.5})


@pytest.mark.parametrize("block_elements", [1, 64, 2**20], ids=["row-by-row", "blocks", "one-block"])
@pytest.mark.parametrize("options", [dict(mode="learned"), dict(mode="fixed", fixed_bounds=(0.3, 0.5), beta=1e-3),
                                     dict(mode="learned", band="value_quantile", temperature=0.7)],
                         ids=["learned", "narrow-band", "quantile"])
@pytest.mark.parametrize("base", [{}, dict(base="alpha_beta", base_params={"alpha": 0.2, "beta": 0.7})],
                         ids=["forward-kl", "alpha-beta"])  # the two bases with a written backward
def test_blocked_sort_and_band_equal_the_taped_loss_on_hard_inputs(block_elements, options, base, monkeypatch):
    # ties (bf16 logits on a coarse grid), padded columns, -inf in the teacher only, and a band that
    # reaches into the tail; the written path sorts and differentiates in blocks of rows
    from mgsr_lightning.losses import dac_kl_band

    monkeypatch.setattr(dac_kl_band, "BLOCK_ELEMENTS", block_elements)
    generator = torch.Generator().manual_seed(3)
    student = (torch.randn(3, 5, 70, generator=generator) * 3).bfloat16()
    teacher = (torch.randint(-6, 6, (3, 5, 70), generator=generator) / 2).bfloat16()  # many exact ties
    student[..., -4:] = teacher[..., -4:] = float("-inf")  # a padded vocabulary
    teacher[0, :, :3] = float("-inf")  # zero teacher probability, student free
    mask = torch.rand(3, 5, generator=generator) > 0.3
    clip_net = ClipNet(k=8, hidden=16) if options["mode"] == "learned" else None
    if clip_net is not None:
        torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.5)
    (loss, diagnostics, grads), (taped_loss, taped_diagnostics, taped_grads) = written_and_taped(
        student, teacher, mask, clip_net, chunk_size=4, **options, **base)
    assert torch.isfinite(loss) and loss > 0
    torch.testing.assert_close(loss, taped_loss, rtol=1e-5, atol=1e-6)
    for name in DIAGNOSTICS:
        torch.testing.assert_close(diagnostics[name], taped_diagnostics[name], rtol=1e-5, atol=1e-6)
    for grad, taped_grad in zip(grads, taped_grads):
        torch.testing.assert_close(grad.float(), taped_grad.float(), rtol=1e-2, atol=1e-5)
    assert grads[0].dtype == torch.bfloat16 and grads[0].abs().sum() > 0
