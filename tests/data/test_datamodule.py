import json

import pytest
import torch

from mgsr_lightning.data.datamodule import InstructionDataModule, ResumableSampler, encode_records
from mgsr_lightning.data.templates import render_prompt


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [
    {"instruction": "Reverse the word.", "input": "apple", "output": "elppa"},
    {"instruction": "What is the capital of France?", "input": "", "output": "The capital of France is Paris."},
    {"instruction": "Add 12 and 30.", "input": "", "output": "12 plus 30 is 42."},
    {"instruction": "Sort these numbers.", "input": "9 3 7 1", "output": "1 3 7 9"},
]


@pytest.fixture
def datamodule(tmp_path, tiny_tokenizer_dir):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS * 3)
    module = InstructionDataModule(tokenizer=str(tiny_tokenizer_dir), train_data=train, val_size=4, batch_size=3,
                                   max_length=320, max_prompt_length=256)
    module.setup("fit")
    return module


def test_batch_layout_prompt_left_response_right_with_eos(datamodule):
    tokenizer = datamodule.tokenizer
    batch = next(iter(datamodule.val_dataloader()))
    pad = tokenizer.pad_token_id
    for row in range(batch["prompt_ids"].shape[0]):
        record = datamodule.datasets["val"].records[batch["example_index"][row]]
        prompt_mask, response_mask = batch["prompt_mask"][row], batch["response_mask"][row]
        prompt = batch["prompt_ids"][row][prompt_mask].tolist()
        response = batch["response_ids"][row][response_mask].tolist()
        assert prompt == tokenizer(render_prompt(record))["input_ids"]
        assert response == tokenizer(record["output"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        # left padding: real prompt tokens end at the last column; right padding: response starts at 0
        assert bool(prompt_mask[-1]) and prompt_mask.long().diff().min() >= 0
        assert bool(response_mask[0]) and response_mask.long().diff().max() <= 0
        assert (batch["prompt_ids"][row][~prompt_mask] == pad).all()
        assert batch["references"][row] == [record["output"]]


def test_prompt_tokens_never_in_the_loss(datamodule):
    """The SFT loss sees response tokens only: prompt tokens have no logit in it, padding no weight."""
    from mgsr_lightning.batch import Rollout
    from mgsr_lightning.losses.objective import response_cross_entropy

    batch = next(iter(datamodule.train_dataloader()))
    rollout = Rollout.from_batch(batch)
    vocab = len(datamodule.tokenizer)
    logits = torch.randn(*rollout.response_ids.shape, vocab)
    expected = torch.stack([
        -logits[b, r].log_softmax(-1)[rollout.response_ids[b, r]]
        for b in range(logits.shape[0]) for r in range(logits.shape[1]) if rollout.response_mask[b, r]
    ]).mean()
    torch.testing.assert_close(response_cross_entropy(logits, rollout), expected)
    noisy = logits.masked_fill(~rollout.response_mask[..., None], 1e4)  # garbage where padding is
    torch.testing.assert_close(response_cross_entropy(noisy, rollout), expected)
    empty = Rollout.from_batch({**batch, "response_mask": torch.zeros_like(batch["response_mask"])})
    assert response_cross_entropy(logits, empty).item() == 0.0


def test_validation_split_holds_out_first_rows(datamodule):
    assert [r["output"] for r in datamodule.datasets["val"].records] == [r["output"] for r in ROWS]
    assert len(datamodule.datasets["train"]) == 8


def test_length_policy_drops_and_counts(tiny_tokenizer):
    long_prompt = {"instruction": "word " * 400, "input": "", "output": "x"}
    long_response = {"instruction": "short", "input": "", "output": "word " * 400}
    kwargs = dict(template="plain", eos_token_id=0, max_length=400, max_prompt_length=300)
    examples, stats = encode_records([ROWS[0], long_prompt, long_response], tiny_tokenizer, **kwargs)
    assert [e.index for e in examples] == [0]
    assert stats == {"kept": 1, "dropped_long_prompt": 1, "dropped_long_response": 1, "truncated_response": 0}
    examples, stats = encode_records([long_response], tiny_tokenizer, overlong="truncate", **kwargs)
    assert stats["truncated_response"] == 1
    assert len(examples[0].prompt_ids) + len(examples[0].response_ids) == 400
    assert examples[0].response_ids[-1] == 0  # EOS kept after truncation


def test_max_prompt_length_must_be_below_max_length(tiny_tokenizer_dir):
    with pytest.raises(ValueError, match="max_prompt_length"):
        InstructionDataModule(tokenizer=str(tiny_tokenizer_dir), max_length=64, max_prompt_length=64)


def test_wrong_tokenizer_path_is_clear(tmp_path):
    with pytest.raises(OSError, match="could not load a tokenizer"):
        InstructionDataModule(tokenizer=str(tmp_path / "missing"))


def test_resumable_sampler_continues_the_same_order():
    sampler = ResumableSampler(10, seed=3)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler._skip = 4
    assert list(sampler) == full[4:]
    assert list(sampler) == full  # the skip applies to one pass only
    sampler.set_epoch(3)
    assert list(sampler) != full and sorted(sampler) == list(range(10))


@pytest.mark.parametrize("size, consumed_batches", [(10, 1), (11, 2), (7, 0)])
def test_resumable_sampler_shards_and_resumes_across_ranks(size, consumed_batches):
    """Two ranks, batch 2: a resumed epoch gives each rank exactly the rest of what it would have had."""
    batch, world = 2, 2
    ranks = [ResumableSampler(size, seed=1, num_replicas=world, rank=r) for r in range(world)]
    uninterrupted = [list(s) for s in ranks]
    assert len(uninterrupted[0]) == len(uninterrupted[1]) == len(ranks[0])
    assert sorted(set(uninterrupted[0] + uninterrupted[1])) == list(range(size))  # every example, padding aside
    for rank, sampler in enumerate(ranks):
        sampler._skip = consumed_batches * batch * world
        assert list(sampler) == uninterrupted[rank][consumed_batches * batch :]
