"""The fused head + loss path against the unfused one (whole logits, then the pure loss): loss and the
gradients of the student's hidden states, head, bias and ClipNet equal, for every term, with a padding
mask, -inf logits, a head padded past the vocabulary, bf16 and a chunk size that divides nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from mgsr_lightning.losses import DIVERGENCES, ClipNet, dac_kl, response_cross_entropy, span_correlation_loss
from mgsr_lightning.losses.fused_head import CachedTeacher, TeacherHead, fused_head_loss
from mgsr_lightning.losses.fused_terms import cross_entropy_term, dac_kl_term, divergence_term, span_term
from mgsr_lightning.losses.sparse_teacher import densify, top_k_entries

B, T, H, VOCAB, HEAD_ROWS = 2, 9, 6, 13, 16  # the student's and teacher's heads have 3 rows past the vocabulary
NEG_INF_COLUMN = 4  # -inf in both biases: a token neither model can emit
SPANS = torch.tensor([[0, 0, 0, -1, 2, 2, 2, 2, 5], [1, 1, 1, 1, 1, -1, 3, 3, -1]])


def make_batch(dtype=torch.float32, seed=0, neg_inf=True):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale).to(dtype)

    student_bias, teacher_bias = randn(HEAD_ROWS), randn(HEAD_ROWS)
    if neg_inf:
        student_bias[NEG_INF_COLUMN] = teacher_bias[NEG_INF_COLUMN] = float("-inf")
    labels = torch.randint(0, VOCAB - 1, (B, T), generator=generator)
    labels += labels >= NEG_INF_COLUMN  # never the token no model can emit (its cross-entropy is inf)
    mask = torch.rand(B, T, generator=generator) > 0.25
    mask[1, 2] = False  # splits row 1's first span
    mask[0, -1] = False
    return SimpleNamespace(
        student_hidden=randn(B, T, H, scale=1.5).requires_grad_(),
        student_head=randn(HEAD_ROWS, H).requires_grad_(),
        student_bias=student_bias.requires_grad_(),
        teacher_hidden=randn(B, T, H + 2, scale=1.5).requires_grad_(),  # the teacher's own hidden size
        teacher_head=randn(HEAD_ROWS, H + 2).requires_grad_(),
        teacher_bias=teacher_bias,
        labels=labels,
        mask=mask,
    )


def make_clip_net(seed=0):
    torch.manual_seed(seed)
    clip_net = ClipNet(k=5, hidden=8)
    torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.5)  # as if trained: every parameter gets a gradient
    return clip_net


# name -> (fused term builder, unfused loss), both given (batch, clip_net)
def _divergence(name, **params):
    return (lambda b, c: divergence_term(name, b.mask, **params),
            lambda s, t, b, c: DIVERGENCES[name](s, t, b.mask, **params))


def _dac_kl(**params):
    return (lambda b, c: dac_kl_term(b.mask, clip_net=c if params.get("mode") != "fixed" else None, **params),
            lambda s, t, b, c: dac_kl(s, t, b.mask, clip_net=c if params.get("mode") != "fixed" else None,
                                      **params)[0])


def _span(relation):
    return (lambda b, c: span_term(SPANS, b.mask, relation=relation),
            lambda s, t, b, c: span_correlation_loss(s, t, b.mask, spans=SPANS, relation=relation))


CROSS_ENTROPY = (lambda b, c: cross_entropy_term(b.labels, b.mask),
                 lambda s, t, b, c: response_cross_entropy(s, SimpleNamespace(response_ids=b.labels,
                                                                              response_mask=b.mask)))
MGSR_DAC_KL = dict(mode="learned", variant="rest", base="alpha_beta", base_params={"alpha": 0.2, "beta": 0.7})

TERMS = {
    **{name: _divergence(name) for name in DIVERGENCES},
    "forward_kl_temperature_2": _divergence("forward_kl", temperature=2.0),
    "generalized_jsd_beta_0.3": _divergence("generalized_jsd", beta=0.3),
    "dac_kl_rest_forward_kl": _dac_kl(),
    "dac_kl_rest_alpha_beta": _dac_kl(**MGSR_DAC_KL),
    "dac_kl_rest_taped": _dac_kl(written_backward=False),
    "dac_kl_rest_reverse_kl": _dac_kl(base="reverse_kl"),
    "dac_kl_paper": _dac_kl(variant="paper"),
    "dac_kl_fixed": _dac_kl(mode="fixed"),
    "dac_kl_value_quantile": _dac_kl(band="value_quantile", temperature=1.5),
    "span_normalized": _span("normalized"),
    "span_product": _span("product"),
    "span_cosine": _span("cosine"),
    "cross_entropy": CROSS_ENTROPY,
}
MGSR = {"sft": (1.0, CROSS_ENTROPY), "distill": (1.0, _dac_kl(**MGSR_DAC_KL)), "span": (0.1, _span("normalized"))}


def unfused(batch, weighted_terms, clip_net, cached_k=None):
    """The reference: whole logits [B, T, V] (heads cut to the vocabulary, as response_logits does), then
    the pure losses; returns (loss, {name: value})."""
    student_logits = F.linear(batch.student_hidden, batch.student_head, batch.student_bias)[..., :VOCAB]
    with torch.no_grad():
        teacher_logits = F.linear(batch.teacher_hidden, batch.teacher_head, batch.teacher_bias)[..., :VOCAB]
        if cached_k is not None:
            teacher_logits = densify(*top_k_entries(teacher_logits, cached_k), VOCAB)
    values = {name: loss(student_logits, teacher_logits, batch, clip_net)
              for name, (_, (_, loss)) in weighted_terms.items()}
    return sum(weight * values[name] for name, (weight, _) in weighted_terms.items()), values


def fused(batch, weighted_terms, clip_net, chunk_size, cached_k=None):
    terms = {name: (weight, build(batch, clip_net)) for name, (weight, (build, _)) in weighted_terms.items()}
    if cached_k is None:
        teacher = TeacherHead(batch.teacher_hidden, batch.teacher_head, batch.teacher_bias)
    else:
        with torch.no_grad():
            logits = F.linear(batch.teacher_hidden, batch.teacher_head, batch.teacher_bias)[..., :VOCAB]
        teacher = CachedTeacher(*top_k_entries(logits, cached_k))
    return fused_head_loss(batch.student_hidden, batch.student_head, terms, teacher, student_bias=batch.student_bias,
                           vocab_size=VOCAB, chunk_size=chunk_size)


def gradients(loss, batch, clip_net):
    """The student's and ClipNet's gradients after ``loss.backward()``; the teacher's must stay None."""
    tensors = [batch.student_hidden, batch.student_head, batch.student_bias, *clip_net.parameters()]
    for tensor in tensors:
        tensor.grad = None
    loss.backward()
    assert batch.teacher_hidden.grad is None and batch.teacher_head.grad is None
    return [tensor.grad.clone() if tensor.grad is not None else torch.zeros_like(tensor) for tensor in tensors]


def assert_same(fused_result, unfused_result, batch, clip_net, rtol, atol):
    (fused_loss, fused_values), (unfused_loss, unfused_values) = fused_result, unfused_result
    torch.testing.assert_close(fused_loss, unfused_loss.float(), rtol=rtol, atol=atol)
    for name, value in unfused_values.items():
        torch.testing.assert_close(fused_values[name], value.detach().float(), rtol=rtol, atol=atol)
    fused_grads = gradients(fused_loss, batch, clip_net)
    unfused_grads = gradients(unfused_loss, batch, clip_net)
    assert all(torch.isfinite(grad.float()).all() for grad in unfused_grads)
    assert fused_grads[1][VOCAB:].abs().max() == 0  # the head's rows past the vocabulary are never used
    for fused_grad, unfused_grad in zip(fused_grads, unfused_grads):
        scale = unfused_grad.float().abs().max().clamp_min(1e-3)
        torch.testing.assert_close(fused_grad.float() / scale, unfused_grad.float() / scale, rtol=rtol, atol=atol)


@pytest.mark.parametrize("chunk_size", [4, 64])  # 4 divides neither T nor the compared positions; 64: one chunk
@pytest.mark.parametrize("name", list(TERMS))
def test_each_term_equals_the_unfused_path(name, chunk_size):
    batch, clip_net = make_batch(), make_clip_net()
    weighted = {name: (1.0, TERMS[name])}
    assert_same(fused(batch, weighted, clip_net, chunk_size), unfused(batch, weighted, clip_net), batch, clip_net,
                rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 5])
def test_mgsr_objective_equals_the_unfused_path(chunk_size):
    batch, clip_net = make_batch(seed=1), make_clip_net()
    fused_result = fused(batch, MGSR, clip_net, chunk_size)
    assert set(fused_result[1]) >= {"sft", "distill", "span", "distill/kl", "distill/kept_mass"}
    assert_same(fused_result, unfused(batch, MGSR, clip_net), batch, clip_net, rtol=1e-5, atol=1e-6)


def test_the_terms_own_chunks_inside_the_fused_chunks_give_the_same_result():
    batch, clip_net = make_batch(seed=6), make_clip_net()
    terms = {"sft": (1.0, cross_entropy_term(batch.labels, batch.mask)),
             "kd": (0.5, divergence_term("reverse_kl", batch.mask, chunk_size=2)),
             "distill": (1.0, dac_kl_term(batch.mask, clip_net=clip_net, chunk_size=3, **MGSR_DAC_KL)),
             "span": (0.1, span_term(SPANS, batch.mask, chunk_size=2))}
    fused_result = fused_head_loss(batch.student_hidden, batch.student_head, terms,
                                   TeacherHead(batch.teacher_hidden, batch.teacher_head, batch.teacher_bias),
                                   student_bias=batch.student_bias, vocab_size=VOCAB, chunk_size=7)
    reference = {"sft": (1.0, CROSS_ENTROPY), "kd": (0.5, TERMS["reverse_kl"]),
                 "distill": (1.0, TERMS["dac_kl_rest_alpha_beta"]), "span": (0.1, TERMS["span_normalized"])}
    assert_same(fused_result, unfused(batch, reference, clip_net), batch, clip_net, rtol=1e-5, atol=1e-6)


def test_dac_kl_diagnostics_equal_the_unfused_ones():
    batch, clip_net = make_batch(seed=2), make_clip_net()
    term = dac_kl_term(batch.mask, clip_net=clip_net, **MGSR_DAC_KL)
    _, values = fused_head_loss(batch.student_hidden, batch.student_head, {"distill": (1.0, term)},
                                TeacherHead(batch.teacher_hidden, batch.teacher_head, batch.teacher_bias),
                                student_bias=batch.student_bias, vocab_size=VOCAB, chunk_size=3)
    student_logits = F.linear(batch.student_hidden, batch.student_head, batch.student_bias)[..., :VOCAB]
    teacher_logits = F.linear(batch.teacher_hidden, batch.teacher_head, batch.teacher_bias)[..., :VOCAB]
    _, diagnostics = dac_kl(student_logits, teacher_logits, batch.mask, clip_net=clip_net, **MGSR_DAC_KL)
    for key, value in diagnostics.items():
        torch.testing.assert_close(values[f"distill/{key}"], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["forward_kl", "dac_kl_rest_alpha_beta", "span_normalized", "cross_entropy"])
def test_bf16_equals_the_unfused_path(name):
    batch, clip_net = make_batch(dtype=torch.bfloat16, seed=3), make_clip_net()
    weighted = {name: (1.0, TERMS[name])}
    assert_same(fused(batch, weighted, clip_net, 5), unfused(batch, weighted, clip_net), batch, clip_net,
                rtol=2e-2, atol=2e-2)
    fused_loss, _ = fused(batch, weighted, clip_net, 5)
    assert fused_loss.dtype == torch.float32  # the losses compute in float32 from bf16 logits
    fused_loss.backward()
    assert batch.student_hidden.grad.dtype == batch.student_head.grad.dtype == torch.bfloat16


def test_mgsr_objective_bf16_equals_the_unfused_path():
    batch, clip_net = make_batch(dtype=torch.bfloat16, seed=4), make_clip_net()
    assert_same(fused(batch, MGSR, clip_net, 4), unfused(batch, MGSR, clip_net), batch, clip_net, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["forward_kl", "dac_kl_rest_alpha_beta", "span_normalized"])
def test_cached_top_k_teacher_equals_the_unfused_path_on_its_densified_logits(name):
    batch, clip_net = make_batch(seed=5, neg_inf=False), make_clip_net()
    weighted = {name: (1.0, TERMS[name])}
    assert_same(fused(batch, weighted, clip_net, 4, cached_k=5), unfused(batch, weighted, clip_net, cached_k=5),
                batch, clip_net, rtol=1e-5, atol=1e-6)


def test_no_compared_position_gives_zero_with_zero_gradient():
    batch, clip_net = make_batch(), make_clip_net()
    batch.mask = torch.zeros(B, T, dtype=torch.bool)
    loss, values = fused(batch, MGSR, clip_net, 4)
    assert loss.item() == 0 and values["distill"].item() == 0
    for grad in gradients(loss, batch, clip_net):
        assert grad.abs().max() == 0


def test_the_loss_scales_with_the_incoming_gradient():
    batch, clip_net = make_batch(), make_clip_net()
    weighted = {"distill": (1.0, TERMS["dac_kl_rest_alpha_beta"])}
    once = gradients(fused(batch, weighted, clip_net, 4)[0], batch, clip_net)
    tripled = gradients(3 * fused(batch, weighted, clip_net, 4)[0], batch, clip_net)
    for single, triple in zip(once, tripled):
        torch.testing.assert_close(triple, 3 * single)


def test_bad_inputs_raise_readable_errors():
    batch = make_batch()
    terms = {"kd": (1.0, divergence_term("forward_kl", batch.mask))}
    with pytest.raises(ValueError, match="vocab_size"):
        fused_head_loss(batch.student_hidden, batch.student_head, terms,
                        TeacherHead(batch.teacher_hidden, batch.teacher_head), vocab_size=HEAD_ROWS + 1)
    with pytest.raises(ValueError, match="reads the teacher"):
        fused_head_loss(batch.student_hidden, batch.student_head, terms)
    with pytest.raises(ValueError, match=r"\[B, T, H\]"):
        fused_head_loss(batch.student_hidden[0], batch.student_head, terms)
    with pytest.raises(ValueError, match="name must be one of"):
        divergence_term("forward_kll", batch.mask)
