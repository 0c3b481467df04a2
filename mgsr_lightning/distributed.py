"""The few collectives the package needs, each a no-op without a process group of several ranks."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import Tensor


def is_distributed() -> bool:
    """A process group of more than one rank is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world_size() -> tuple[int, int]:
    """(this process's rank, number of ranks); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def max_over_ranks(value: Tensor) -> Tensor:
    """``value`` (a tensor) reduced with max over all ranks, in place."""
    if is_distributed():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value


def any_rank(flag: Tensor, synced: bool = True) -> bool:
    """``flag`` (0-dim bool) on this rank, or on any rank of the process group when ``synced``."""
    return bool(max_over_ranks(flag.int()) if synced else flag)


def every_rank(flag: Tensor, synced: bool = True) -> bool:
    """``flag`` (0-dim bool) on this rank, or on every rank of the process group when ``synced``."""
    if synced and is_distributed():
        flag = flag.int()
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag)


def gather_per_rank(state: Any) -> list[Any]:
    """``[state of rank 0, state of rank 1, ...]`` on every rank (``[state]`` without a process group)."""
    if not is_distributed():
        return [state]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, state)
    return gathered
