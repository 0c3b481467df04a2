"""The module's fused step: its loss and gradients equal the unfused step's, and it says when it does not fuse."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from mgsr_lightning.batch import TEACHER_CACHE_KEYS, Rollout, TrainingSequences
from mgsr_lightning.data.datamodule import InstructionDataModule
from mgsr_lightning.generation.scoring import response_hidden_states, response_logits
from mgsr_lightning.losses.minillm import MiniLLMConfig
from mgsr_lightning.losses.objective import DistillLoss, SpanLoss
from mgsr_lightning.models.loading import ModelSource
from mgsr_lightning.models.output_head import linear_output_head
from mgsr_lightning.module import DistillLightningModule
from mgsr_lightning.scrg.revise import ScrgConfig
from mgsr_lightning.training.regimes import RegimeConfig
from tests.tiny_models import build_tiny_model


def _module(tiny_assets, family="gpt2", **kwargs) -> DistillLightningModule:
    module = DistillLightningModule(
        student=ModelSource(name_or_path=str(tiny_assets["models"][family]["student"])),
        teacher=ModelSource(name_or_path=str(tiny_assets["models"][family]["teacher"])),
        tokenizer=str(tiny_assets["tokenizer"]), max_length=80, **kwargs,
    )
    module.configure_model()
    module.eval()  # no dropout: the two paths see the same function
    return module


def _batch(tiny_assets) -> dict:
    data = InstructionDataModule(
        tokenizer=str(tiny_assets["tokenizer"]), train_data=str(tiny_assets["data"] / "train.jsonl"),
        val_data=str(tiny_assets["data"] / "validation.jsonl"), template="plain", max_length=80,
        max_prompt_length=56, batch_size=5,
    )
    data.setup("fit")
    return next(iter(data.train_dataloader()))


def _trained(module) -> list[torch.nn.Parameter]:
    params = [p for p in module.student.parameters() if p.requires_grad]
    return params + (list(module.clip_net.parameters()) if module.clip_net is not None else [])


def _loss_and_gradients(module, batch, step, ground_truth, fused: bool, measure=False):
    module.zero_grad(set_to_none=True)
    if fused:
        loss, metrics = module.fused_step_loss(batch, step, ground_truth, measure)
    else:
        sequences = step.sequences
        ground_truth_logits = None
        if module.objective.sft_on_ground_truth and sequences is not ground_truth:
            ground_truth_logits = module.logits(module.student, ground_truth)
        loss, metrics = module.objective(sequences, module.logits(module.student, sequences),
                                         module.step_teacher_logits(batch, step), ground_truth, ground_truth_logits,
                                         measure)
    loss.backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in _trained(module)]
    return loss.detach(), {k: float(torch.as_tensor(v).detach()) for k, v in metrics.items()}, grads


def _assert_paths_agree(module, batch, step, ground_truth):
    """The fused step's loss and gradients equal the unfused step's, to float tolerance; returns the fused result."""
    unfused = _loss_and_gradients(module, batch, step, ground_truth, fused=False)
    fused = _loss_and_gradients(module, batch, step, ground_truth, fused=True)
    torch.testing.assert_close(fused[0], unfused[0], rtol=1e-5, atol=1e-6)
    for got, expected in zip(fused[2], unfused[2]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    return fused


@pytest.mark.parametrize("family", ["gpt2", "opt", "llama"])
def test_hidden_states_through_the_head_are_the_response_logits(tiny_assets, family):
    module = _module(tiny_assets, family)
    sequences = Rollout.from_batch(_batch(tiny_assets))
    weight, bias = linear_output_head(module.student)
    with torch.no_grad():
        fused = torch.nn.functional.linear(response_hidden_states(module.student, sequences), weight, bias)
        torch.testing.assert_close(fused[..., : module.vocab_size], response_logits(module.student, sequences,
                                                                                    module.vocab_size))


METHODS = {
    "kd": dict(distill=DistillLoss(name="forward_kl")),
    "distillm": dict(distill=DistillLoss(name="skew_forward_kl", params={"alpha": 0.1}),
                     regime=RegimeConfig(name="on_policy")),
    "abkd": dict(distill=DistillLoss(name="abkd", params={"alpha": 0.2, "beta": 0.7}), sft_weight=0.0),
    "mgsr": dict(distill=DistillLoss(name="dac_kl", chunk_size=16, params={
                     "mode": "learned", "variant": "rest", "base": "alpha_beta",
                     "base_params": {"alpha": 0.2, "beta": 0.7}}),
                 span=SpanLoss(weight=0.1, chunk_size=16), regime=RegimeConfig(name="on_policy"), scrg=ScrgConfig()),
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("chunk", [7, 256])
def test_the_fused_step_equals_the_unfused_step(tiny_assets, method, chunk):
    module = _module(tiny_assets, fused_chunk_size=chunk, **METHODS[method])
    assert module.fused_head_refusal() is None
    batch = _batch(tiny_assets)
    ground_truth = Rollout.from_batch(batch)
    with torch.no_grad():  # one training-sequences draw, shared by both paths
        step = (module.student_outputs(ground_truth, batch) if method in ("distillm", "mgsr")
                else TrainingSequences(ground_truth, "ground_truth"))
    unfused = _loss_and_gradients(module, batch, step, ground_truth, fused=False, measure=True)
    fused = _loss_and_gradients(module, batch, step, ground_truth, fused=True, measure=True)
    torch.testing.assert_close(fused[0], unfused[0], rtol=1e-5, atol=1e-6)
    assert fused[1].keys() == unfused[1].keys()
    for key, value in unfused[1].items():
        assert fused[1][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for got, expected in zip(fused[2], unfused[2]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in fused[2])


def test_a_cached_teacher_fuses_as_its_densified_logits(tiny_assets):
    module = _module(tiny_assets, distill=DistillLoss(name="forward_kl"))
    batch = _batch(tiny_assets)
    ground_truth = Rollout.from_batch(batch)
    with torch.no_grad():  # a top-4 cache of the live teacher's log-probabilities
        log_probs = module.teacher_logits(ground_truth).float().log_softmax(-1)
        top = log_probs.topk(4, dim=-1)
        rest = torch.log1p(-top.values.exp().sum(-1).clamp(max=1 - 1e-6))
    batch.update(zip(TEACHER_CACHE_KEYS, (top.indices, top.values, rest)))
    step = TrainingSequences(ground_truth, "ground_truth")
    _assert_paths_agree(module, batch, step, ground_truth)


def test_a_padded_student_head_fuses_over_the_shared_vocabulary(tiny_assets, tmp_path):
    tokenizer_size = len(AutoTokenizer.from_pretrained(str(tiny_assets["tokenizer"])))
    build_tiny_model("llama", tokenizer_size + 13, seed=3).save_pretrained(tmp_path / "padded")
    module = DistillLightningModule(
        student=ModelSource(name_or_path=str(tmp_path / "padded")),
        teacher=ModelSource(name_or_path=str(tiny_assets["models"]["llama"]["teacher"])),
        tokenizer=str(tiny_assets["tokenizer"]), max_length=80, distill=DistillLoss(name="reverse_kl"),
    )
    module.configure_model()
    module.eval()
    assert linear_output_head(module.student)[0].size(0) == module.vocab_size + 13
    batch = _batch(tiny_assets)
    ground_truth = Rollout.from_batch(batch)
    step = TrainingSequences(ground_truth, "ground_truth")
    _assert_paths_agree(module, batch, step, ground_truth)


class _OwnLogits(DistillLightningModule):
    def logits(self, model, sequences):
        return super().logits(model, sequences)


def test_the_step_says_why_it_does_not_fuse(tiny_assets):
    assert _module(tiny_assets, distill=DistillLoss(), fused_head=False).fused_head_refusal() == "fused_head is false"
    minillm = _module(tiny_assets, distill=None, minillm=MiniLLMConfig(), regime=RegimeConfig(name="on_policy"))
    assert "MiniLLM" in minillm.fused_head_refusal()
    own = _OwnLogits(student=ModelSource(name_or_path=str(tiny_assets["models"]["gpt2"]["student"])),
                     teacher=ModelSource(name_or_path=str(tiny_assets["models"]["gpt2"]["teacher"])),
                     tokenizer=str(tiny_assets["tokenizer"]), distill=DistillLoss())
    own.configure_model()
    assert own.fused_head_refusal() == "_OwnLogits overrides logits()"
    with pytest.raises(ValueError, match="fused_chunk_size must be a positive"):
        _module(tiny_assets, distill=DistillLoss(), fused_chunk_size=0)


def test_the_fused_step_runs_under_bf16_autocast_as_bf16_mixed_precision_does(tiny_assets):
    module = _module(tiny_assets, **METHODS["mgsr"])
    batch = _batch(tiny_assets)
    ground_truth = Rollout.from_batch(batch)
    with torch.no_grad():
        step = module.student_outputs(ground_truth, batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        unfused = _loss_and_gradients(module, batch, step, ground_truth, fused=False)
        fused = _loss_and_gradients(module, batch, step, ground_truth, fused=True)
    torch.testing.assert_close(fused[0], unfused[0], rtol=2e-2, atol=2e-2)
    for got, expected in zip(fused[2], unfused[2]):
        assert got.dtype == expected.dtype == torch.float32
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, expected, rtol=0.1, atol=2e-3)


class _SharperTeacher(DistillLightningModule):
    def teacher_logits(self, sequences):
        return 2 * super().teacher_logits(sequences)


def test_a_subclass_s_own_teacher_logits_are_the_fused_step_s_teacher(tiny_assets):
    module = _SharperTeacher(student=ModelSource(name_or_path=str(tiny_assets["models"]["gpt2"]["student"])),
                             teacher=ModelSource(name_or_path=str(tiny_assets["models"]["gpt2"]["teacher"])),
                             tokenizer=str(tiny_assets["tokenizer"]), max_length=80, distill=DistillLoss())
    module.configure_model()
    module.eval()
    assert module.fused_head_refusal() is None
    batch = _batch(tiny_assets)
    ground_truth = Rollout.from_batch(batch)
    step = TrainingSequences(ground_truth, "ground_truth")
    fused = _assert_paths_agree(module, batch, step, ground_truth)
    plain = _module(tiny_assets, distill=DistillLoss())  # the same models without the override
    assert not torch.allclose(_loss_and_gradients(plain, batch, step, ground_truth, fused=True)[0], fused[0])
