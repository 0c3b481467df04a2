"""ULD and the exact-match loss over aligned groups, against plain float64 loops over the groups."""

from __future__ import annotations

import math

import pytest
import torch

from mgsr_lightning.losses import DIVERGENCES, ClipNet, dac_kl
from mgsr_lightning.losses.cross_tokenizer import AlignedGroups, exact_match_loss, uld_loss


def _token_groups(sizes: list[int], length: int) -> list[int]:
    """Consecutive tokens per group (size 0: the group has no token on this side), −1 after them."""
    groups = [g for g, size in enumerate(sizes) for _ in range(size)]
    return groups + [-1] * (length - len(groups))


def _case(dtype=torch.float32, seed=0, Vs=9, Vt=13):
    """Two rows: row 0 with groups of 1-3 tokens on each side and one group left out of the mask, row 1
    shorter (padding) with a leading special token; some logits -inf."""
    generator = torch.Generator().manual_seed(seed)
    student_sizes = [[1, 2, 1, 3], [1, 1]]
    teacher_sizes = [[2, 1, 1, 1], [3, 1]]
    Ts, Tt, G = 8, 6, 4
    student_groups = torch.tensor([_token_groups(s, Ts) for s in student_sizes])
    teacher_groups = torch.tensor([_token_groups(s, Tt) for s in teacher_sizes])
    student_groups[1] = torch.tensor([-1, *student_groups[1, :-1].tolist()])  # a special token first
    group_mask = torch.tensor([[True, True, False, True], [True, True, False, False]])
    student_logits = torch.randn(2, Ts, Vs, generator=generator, dtype=torch.float64) * 2
    teacher_logits = torch.randn(2, Tt, Vt, generator=generator, dtype=torch.float64) * 2
    student_logits[0, 1, 4] = float("-inf")
    teacher_logits[0, 0, :4] = float("-inf")
    student_ids = torch.randint(Vs, (2, Ts), generator=generator)
    teacher_ids = torch.randint(4, Vt, (2, Tt), generator=generator)
    groups = AlignedGroups(student_ids, student_groups, teacher_ids, teacher_groups, group_mask)
    return student_logits.to(dtype), teacher_logits.to(dtype).requires_grad_(False), groups, G


def _softmax(row: list[float], temperature: float) -> list[float]:
    values = [v / temperature for v in row]
    top = max(values)
    weights = [0.0 if v == float("-inf") else math.exp(v - top) for v in values]
    return [w / sum(weights) for w in weights]


def _group_probs(logits: torch.Tensor, ids: torch.Tensor, groups: torch.Tensor, b: int, g: int,
                 temperature: float) -> list[float]:
    """g(v) = P(first = v) · Π P(observed later tokens), float64, one group."""
    positions = [t for t in range(groups.size(1)) if groups[b, t] == g]
    first = _softmax(logits[b, positions[0]].double().tolist(), temperature)
    continuation = 1.0
    for t in positions[1:]:
        continuation *= _softmax(logits[b, t].double().tolist(), temperature)[int(ids[b, t])]
    return [p * continuation for p in first]


def _both(student_logits, teacher_logits, groups, b, g, temperature):
    return (_group_probs(student_logits, groups.student_ids, groups.student_groups, b, g, temperature),
            _group_probs(teacher_logits, groups.teacher_ids, groups.teacher_groups, b, g, temperature))


def _reduce(values: dict, reduction: str, shape):
    if reduction == "none":
        out = torch.zeros(shape, dtype=torch.float64)
        for (b, g), v in values.items():
            out[b, g] = v
        return out
    total = sum(values.values())
    return torch.tensor(total / max(len(values), 1) if reduction == "mean" else total, dtype=torch.float64)


def _compared(groups):
    return [tuple(i) for i in groups.group_mask.nonzero().tolist()]


def uld_reference(student_logits, teacher_logits, groups, temperature, reduction):
    values = {}
    for b, g in _compared(groups):
        student, teacher = _both(student_logits, teacher_logits, groups, b, g, temperature)
        size = max(len(student), len(teacher))
        student = sorted(student, reverse=True) + [0.0] * (size - len(student))
        teacher = sorted(teacher, reverse=True) + [0.0] * (size - len(teacher))
        values[(b, g)] = sum(abs(s - t) for s, t in zip(student, teacher))
    return _reduce(values, reduction, groups.group_mask.shape)


def _first_id(ids: torch.Tensor, groups: torch.Tensor, b: int, g: int) -> int:
    return int(ids[b, [t for t in range(groups.size(1)) if groups[b, t] == g][0]])


def projected_reference(student_logits, teacher_logits, groups, shared, temperature, b, g):
    """The [S + 2] probability vectors of one group: the group's text (its observed first token), the shared
    strings (0 at either side's observed first token), then the rest."""
    student, teacher = _both(student_logits, teacher_logits, groups, b, g, temperature)
    firsts = (_first_id(groups.student_ids, groups.student_groups, b, g),
              _first_id(groups.teacher_ids, groups.teacher_groups, b, g))
    # shared entry j is out (to the rest) on both sides where its string is either side's observed first token
    out = [int(s) == firsts[0] or int(t) == firsts[1] for s, t in zip(shared[0].tolist(), shared[1].tolist())]
    vectors = []
    for probs, ids, observed in ((student, shared[0], firsts[0]), (teacher, shared[1], firsts[1])):
        kept = [0.0 if drop else probs[i] for i, drop in zip(ids.tolist(), out)]
        vectors.append([probs[observed], *kept, max(1.0 - probs[observed] - sum(kept), 0.0)])
    return vectors


def exact_match_reference(student_logits, teacher_logits, groups, shared, temperature, reduction, divergence):
    """Forward KL written out; any other divergence is the registered one on the reference vectors."""
    values = {}
    for b, g in _compared(groups):
        student, teacher = projected_reference(student_logits, teacher_logits, groups, shared, temperature, b, g)
        if divergence == "forward_kl":
            values[(b, g)] = sum(p * (math.log(p) - math.log(q)) for p, q in zip(teacher, student) if p > 0)
        else:
            log_student = torch.tensor(student, dtype=torch.float64).log()[None, None]
            log_teacher = torch.tensor(teacher, dtype=torch.float64).log()[None, None]
            values[(b, g)] = float(DIVERGENCES[divergence](log_student, log_teacher, reduction="sum"))
    return _reduce(values, reduction, groups.group_mask.shape)


SHARED = (torch.tensor([0, 2, 3, 5, 8]), torch.tensor([7, 1, 12, 4, 9]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("chunk_size", [None, 2])
def test_uld_matches_the_loop(reduction, temperature, chunk_size):
    student, teacher, groups, _ = _case()
    got = uld_loss(student, teacher, groups, temperature=temperature, reduction=reduction, chunk_size=chunk_size)
    want = uld_reference(student, teacher, groups, temperature, reduction)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_uld_with_the_teacher_vocabulary_smaller():
    student, teacher, groups, _ = _case(Vs=15, Vt=6)
    groups = AlignedGroups(groups.student_ids % 15, groups.student_groups, groups.teacher_ids % 6,
                           groups.teacher_groups, groups.group_mask)
    got = uld_loss(student, teacher, groups)
    torch.testing.assert_close(got.double(), uld_reference(student, teacher, groups, 1.0, "mean"), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "generalized_jsd", "total_variation", "abkd",
                                        "skew_forward_kl"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("chunk_size", [None, 2])
def test_exact_match_matches_the_loop(divergence, reduction, chunk_size):
    student, teacher, groups, _ = _case()
    got, diagnostics = exact_match_loss(student, teacher, groups, *SHARED, divergence=divergence,
                                        temperature=1.5, reduction=reduction, chunk_size=chunk_size)
    want = exact_match_reference(student, teacher, groups, SHARED, 1.5, reduction, divergence)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert diagnostics == {}


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_exact_match_with_dac_kl_is_dac_kl_of_the_projected_vectors(chunk_size):
    student, teacher, groups, _ = _case()
    params = {"mode": "fixed", "fixed_bounds": (0.05, 0.9)}
    got, diagnostics = exact_match_loss(student, teacher, groups, *SHARED, divergence="dac_kl", params=params,
                                        chunk_size=chunk_size)
    vectors = [projected_reference(student, teacher, groups, SHARED, 1.0, b, g) for b, g in _compared(groups)]
    log_student = torch.tensor([v[0] for v in vectors], dtype=torch.float64).log()[None]
    log_teacher = torch.tensor([v[1] for v in vectors], dtype=torch.float64).log()[None]
    want, want_diagnostics = dac_kl(log_student, log_teacher, **params)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(diagnostics["kept_mass"].double(), want_diagnostics["kept_mass"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss", ["uld", "exact_match"])
def test_bf16_logits_match_the_loop_on_their_values(loss):
    student, teacher, groups, _ = _case(dtype=torch.bfloat16)
    if loss == "uld":
        got = uld_loss(student, teacher, groups)
        want = uld_reference(student, teacher, groups, 1.0, "mean")
    else:
        got, _ = exact_match_loss(student, teacher, groups, *SHARED)
        want = exact_match_reference(student, teacher, groups, SHARED, 1.0, "mean", "forward_kl")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("loss", ["uld", "uld_chunked", "exact_match", "exact_match_chunked"])
def test_gradients_are_finite_and_match_autograd_of_the_reference(loss):
    student, teacher, groups, _ = _case(dtype=torch.float64)
    student.requires_grad_(True)

    def run(x):
        chunk_size = 2 if loss.endswith("chunked") else None
        if loss.startswith("uld"):
            return uld_loss(x, teacher, groups, chunk_size=chunk_size)
        return exact_match_loss(x, teacher, groups, *SHARED, chunk_size=chunk_size)[0]

    value = run(student)
    (grad,) = torch.autograd.grad(value, student)
    assert torch.isfinite(grad).all()
    assert grad[0, 1, 4] == 0  # a -inf logit
    assert grad[1, 0].abs().sum() == 0  # a special token's position
    finite = torch.where(torch.isfinite(student), student, torch.zeros_like(student)).detach()
    direction = torch.randn(student.shape, dtype=torch.float64) * torch.isfinite(student)
    epsilon = 1e-6
    with torch.no_grad():
        numeric = (run(torch.where(torch.isfinite(student), finite + epsilon * direction, student))
                   - run(torch.where(torch.isfinite(student), finite - epsilon * direction, student))) / (2 * epsilon)
    torch.testing.assert_close((grad * direction).sum(), numeric, rtol=1e-4, atol=1e-7)


def test_no_compared_group_gives_zero_with_a_finite_gradient():
    student, teacher, groups, _ = _case()
    student.requires_grad_(True)
    empty = groups.masked(torch.zeros_like(groups.group_mask))
    for value in (uld_loss(student, teacher, empty), exact_match_loss(student, teacher, empty, *SHARED)[0]):
        assert value.item() == 0
        (grad,) = torch.autograd.grad(value, student)
        assert torch.isfinite(grad).all() and grad.abs().sum() == 0


def test_bad_inputs_are_refused():
    student, teacher, groups, _ = _case()
    with pytest.raises(ValueError, match="divergence must be one of"):
        exact_match_loss(student, teacher, groups, *SHARED, divergence="kl")
    with pytest.raises(ValueError, match="exact_match_loss's own arguments"):
        exact_match_loss(student, teacher, groups, *SHARED, params={"temperature": 2.0})
    with pytest.raises(ValueError, match="student_logits"):
        uld_loss(student[:, :3], teacher, groups)
    with pytest.raises(ValueError, match="reduction"):
        uld_loss(student, teacher, groups, reduction="max")
    with pytest.raises(ValueError, match="chunk_size"):
        uld_loss(student, teacher, groups, chunk_size=0)


def test_chunks_give_the_same_loss_and_gradients_to_the_student_and_clip_net():
    student, teacher, groups, _ = _case(dtype=torch.float64)
    torch.manual_seed(0)
    clip_net = ClipNet(k=4, hidden=8).double()
    torch.nn.init.normal_(clip_net.mlp[-1].weight)  # a band that moves with its input
    results = []
    for chunk_size in (None, 2):
        x = student.clone().requires_grad_(True)
        loss, diagnostics = exact_match_loss(x, teacher, groups, *SHARED, divergence="dac_kl", clip_net=clip_net,
                                             params={"mode": "learned"}, chunk_size=chunk_size)
        grads = torch.autograd.grad(loss, [x, *clip_net.parameters()])
        results.append((loss, diagnostics, grads))
    (loss, diagnostics, grads), (chunked_loss, chunked_diagnostics, chunked_grads) = results
    torch.testing.assert_close(chunked_loss, loss)
    for name in diagnostics:
        torch.testing.assert_close(chunked_diagnostics[name], diagnostics[name])
    for plain, chunked in zip(grads, chunked_grads):
        torch.testing.assert_close(chunked, plain)
    assert grads[1].abs().sum() > 0  # ClipNet learns through the loss


def test_a_name_cut_differently_is_compared_as_its_text():
    """The student spells "Bulen" in one token, the teacher as "B", "ul", "en"; "B" and "x" are shared. Both
    give the name 0.9 (the teacher through "B" then certain continuations), so the loss is 0: the teacher's
    probability of the name is not matched against the student's "B", a start the student continues otherwise."""
    student_logits = torch.tensor([[0.05, 0.9, 0.05]]).log()[None]  # B, Bulen, x
    ninf = float("-inf")
    teacher_logits = torch.tensor([[0.9, 0.025, 0.025, 0.05]]).log()  # B, ul, en, x
    teacher_logits = torch.cat([teacher_logits, torch.tensor([[ninf, 0.0, ninf, ninf], [ninf, ninf, 0.0, ninf]])])[None]
    groups = AlignedGroups(student_ids=torch.tensor([[1]]), student_groups=torch.tensor([[0]]),
                           teacher_ids=torch.tensor([[0, 1, 2]]), teacher_groups=torch.tensor([[0, 0, 0]]),
                           group_mask=torch.tensor([[True]]))
    shared = (torch.tensor([0, 2]), torch.tensor([0, 3]))
    loss, _ = exact_match_loss(student_logits, teacher_logits, groups, *shared)
    assert float(loss) == pytest.approx(0.0, abs=1e-6)
    # the student less sure of the name than the teacher: a positive loss whose gradient raises "Bulen"
    student = torch.tensor([[0.3, 0.6, 0.1]]).log()[None].requires_grad_()
    loss, _ = exact_match_loss(student, teacher_logits, groups, *shared)
    loss.backward()
    assert float(loss) > 0.05 and student.grad[0, 0, 1] < 0 < student.grad[0, 0, 0]
