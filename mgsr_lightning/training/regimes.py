"""Which sequences a training step learns from: the data regimes of the distillation methods.

Each regime turns the current ground-truth batch into the step's *training sequences*:

- ``ground_truth``: the dataset responses (KD, RKL, JSD, TVD: pure off-policy on data).
- ``on_policy``: fresh student outputs every step (on-policy GKD, MiniLLM).
- ``mixed``: fresh student outputs with probability ``lmbda``, else ground truth (GKD, ImitKD).
- ``adaptive_off_policy``: DistiLLM's scheduler: fresh outputs with a probability that decays over
  training, a replay buffer of earlier outputs, ground truth otherwise; the threshold rises whenever
  validation loss rises.
- ``teacher_generated``: responses sampled once by the teacher and cached to disk (SeqKD).

"Fresh student outputs" come from a callable supplied by the module (the rollout step: sample, then
SCRG when it is on), so every regime runs with or without SCRG. A regime returns
``TrainingSequences``: the sequences, their source, and the teacher logits and metrics the rollout
step computed on exactly those sequences (none for ground truth, replay or cached teacher outputs).
Random draws come from a generator owned by the regime, and its state, the threshold and the replay
buffer are all in :meth:`state_dict`, so a resumed run makes the same choices an uninterrupted one
would.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from mgsr_lightning.batch import Rollout, TrainingSequences
from mgsr_lightning.training.seqkd_cache import load_or_generate_responses

log = logging.getLogger(__name__)

RegimeName = Literal["ground_truth", "on_policy", "mixed", "adaptive_off_policy", "teacher_generated"]


@dataclass
class RegimeConfig:
    """Where training sequences come from (see :mod:`mgsr_lightning.training.regimes`).

    Args:
        name: ``ground_truth``, ``on_policy``, ``mixed``, ``adaptive_off_policy`` or ``teacher_generated``.
        lmbda: ``mixed``: probability of training on fresh student outputs.
        init_threshold: ``adaptive_off_policy``: starting threshold (DistiLLM: 0.0 for GPT-2/OPT, 0.2 for OpenLLaMA2).
        threshold_step: ``adaptive_off_policy``: added to the threshold when validation loss rises.
        loss_eps: ``adaptive_off_policy``: rise of validation loss that triggers a step.
        capacity: ``adaptive_off_policy``: replay buffer size in sequences (oldest evicted first).
        replay_schedule: ``adaptive_off_policy``: ``decreasing`` (fresh-sample share decays linearly
            over training, DistiLLM's default) or ``constant`` (half the threshold throughout).
        cache_path: ``teacher_generated``: file the teacher's responses are cached in (default:
            ``teacher_responses.pt`` in the run's folder).

    The regime's random draws come from its own generator, seeded by the module's ``seed``.
    """

    name: RegimeName = "ground_truth"
    lmbda: float = 0.5
    init_threshold: float = 0.0
    threshold_step: float = 0.1
    loss_eps: float = 0.1
    capacity: int = 1000
    replay_schedule: Literal["decreasing", "constant"] = "decreasing"
    cache_path: str | None = None

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {self.capacity}")
        for key in ("lmbda", "init_threshold", "threshold_step"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"{key} must be in [0, 1], got {getattr(self, key)}")


SAMPLING_REGIMES = ("on_policy", "mixed", "adaptive_off_policy")


class NoStudentOutputsWarning(UserWarning):
    """A run whose regime can train on student outputs never did (so SCRG, when on, never ran)."""


class Regime:
    """Base regime: ground truth every step."""

    def __init__(self, config: RegimeConfig, pad_token_id: int, seed: int = 0):
        self.config = config
        self.pad_token_id = pad_token_id
        self.generator = torch.Generator().manual_seed(seed)
        self.source_counts = {source: 0 for source in ("ground_truth", "fresh", "replay", "teacher")}

    def _uniform(self) -> float:
        return torch.rand((), generator=self.generator).item()

    def training_sequences(
        self,
        batch: dict[str, torch.Tensor],
        ground_truth: Rollout,
        fresh: Callable[[], TrainingSequences],
        progress: float,
    ) -> TrainingSequences:
        """The step's training sequences; ``fresh()`` samples new ones; ``progress`` = step / total steps."""
        return TrainingSequences(ground_truth, "ground_truth")

    def on_validation_loss(self, loss: float) -> None:
        """Called once per validation run with the validation loss."""

    def metrics(self) -> dict[str, float]:
        return {}

    def step_metrics(self, step: TrainingSequences) -> dict[str, Any]:
        """What to log of a step: the rollout step's metrics, ``source/<s>`` (1 for the step's source,
        0 for the others) and ``regime/<k>`` of the regime's state. Called once per training step, it
        also counts the steps of each source (``source_counts``)."""
        self.source_counts[step.source] += 1
        sources = {f"source/{s}": float(s == step.source) for s in ("ground_truth", "fresh", "replay", "teacher")}
        return step.metrics | sources | {f"regime/{k}": v for k, v in self.metrics().items()}

    def settings(self) -> str:
        """What decides how often student outputs are used, for messages."""
        return f"regime {self.config.name}"

    def never_sampled_message(self, scrg_on: bool) -> str | None:
        """A warning when the regime could have trained on student outputs but no step did, else None."""
        steps = sum(self.source_counts.values())
        if self.config.name not in SAMPLING_REGIMES or steps == 0 or self.source_counts["fresh"] > 0:
            return None
        return (
            f"no training step used student-generated sequences in {steps} steps ({self.settings()})"
            + ("; SCRG never ran" if scrg_on else "")
            + ": this run trained on ground truth only. For short runs raise the probability "
            "(model.init_args.regime.init_threshold for adaptive_off_policy, regime.lmbda for mixed) or train longer."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "source_counts": dict(self.source_counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.source_counts.update(state.get("source_counts", {}))  # absent in older checkpoints


class OnPolicy(Regime):
    def training_sequences(self, batch, ground_truth, fresh, progress):
        return fresh()


class Mixed(Regime):
    def settings(self) -> str:
        return f"regime mixed, lmbda {self.config.lmbda:g}"

    def training_sequences(self, batch, ground_truth, fresh, progress):
        if self._uniform() < self.config.lmbda:
            return fresh()
        return TrainingSequences(ground_truth, "ground_truth")


class AdaptiveOffPolicy(Regime):
    """DistiLLM's adaptive off-policy scheduler with a replay buffer of (revised) student outputs.

    Each step draws ``r ~ U(0, 1)`` and, with ``t`` the threshold and ``s = t·(1 − progress)``
    (``decreasing``) or ``t/2`` (``constant``):
    ``r < s`` or (``r < t`` and the buffer is not full) → fresh outputs, pushed into the buffer;
    ``r < t`` → a batch replayed from the buffer; otherwise the ground-truth batch.
    """

    def __init__(self, config: RegimeConfig, pad_token_id: int, seed: int = 0):
        super().__init__(config, pad_token_id, seed)
        self.threshold = config.init_threshold
        self.previous_val_loss: float | None = None
        self.buffer: deque[tuple[list[int], list[int]]] = deque(maxlen=config.capacity)  # (prompt, response) ids

    def training_sequences(self, batch, ground_truth, fresh, progress):
        c = self.config
        fresh_share = self.threshold * (1.0 - progress) if c.replay_schedule == "decreasing" else self.threshold / 2
        draw = self._uniform()
        if draw < fresh_share or (draw < self.threshold and len(self.buffer) < c.capacity):
            outputs = fresh()
            self.buffer.extend(zip(*outputs.sequences.to_token_lists()))
            return outputs
        if draw < self.threshold:
            picks = torch.randint(len(self.buffer), (ground_truth.prompt_ids.shape[0],), generator=self.generator)
            prompts, responses = zip(*(self.buffer[i] for i in picks.tolist()))
            replayed = Rollout.from_token_lists(
                prompts, responses, pad_token_id=self.pad_token_id, device=ground_truth.device
            )
            return TrainingSequences(replayed, "replay")
        return TrainingSequences(ground_truth, "ground_truth")

    def settings(self) -> str:
        return (f"regime adaptive_off_policy, threshold {self.config.init_threshold:g} at the start and "
                f"{self.threshold:g} at the end")

    def on_validation_loss(self, loss: float) -> None:
        if self.previous_val_loss is not None and loss >= self.previous_val_loss + self.config.loss_eps:
            self.threshold = min(1.0, self.threshold + self.config.threshold_step)
            log.info("validation loss rose to %.4f: adaptive threshold now %.2f", loss, self.threshold)
        # DistiLLM compares with the last loss that moved the threshold or the first one seen
        if self.previous_val_loss is None or loss >= self.previous_val_loss + self.config.loss_eps:
            self.previous_val_loss = loss

    def metrics(self) -> dict[str, float]:
        return {"threshold": self.threshold, "buffer_size": float(len(self.buffer))}

    def state_dict(self) -> dict[str, Any]:
        return dict(
            super().state_dict(), threshold=self.threshold, previous_val_loss=self.previous_val_loss,
            buffer=list(self.buffer),
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.threshold = state["threshold"]
        self.previous_val_loss = state["previous_val_loss"]
        self.buffer = deque(state["buffer"], maxlen=self.config.capacity)


class TeacherGenerated(Regime):
    """SeqKD: train on the teacher's own responses, generated once and cached to disk
    (:mod:`mgsr_lightning.training.seqkd_cache`: rebuilt when made for other prompts or another teacher)."""

    def __init__(self, config: RegimeConfig, pad_token_id: int, seed: int = 0):
        super().__init__(config, pad_token_id, seed)
        self.responses: dict[int, list[int]] = {}

    def ensure_cache(
        self,
        path: str | Path,
        examples: list,
        generate: Callable[[list], list[list[int]]],
        batch_size: int,
        identity: dict[str, Any],
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        """Load the cache at ``path``, or build it: ``generate(examples_chunk)`` answers each example
        (:func:`mgsr_lightning.training.seqkd_cache.load_or_generate_responses`)."""
        self.responses = load_or_generate_responses(path, examples, generate, batch_size, identity, rank, world_size)

    def training_sequences(self, batch, ground_truth, fresh, progress):
        indices = batch["example_index"].tolist()
        missing = [i for i in indices if i not in self.responses]
        if missing:
            raise RuntimeError(f"no cached teacher response for training examples {missing[:5]}; rebuild the cache")
        prompts, _ = ground_truth.to_token_lists()
        responses = [self.responses[i] for i in indices]
        sequences = Rollout.from_token_lists(
            prompts, responses, pad_token_id=self.pad_token_id, device=ground_truth.device
        )
        return TrainingSequences(sequences, "teacher")


REGIMES: dict[str, type[Regime]] = {
    "ground_truth": Regime,
    "on_policy": OnPolicy,
    "mixed": Mixed,
    "adaptive_off_policy": AdaptiveOffPolicy,
    "teacher_generated": TeacherGenerated,
}


def build_regime(config: RegimeConfig, pad_token_id: int, seed: int = 0) -> Regime:
    return REGIMES[config.name](config, pad_token_id, seed)
