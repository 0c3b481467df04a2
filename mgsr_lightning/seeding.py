"""Every sampling seed of the package, each a function of a training seed and a row's identity only.

So a row's sample never depends on the batch it is in, the batch size, the number of ranks or
whether the run was resumed:

- ``example_seeds``: evaluation, validation, SeqKD's teacher answers: ``seed * SEED_STRIDE + index``;
- ``rollout_seeds``: student rollouts of one training batch: a function of (seed, batch, rank, row);
- ``derive_seeds``: SCRG's per-round streams, unrelated to the rollout's own.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

SEED_STRIDE = 1_000_003  # a prime larger than any evaluation set, so (seed, index) pairs never collide
_MASK64 = (1 << 64) - 1
_PURPOSES = {"regenerate": 1, "teacher_token": 2}


def example_seeds(seed: int, example_index: Tensor) -> Tensor:
    """[B] int64 generator seeds ``seed * 1_000_003 + example_index`` (example_index [B], position in its set)."""
    return seed * SEED_STRIDE + example_index.long()


def rollout_seeds(seed: int, batch_index: int, batch_size: int, *, rank: int = 0, world_size: int = 1) -> Tensor:
    """[B] int64 seeds of the rows of training batch ``batch_index`` on ``rank``.

    Batches rather than optimizer steps, so accumulated micro-batches differ; no other state, so a
    resumed run samples what the uninterrupted one would.
    """
    first_row = ((seed * SEED_STRIDE + batch_index) * world_size + rank) * batch_size
    return torch.arange(first_row, first_row + batch_size, dtype=torch.long)


def _mix64(value: int) -> int:
    """SplitMix64's finaliser: nearby inputs (seed and seed + 1, round 0 and 1) give unrelated outputs."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def derive_seeds(seeds: Tensor, round_index: int, purpose: Literal["regenerate", "teacher_token"]) -> Tensor:
    """[B] int64 seeds for one use in one SCRG round, each a function of its row's seed only.

    So a row's corrections do not depend on the batch it is in, and each round and purpose draws
    from a stream unrelated to the rollout's own (``seeds``).
    """
    tag = round_index * len(_PURPOSES) + _PURPOSES[purpose]
    derived = [_mix64((_mix64(seed & _MASK64) + tag) & _MASK64) >> 1 for seed in seeds.tolist()]  # 63 bits: int64
    return torch.tensor(derived, dtype=torch.long, device=seeds.device)


def row_generators(seeds: Tensor, device: torch.device) -> list[torch.Generator]:
    """One ``torch.Generator`` on ``device`` per row, seeded from ``seeds`` [B] int64."""
    return [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds.tolist()]
