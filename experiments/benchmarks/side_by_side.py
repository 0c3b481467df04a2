"""Timing of several steps side by side, shared by the benchmarks (importable as ``side_by_side`` from this
folder, the folder of the script Python runs): on a shared machine, ratios of steps timed in turn, one
repeat of each after another, are what can be compared."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def side_by_side(steps: dict[str, Callable[[], object]], repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each step, timed one repeat of each in turn after one warm-up of each."""
    for step in steps.values():
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}
