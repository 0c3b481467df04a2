"""Sampling seeds: each a function of the training seed and the row's identity only."""

from __future__ import annotations

import torch

from mgsr_lightning.seeding import derive_seeds, example_seeds, rollout_seeds


def test_example_seeds_are_seed_times_stride_plus_index():
    assert example_seeds(10, torch.tensor([0, 1, 7])).tolist() == [10_000_030, 10_000_031, 10_000_037]


def test_rollout_seeds_are_disjoint_across_batches_and_ranks():
    seen = set()
    for batch_index in range(3):
        for rank in range(2):
            seeds = rollout_seeds(5, batch_index, 4, rank=rank, world_size=2).tolist()
            assert len(seeds) == 4 and not seen & set(seeds)
            seen |= set(seeds)
    assert rollout_seeds(0, 1, 4).tolist() == [4, 5, 6, 7]


def test_derived_seeds_depend_on_the_row_round_and_purpose_only():
    seeds = torch.tensor([3, 4])
    regenerate = derive_seeds(seeds, 0, "regenerate")
    assert derive_seeds(seeds[1:], 0, "regenerate").tolist() == regenerate[1:].tolist()
    assert not set(regenerate.tolist()) & set(derive_seeds(seeds, 0, "teacher_token").tolist())
    assert not set(regenerate.tolist()) & set(derive_seeds(seeds, 1, "regenerate").tolist())
