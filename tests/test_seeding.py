"""Sampling seeds: each a function of the training seed and the row's identity only."""

from __future__ import annotations

import torch

from mgsr_lightning.seeding import _mix64, counter_uniforms, derive_seeds, example_seeds, rollout_seeds


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


def test_counter_uniforms_are_splitmix64_of_seed_and_counter():
    seeds = torch.tensor([0, 1, 2**62 + 12345, -5, -(2**63)])
    for counter in (0, 7):
        expected = []
        for seed in seeds.tolist():  # the 64-bit reference in Python integers
            state = (_mix64(seed & (2**64 - 1)) + (counter + 1) * 0x9E3779B97F4A7C15) & (2**64 - 1)
            expected.append((_mix64(state) >> 11) * 2.0**-53)
        assert counter_uniforms(seeds, counter).tolist() == expected
    assert counter_uniforms(seeds[2:3], 7).tolist() == counter_uniforms(seeds, 7)[2:3].tolist()  # row by row


def test_counter_uniforms_look_uniform_and_independent():
    uniforms = counter_uniforms(torch.arange(20_000), 0)
    assert 0.0 <= float(uniforms.min()) and float(uniforms.max()) < 1.0
    assert abs(float(uniforms.mean()) - 0.5) < 0.01 and abs(float(uniforms.std()) - 12**-0.5) < 0.01
    next_draw = counter_uniforms(torch.arange(20_000), 1)
    assert abs(float(torch.corrcoef(torch.stack([uniforms, next_draw]))[0, 1])) < 0.03
