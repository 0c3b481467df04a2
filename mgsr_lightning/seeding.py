"""Every sampling seed of the package, each a function of a training seed and a row's identity only.

So a row's sample never depends on the batch it is in, the batch size, the number of ranks or
whether the run was resumed:

- ``example_seeds``: evaluation, validation, SeqKD's teacher answers: ``seed * SEED_STRIDE + index``;
- ``rollout_seeds``: student rollouts of one training batch: a function of (seed, batch, rank, row);
- ``derive_seeds``: SCRG's per-round streams, unrelated to the rollout's own.

A row's seed is turned into random numbers without generator state: ``counter_uniforms(seeds, i)``
is the i-th uniform of each row's stream, a SplitMix64 hash of (seed, i), computed for the whole
batch in a few integer tensor operations (the decode loop's draw ``i`` is its ``i``-th token).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

SEED_STRIDE = 1_000_003  # a prime larger than any evaluation set, so (seed, index) pairs never collide
_MASK64 = (1 << 64) - 1
_PURPOSES = {"regenerate": 1, "teacher_token": 2}
_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment: the i-th state of a stream is key + (i + 1)·γ


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 that holds it."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


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


def _shift_right(values: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 ``values`` (torch's ``>>`` is arithmetic on signed integers)."""
    return (values >> bits) & ((1 << (64 - bits)) - 1)


def _mix64_tensor(values: Tensor) -> Tensor:
    """``_mix64`` on an int64 tensor: products wrap modulo 2^64 as in the 64-bit reference."""
    values = (values ^ _shift_right(values, 30)) * _signed(0xBF58476D1CE4E5B9)
    values = (values ^ _shift_right(values, 27)) * _signed(0x94D049BB133111EB)
    return values ^ _shift_right(values, 31)


def counter_uniforms(seeds: Tensor, counter: int) -> Tensor:
    """[B] float64 uniforms in [0, 1): draw ``counter`` of each row's stream, a function of (seeds[b], counter) only.

    SplitMix64: the stream of seed s has states mix(s) + (i + 1)·γ and outputs mix(state); the top
    53 bits of an output make the uniform. No generator objects, no state to carry between draws.
    """
    state = _mix64_tensor(seeds.long()) + _signed((counter + 1) * _GAMMA)
    return _shift_right(_mix64_tensor(state), 11).double() * 2.0**-53


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
