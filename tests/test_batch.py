"""The batch contract: the Rollout layout, padding and packing, and the collated batch it reads."""

from __future__ import annotations

import torch

from mgsr_lightning.batch import Rollout, pack_tokens
from mgsr_lightning.data.collate import EncodedExample, InstructionCollator

PAD = 1


def test_rollout_layout_positions_and_rows():
    rollout = Rollout.from_token_lists([[5, 6], [7]], [[20, 0], [21, 22, 23]], pad_token_id=PAD)

    inputs = rollout.model_inputs()
    assert inputs["input_ids"].tolist() == [[5, 6, 20, 0, PAD], [PAD, 7, 21, 22, 23]]
    assert inputs["attention_mask"].tolist() == [[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert inputs["position_ids"].tolist() == [[0, 1, 2, 3, 3], [0, 0, 1, 2, 3]]
    assert rollout.prompt_lengths().tolist() == [2, 1]
    assert rollout.response_lengths().tolist() == [2, 3]
    assert rollout.to_token_lists() == ([[5, 6], [7]], [[20, 0], [21, 22, 23]])
    assert rollout.select(torch.tensor([1])).to_token_lists() == ([[7]], [[21, 22, 23]])


def test_pack_tokens_moves_real_tokens_in_order_and_trims():
    ids = torch.tensor([[PAD, 5, 6, 30, PAD], [PAD, PAD, 7, PAD, 31]])
    mask = ids != PAD

    left_ids, left_mask = pack_tokens(ids, mask, pad_token_id=PAD, side="left")
    assert left_ids.tolist() == [[5, 6, 30], [PAD, 7, 31]]
    assert left_mask.tolist() == [[True, True, True], [False, True, True]]

    right_ids, right_mask = pack_tokens(ids, mask, pad_token_id=PAD, side="right")
    assert right_ids.tolist() == [[5, 6, 30], [7, 31, PAD]]
    assert right_mask.tolist() == [[True, True, True], [True, True, False]]


def test_collated_batch_holds_the_rollout_and_reads_back_as_it():
    examples = [EncodedExample(3, [5, 6], [20, 0], ["a"]), EncodedExample(8, [7], [21, 22, 23], ["b", "c"])]
    batch = InstructionCollator(PAD)(examples)
    rollout = Rollout.from_batch(batch)
    assert rollout.to_token_lists() == ([[5, 6], [7]], [[20, 0], [21, 22, 23]])
    assert batch["prompt_ids"].tolist() == [[5, 6], [PAD, 7]]
    assert batch["response_mask"].tolist() == [[True, True, False], [True, True, True]]
    assert batch["example_index"].tolist() == [3, 8] and batch["references"] == [["a"], ["b", "c"]]
    assert all(torch.equal(batch[name], tensor) for name, tensor in rollout.tensors().items())
