"""The module's own callbacks and their config (added by ``DistillLightningModule.configure_callbacks`` from its init args).

- ``GenerationMetrics``: ROUGE-L and exact match of sampled responses, on the first
  ``validation.rouge_examples`` validation examples and on the whole test split;
- ``TeacherResponses``: SeqKD's teacher answers to every training prompt, generated once and cached;
- ``ExportStudent``: the student in Hugging Face format at the end of fit;
- ``RunHyperparameters``: the effective global batch size and the loss weights, logged once per fit.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import lightning as L
import torch

from mgsr_lightning.batch import Rollout
from mgsr_lightning.evaluation.metrics import ExactMatch, RougeL
from mgsr_lightning.export import export_student, training_settings
from mgsr_lightning.generation import decode_responses, sample
from mgsr_lightning.seeding import example_seeds

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ValidationConfig:
    """What validation measures besides the loss.

    Args:
        rouge_examples: Generate for the first N validation examples and log ``val/rougeL`` and
            ``val/exact_match`` (0 = off). Checkpoints can be selected by ``val/rougeL``.
        seed: Sampling seed of the validation generations (per example: seed and example index).
        max_new_tokens: Cap on generated tokens (default: the sampling config's).
    """

    rouge_examples: int = 64
    seed: int = 10
    max_new_tokens: int | None = None


def generate_texts(pl_module, batch: dict[str, Any]) -> list[str]:
    """The student's sampled response to each prompt of a batch (seed ``validation.seed`` and example index)."""
    decoding = pl_module.decoding.with_max_new_tokens(pl_module.validation_config.max_new_tokens)
    seeds = example_seeds(pl_module.validation_config.seed, batch["example_index"].cpu())
    rollout = sample(pl_module.student, batch["prompt_ids"], batch["prompt_mask"], decoding, seeds=seeds)
    return decode_responses(pl_module.tokenizer, rollout)


class GenerationMetrics(L.Callback):
    """Sample a response per example (seed ``validation.seed``) and log ``<stage>/rougeL`` and
    ``<stage>/exact_match`` against the references.

    Validation scores the first ``rouge_examples`` examples (the first batches of every rank,
    decided alike on all ranks, since generation is in lockstep) and skips the sanity check; test
    scores every example.
    """

    def __init__(self, rouge_examples: int):
        self.rouge_examples = rouge_examples
        self.metrics = {stage: (RougeL(), ExactMatch()) for stage in ("val", "test")}

    def _score(self, stage: str, pl_module, batch: dict[str, Any]) -> None:
        rouge_l, exact = self.metrics[stage]
        predictions = generate_texts(pl_module, batch)
        rouge_l.to(pl_module.device).update(predictions, batch["references"])
        exact.to(pl_module.device).update(predictions, batch["references"])

    def _log(self, stage: str, pl_module) -> None:
        rouge_l, exact = self.metrics[stage]
        if rouge_l.update_count:
            pl_module.log(f"{stage}/rougeL", rouge_l.compute(), prog_bar=stage == "val")
            pl_module.log(f"{stage}/exact_match", exact.compute())
        rouge_l.reset()
        exact.reset()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        examples_before = batch_idx * len(batch["references"]) * trainer.world_size
        if not trainer.sanity_checking and examples_before < self.rouge_examples:
            self._score("val", pl_module, batch)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._log("val", pl_module)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._score("test", pl_module, batch)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._log("test", pl_module)


class TeacherResponses(L.Callback):
    """SeqKD: before fit, the teacher answers every training prompt once (each rank a share), cached
    by the ``teacher_generated`` regime (``regime.cache_path``, default ``teacher_responses.pt`` in
    the run's folder). Example ``i`` is sampled with ``example_seeds(seed, i)``."""

    def on_fit_start(self, trainer, pl_module) -> None:
        datamodule = trainer.datamodule
        regime, decoding = pl_module.regime, pl_module.decoding

        def generate(examples) -> list[list[int]]:
            prompts = Rollout.from_token_lists(
                [e.prompt_ids for e in examples], [[] for _ in examples], pad_token_id=decoding.pad_token_id,
                device=pl_module.device,
            )
            seeds = example_seeds(pl_module.seed, torch.tensor([e.index for e in examples], dtype=torch.long))
            answers = sample(pl_module.teacher, prompts.prompt_ids, prompts.prompt_mask, decoding, seeds=seeds)
            return answers.to_token_lists()[1]

        path = regime.config.cache_path or f"{trainer.default_root_dir}/teacher_responses.pt"
        identity = {"teacher": pl_module.teacher_source.describe(), "sampling": dataclasses.asdict(decoding.sampling),
                    "max_length": decoding.max_length, "seed": pl_module.seed}
        regime.ensure_cache(
            path, datamodule.train_examples(), generate, datamodule.generation_batch_size, identity,
            rank=trainer.global_rank, world_size=trainer.world_size,
        )


class ExportStudent(L.Callback):
    """At the end of fit, save the student to ``folder`` in Hugging Face format: the best checkpoint's
    weights when a ``ModelCheckpoint`` monitors a metric, else the final ones."""

    def __init__(self, folder: str):
        self.folder = folder

    def on_fit_end(self, trainer, pl_module) -> None:
        checkpoint = trainer.checkpoint_callback
        best = getattr(checkpoint, "best_model_path", "") if checkpoint is not None and checkpoint.monitor else ""
        if best:
            log.info("exporting the best checkpoint %s", best)
            state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        else:
            state = trainer.strategy.lightning_module_state_dict()  # a collective under FSDP: all ranks
        if trainer.is_global_zero:
            student_state = {k[len("student."):]: v for k, v in state.items() if k.startswith("student.")}
            datamodule = trainer.datamodule
            settings = training_settings(dict(datamodule.hparams) if datamodule is not None else None,
                                         pl_module.sampling.max_new_tokens)
            export_student(pl_module.student, pl_module.tokenizer, self.folder, pl_module.eos_token_id, student_state,
                           settings)
        trainer.strategy.barrier("export")


class RunHyperparameters(L.Callback):
    """Log the effective global batch size (batch × accumulation × ranks) and each loss weight once."""

    def on_fit_start(self, trainer: L.Trainer, pl_module) -> None:
        datamodule = trainer.datamodule
        if trainer.logger is None or datamodule is None:
            return
        global_batch = datamodule.hparams.batch_size * trainer.accumulate_grad_batches * trainer.world_size
        weights = {f"weight/{name}": value for name, value in pl_module.objective.weights.items()}
        trainer.logger.log_hyperparams({"effective_global_batch_size": global_batch, **weights})
