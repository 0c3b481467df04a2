"""What a checkpoint holds besides weights, optimizer and data position: the regime and the RNGs.

``ResumeState`` (a callback the module adds itself) saves both per rank under the checkpoint keys
``regime`` and ``rng_states``: each rank's replay buffer holds its own sequences, and dropout and any
draw from the global RNG continue as in an uninterrupted run on every rank. The RNG states are
restored when training starts rather than at load time, so that set-up between the two does not
draw from the restored streams.
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import torch

from mgsr_lightning.distributed import gather_per_rank


class ResumeState(L.Callback):
    """Saves and restores ``pl_module.regime``'s state and every rank's RNG states."""

    def __init__(self) -> None:
        self._rng_states_to_restore: dict[str, Any] | None = None

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
