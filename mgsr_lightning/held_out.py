"""The LightningModule's validation, test and predict steps: the student on held-out ground truth.

``HeldOutSteps`` is a mixin of :class:`mgsr_lightning.module.DistillLightningModule`: it scores the
student's response cross-entropy (``val/loss``, ``test/loss``), hands the validation loss to the
regime (DistiLLM's adaptive threshold reads it), and samples the student's answers for ``predict``.
ROUGE-L and exact match are :class:`mgsr_lightning.training.callbacks.GenerationMetrics`'. It uses the
module's ``student``, ``logits``, ``regime`` and its ``val_loss`` / ``test_loss`` metrics.
"""

from __future__ import annotations

from typing import Any

from torchmetrics import MeanMetric

from mgsr_lightning.batch import Rollout
from mgsr_lightning.losses.objective import response_cross_entropy
from mgsr_lightning.training.callbacks import generate_texts


class HeldOutSteps:
    """Validation, test and predict steps (mixed into the LightningModule)."""

    def _score_loss(self, batch: dict[str, Any], metric: MeanMetric, name: str, **log_kwargs) -> None:
        """Update and log ``metric`` with the batch's response cross-entropy."""
        ground_truth = Rollout.from_batch(batch)
        loss = response_cross_entropy(self.logits(self.student, ground_truth), ground_truth)
        metric.update(loss, weight=ground_truth.response_mask.sum())
        self.log(name, metric, batch_size=ground_truth.batch_size, **log_kwargs)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        """Validation loss (ROUGE-L and exact match: ``callbacks.GenerationMetrics``)."""
        self._score_loss(batch, self.val_loss, "val/loss", prog_bar=True)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        """Loss over the whole test split (ROUGE-L and exact match, one sampling seed: ``GenerationMetrics``).

        For the paper's protocol (five sampling seeds, several evaluation sets) use ``evaluate``.
        """
        self._score_loss(batch, self.test_loss, "test/loss")

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        """The student's sampled response to each prompt of the batch, with its example index."""
        predictions = generate_texts(self, batch)
        return [
            {"example_index": int(index), "prediction": text, "references": references}
            for index, text, references in zip(batch["example_index"].tolist(), predictions, batch["references"])
        ]

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking and self.regime is not None and self.val_loss.update_count:
            self.regime.on_validation_loss(float(self.val_loss.compute()))
