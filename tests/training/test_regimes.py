"""Regimes on hand-made batches: the adaptive scheduler, its replay buffer, mixing, SeqKD's cache."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mgsr_lightning.batch import Rollout, TrainingSequences
from mgsr_lightning.training.regimes import RegimeConfig, build_regime

PAD = 0


def rollout(responses: list[list[int]], prompts: list[list[int]] | None = None) -> Rollout:
    prompts = prompts or [[5, 6]] * len(responses)
    return Rollout.from_token_lists(prompts, responses, pad_token_id=PAD)


class FreshCounter:
    """A stand-in for the module's student sampler: distinct responses, counted."""

    def __init__(self, batch_size: int = 2):
        self.calls = 0
        self.batch_size = batch_size

    def __call__(self) -> TrainingSequences:
        self.calls += 1
        return TrainingSequences(rollout([[100 + self.calls, 200 + i] for i in range(self.batch_size)]), "fresh")


def draw(regime, n: int, progress: float = 0.0, fresh=None) -> list[str]:
    fresh = fresh or FreshCounter()
    gt = rollout([[1, 2], [3]])
    return [regime.training_sequences({}, gt, fresh, progress).source for _ in range(n)]


def test_adaptive_threshold_rises_only_when_validation_loss_rises_by_eps():
    regime = build_regime(
        RegimeConfig("adaptive_off_policy", init_threshold=0.0, threshold_step=0.1, loss_eps=0.1), PAD
    )
    for loss, expected in [(2.0, 0.0), (1.5, 0.0), (2.05, 0.0), (2.1, 0.1), (2.15, 0.1), (2.25, 0.2)]:
        regime.on_validation_loss(loss)
        assert regime.threshold == pytest.approx(expected), loss
    for _ in range(20):
        regime.on_validation_loss(regime.previous_val_loss + 1.0)
    assert regime.threshold == 1.0


def test_adaptive_zero_threshold_is_ground_truth_and_one_fills_then_replays():
    off = build_regime(RegimeConfig("adaptive_off_policy", init_threshold=0.0), PAD)
    assert set(draw(off, 50)) == {"ground_truth"}

    fresh = FreshCounter()
    full = build_regime(RegimeConfig("adaptive_off_policy", init_threshold=1.0, capacity=4), PAD, seed=3)
    # at the end of training the fresh share t·(1 − progress) is 0: fresh only while the buffer fills
    sources = draw(full, 10, progress=1.0, fresh=fresh)
    assert sources[:2] == ["fresh", "fresh"] and set(sources[2:]) == {"replay"}
    assert fresh.calls == 2 and len(full.buffer) == 4


def test_replayed_batches_come_from_the_buffer():
    regime = build_regime(RegimeConfig("adaptive_off_policy", init_threshold=1.0, capacity=2), PAD, seed=1)
    gt = rollout([[1, 2], [3]])
    regime.training_sequences({}, gt, FreshCounter(), 1.0)
    stored = {(tuple(prompt), tuple(response)) for prompt, response in regime.buffer}
    step = regime.training_sequences({}, gt, FreshCounter(), 1.0)
    replayed = step.sequences
    assert step.source == "replay" and replayed.batch_size == gt.batch_size and step.teacher_logits is None
    prompts, responses = replayed.to_token_lists()
    assert {(tuple(prompt), tuple(response)) for prompt, response in zip(prompts, responses)} <= stored


def test_buffer_evicts_oldest_at_capacity():
    regime = build_regime(RegimeConfig("adaptive_off_policy", init_threshold=1.0, capacity=3), PAD)
    fresh = FreshCounter()
    for _ in range(3):
        regime.training_sequences({}, rollout([[1], [2]]), fresh, 0.0)  # progress 0: always fresh at t = 1
    assert len(regime.buffer) == 3
    assert [response for _, response in regime.buffer] == [[102, 201], [103, 200], [103, 201]]


def test_decreasing_schedule_lowers_the_fresh_share():
    config = RegimeConfig("adaptive_off_policy", init_threshold=0.8, capacity=1)
    early = build_regime(config, PAD, seed=0)
    late = build_regime(config, PAD, seed=0)
    early_sources, late_sources = draw(early, 400, progress=0.0), draw(late, 400, progress=0.9)
    # fresh with probability t·(1 − progress) once the one-slot buffer is full: 0.8 early, 0.08 late
    assert early_sources.count("fresh") / 400 == pytest.approx(0.8, abs=0.06)
    assert late_sources.count("fresh") / 400 == pytest.approx(0.08, abs=0.04)
    assert late_sources.count("replay") / 400 == pytest.approx(0.72, abs=0.06)


def test_mixed_uses_fresh_outputs_with_probability_lmbda():
    for lmbda in (0.0, 0.3, 1.0):
        sources = draw(build_regime(RegimeConfig("mixed", lmbda=lmbda), PAD, seed=2), 500)
        assert sources.count("fresh") / 500 == pytest.approx(lmbda, abs=0.05)


def test_state_dict_resumes_the_same_choices():
    config = RegimeConfig("adaptive_off_policy", init_threshold=0.5, capacity=3)
    a = build_regime(config, PAD, seed=4)
    draw(a, 7, progress=0.3)
    a.on_validation_loss(1.0)
    b = build_regime(config, PAD, seed=99)
    b.load_state_dict(a.state_dict())
    assert draw(a, 30, progress=0.5) == draw(b, 30, progress=0.5)
    assert list(a.buffer) == list(b.buffer)


def examples(n: int):
    return [SimpleNamespace(index=i, prompt_ids=[7, i + 10]) for i in range(n)]


def test_teacher_cache_is_built_once_reused_and_rebuilt_for_other_prompts(tmp_path):
    path = tmp_path / "teacher_responses.pt"
    calls = []

    def generate(chunk):
        calls.append(len(chunk))
        return [[e.index + 50, e.index + 60] for e in chunk]

    regime = build_regime(RegimeConfig("teacher_generated"), PAD)
    regime.ensure_cache(path, examples(5), generate, batch_size=2, identity={"teacher": "a"})
    assert calls == [2, 2, 1] and path.is_file()
    assert regime.responses == {i: [i + 50, i + 60] for i in range(5)}

    reused = build_regime(RegimeConfig("teacher_generated"), PAD)
    reused.ensure_cache(path, examples(5), generate, batch_size=2, identity={"teacher": "a"})
    assert calls == [2, 2, 1] and reused.responses == regime.responses

    other = build_regime(RegimeConfig("teacher_generated"), PAD)
    other.ensure_cache(path, examples(5), generate, batch_size=2, identity={"teacher": "b"})
    assert calls == [2, 2, 1, 2, 2, 1]

    gt = rollout([[1], [2]], prompts=[[7, 13], [7, 11]])
    step = other.training_sequences({"example_index": torch.tensor([3, 1])}, gt, FreshCounter(), 0.0)
    assert step.source == "teacher"
    assert step.sequences.to_token_lists() == ([[7, 13], [7, 11]], [[53, 63], [51, 61]])
    with pytest.raises(RuntimeError, match=r"no cached teacher response for training examples \[9\]"):
        other.training_sequences({"example_index": torch.tensor([9, 1])}, gt, FreshCounter(), 0.0)


def steps(regime, n: int) -> None:
    """``n`` training steps as the module runs them: choose the sequences, then log the step."""
    gt = rollout([[1, 2], [3]])
    for _ in range(n):
        regime.step_metrics(regime.training_sequences({}, gt, FreshCounter(), 0.0))


def test_never_sampled_message_names_the_regime_setting_and_scrg():
    mixed = build_regime(RegimeConfig(name="mixed", lmbda=0.0), pad_token_id=0)
    steps(mixed, 3)
    assert mixed.source_counts["ground_truth"] == 3
    message = mixed.never_sampled_message(scrg_on=False)
    assert "in 3 steps (regime mixed, lmbda 0)" in message and "SCRG" not in message
    assert "SCRG never ran" in mixed.never_sampled_message(scrg_on=True)
    fresh = build_regime(RegimeConfig(name="on_policy"), pad_token_id=0)
    steps(fresh, 1)
    assert fresh.never_sampled_message(scrg_on=True) is None
    ground_truth = build_regime(RegimeConfig(name="ground_truth"), pad_token_id=0)
    steps(ground_truth, 2)
    assert ground_truth.never_sampled_message(scrg_on=True) is None  # cannot sample: nothing to say
    restored = build_regime(RegimeConfig(name="mixed", lmbda=0.0), pad_token_id=0)
    restored.load_state_dict(mixed.state_dict())
    assert restored.source_counts == mixed.source_counts


@pytest.mark.parametrize("key", ["lmbda", "init_threshold", "threshold_step"])
def test_regime_config_names_the_probability_out_of_range(key):
    with pytest.raises(ValueError, match=rf"^{key} must be in \[0, 1\], got 1.5$"):
        RegimeConfig(**{key: 1.5})
