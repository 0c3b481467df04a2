"""What a checkpoint holds besides weights, optimizer and data position, and when it is written.

``ResumeState`` (a callback the module adds itself) saves the regime and the RNG states per rank
under the checkpoint keys ``regime`` and ``rng_states``: each rank's replay buffer holds its own
sequences, and dropout and any draw from the global RNG continue as in an uninterrupted run on every
rank. The RNG states are restored when training starts rather than at load time, so that set-up
between the two does not draw from the restored streams.

``CheckpointAfterValidation``, the ``ModelCheckpoint`` every config names, writes a step-interval
checkpoint whose step is followed by validation after that validation, so that a run resumed from it
neither skips nor repeats it (see that class). ``ResumeState`` warns when a run has a plain
``ModelCheckpoint`` with ``every_n_train_steps`` instead.
"""

from __future__ import annotations

import os
import random
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from mgsr_lightning.distributed import gather_per_rank


class StepCheckpointBeforeValidationWarning(UserWarning):
    """A plain ``ModelCheckpoint`` writes step checkpoints that a resumed run cannot continue exactly."""


class ResumeState(L.Callback):
    """Saves and restores ``pl_module.regime``'s state and every rank's RNG states."""

    def __init__(self) -> None:
        self._rng_states_to_restore: dict[str, Any] | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        plain = [callback for callback in trainer.checkpoint_callbacks
                 if type(callback) is ModelCheckpoint and callback._every_n_train_steps]
        if plain:
            warnings.warn(
                "a plain ModelCheckpoint with every_n_train_steps writes a step's checkpoint before that step's "
                "validation, so a run resumed from it skips the validation (the regime's threshold, the best "
                f"checkpoint): use {CheckpointAfterValidation.__module__}.CheckpointAfterValidation, as the "
                "configs do", StepCheckpointBeforeValidationWarning, stacklevel=2)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        if pl_module.regime is not None:
            checkpoint["regime"] = gather_per_rank(pl_module.regime.state_dict())
        rng_states = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng_states["cuda"] = torch.cuda.get_rng_state_all()
        checkpoint["rng_states"] = gather_per_rank(rng_states)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        """Restore the regime now and keep this rank's RNG states for the start of training."""
        if "regime" in checkpoint:
            pl_module.regime.load_state_dict(_own_state(checkpoint["regime"], trainer.global_rank))
        if "rng_states" in checkpoint:
            self._rng_states_to_restore = _own_state(checkpoint["rng_states"], trainer.global_rank)

    def on_train_start(self, trainer, pl_module) -> None:
        states, self._rng_states_to_restore = self._rng_states_to_restore, None
        if states is not None:
            torch.set_rng_state(states["torch"])
            random.setstate(states["python"])
            if "cuda" in states and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(states["cuda"])


def _own_state(per_rank: list[Any], rank: int) -> Any:
    """This rank's entry of a per-rank list saved in a checkpoint (rank 0's on another world size)."""
    return per_rank[rank] if rank < len(per_rank) else per_rank[0]


class CheckpointAfterValidation(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``every_n_train_steps`` checkpoint of a step that validation follows
    is written at the end of that validation instead of at the end of the training batch.

    Lightning's training epoch loop writes step checkpoints in ``on_train_batch_end`` and runs the
    step's validation afterwards, in ``on_advance_end``. A checkpoint from the batch end records the
    batch as not yet completed; a run resumed from it takes the validation as already done
    (``_TrainingEpochLoop.advance`` calls ``val_loop.increment_progress_to_evaluation_end()``), so
    what validation changes (the regime's previous validation loss and threshold, the best
    checkpoint, the RNG draws of the validation loader) is lost. Written in ``on_validation_end``,
    the checkpoint holds the state after validation, and the resumed loop skips exactly that one
    validation (Lightning's "restarted on last" stage), as it does for checkpoints that monitor a
    validation metric.

    A resumed run also writes over the checkpoints that the interrupted part wrote in this folder
    after the state it resumes from (e.g. ``best-step=N.ckpt`` written just before the kill, which
    the resumed run writes again), instead of keeping both as ``best-step=N.ckpt`` and
    ``best-step=N-v1.ckpt``.

    The state key is ``ModelCheckpoint``'s, so checkpoints load into either class.
    """

    _save_after_validation = False
    _resumed_from: tuple[Path, float] | None = None

    def _generate_state_key(self, **kwargs: Any) -> str:
        return f"{ModelCheckpoint.__qualname__}{kwargs!r}"

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._save_after_validation = False
        self._resumed_from = None
        ckpt_path = trainer.ckpt_path  # set once the checkpoint is restored, before anything is written
        if ckpt_path and self.dirpath and "://" not in str(ckpt_path) and os.path.isfile(ckpt_path):
            path = Path(ckpt_path).resolve()
            if path.parent == Path(self.dirpath).resolve():
                self._resumed_from = (path, os.path.getmtime(path))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        steps = self._every_n_train_steps
        if steps >= 1 and trainer.global_step % steps == 0 and _validation_follows(trainer):
            self._save_after_validation = True
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not self._save_after_validation:
            return super().on_validation_end(trainer, pl_module)
        self._save_after_validation = False
        if not self._should_skip_saving_checkpoint(trainer):
            monitor_candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, monitor_candidates)
            self._save_last_checkpoint(trainer, monitor_candidates)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._save_after_validation and not self._should_skip_saving_checkpoint(trainer):
            self._save_after_validation = False  # validation did not come after all: the step's checkpoint now
            monitor_candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, monitor_candidates)
            self._save_last_checkpoint(trainer, monitor_candidates)
        super().on_train_end(trainer, pl_module)

    def file_exists(self, filepath, trainer) -> bool:
        exists = trainer.is_global_zero and self._fs.exists(filepath) and not self._left_by_interrupted_part(filepath)
        return bool(trainer.strategy.broadcast(exists))

    def _left_by_interrupted_part(self, filepath) -> bool:
        """Whether ``filepath`` was written after the checkpoint this run resumed from (and is not one it knows)."""
        if self._resumed_from is None or "://" in str(filepath):
            return False
        resumed_from, written_at = self._resumed_from
        path = Path(filepath).resolve()
        known = {Path(p).resolve() for p in (*self.best_k_models, self.best_model_path, self.last_model_path) if p}
        return path != resumed_from and path not in known and os.path.getmtime(path) > written_at


def _validation_follows(trainer) -> bool:
    """Whether the fit loop validates right after the current training batch (decided as the loop does)."""
    loop = trainer.fit_loop.epoch_loop
    if getattr(trainer, "_val_check_time_interval", None) is not None or getattr(loop, "_skip_next_val", False):
        return False  # time-based validation is decided after the batch
    batches = trainer.num_val_batches
    if not (sum(batches) if isinstance(batches, list) else batches):
        return False  # the validation loop would be skipped, and on_validation_end with it
    return loop._should_check_val_fx(trainer.fit_loop._data_fetcher)
