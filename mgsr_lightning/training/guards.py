"""Callbacks the CLI adds to every run: stop on a non-finite loss before it reaches the weights."""

from __future__ import annotations

import lightning as L
import torch

from mgsr_lightning.errors import NonFiniteLossError


class NonFiniteLossGuard(L.Callback):
    """Stop training when the loss is NaN or infinite, before its backward pass and optimizer step.

    The weights, and every checkpoint written so far, stay as they were after the last good step;
    the error names the step, the batch and the latest checkpoint to resume from. All ranks agree
    on the decision, so DDP ranks stop together instead of waiting on each other.
    """

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        finite = bool(torch.isfinite(loss.detach()).all())
        if trainer.world_size > 1:
            finite = trainer.strategy.reduce_boolean_decision(finite, all=True)
        if finite:
            return
        callbacks = trainer.checkpoint_callbacks
        saved = ([getattr(cb, "last_model_path", "") for cb in callbacks]
                 + [getattr(cb, "best_model_path", "") for cb in callbacks])
        latest = next((path for path in saved if path), None)  # the latest state first: it is what a resume wants
        kept = f"last good checkpoint: {latest}" if latest else "no checkpoint was written yet"
        raise NonFiniteLossError(
            f"the training loss is {float(loss.detach().float().reshape(-1)[0])} at step {trainer.global_step} "
            f"(batch {trainer.fit_loop.epoch_loop.batch_idx} of epoch {trainer.current_epoch}); training stopped "
            f"before that update; {kept}. Lower optimizer.lr, raise trainer.gradient_clip_val "
            "or check that batch's data"
        )
