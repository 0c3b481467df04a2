"""Examples tokenised for a student and a teacher with different tokenizers: the response aligned once,
both EOS as the last group, batches with both rollouts and the alignment."""

from __future__ import annotations

import torch

from mgsr_lightning.cross_tokenizer import shared_vocabulary, token_surfaces
from mgsr_lightning.cross_tokenizer.teacher_side import aligned_groups
from mgsr_lightning.data.paired_tokens import PairedCollator, encode_paired_records
from mgsr_lightning.losses.cross_tokenizer import exact_match_loss, uld_loss

RECORDS = [
    {"instruction": "Name the capital of France.", "input": "", "output": " The capital of France is Paris."},
    {"instruction": "Describe the fox.", "input": "It is quick.", "output": " The quick brown fox jumps, 5 € heute."},
    {"instruction": "Say hello.", "input": "", "output": " Hello world"},
]


def test_each_group_spells_the_same_response_text_and_eos_ends_both(small_bpe, sentencepiece):
    examples, stats = encode_paired_records(RECORDS, small_bpe, sentencepiece)
    assert stats == {"kept": 3, "dropped_long_prompt": 0, "dropped_long_response": 0}
    student_surfaces, teacher_surfaces = token_surfaces(small_bpe), token_surfaces(sentencepiece)
    for example, record in zip(examples, RECORDS):
        assert example.student_response_ids[-1] == small_bpe.eos_token_id
        assert example.teacher_response_ids[-1] == sentencepiece.eos_token_id
        assert example.student_groups[-1] == example.teacher_groups[-1] == example.num_groups - 1
        assert example.teacher_prompt_ids[0] == sentencepiece.bos_token_id  # its template adds <s>
        assert small_bpe.decode(example.student_prompt_ids) == sentencepiece.decode(example.teacher_prompt_ids[1:])
        spelled = b""
        for group in range(example.num_groups - 1):
            student = b"".join(student_surfaces[i] for i, g in zip(example.student_response_ids, example.student_groups)
                               if g == group)
            teacher = b"".join(teacher_surfaces[i] for i, g in zip(example.teacher_response_ids, example.teacher_groups)
                               if g == group)
            assert student == teacher or student.strip() == teacher.strip()
            spelled += student
        assert spelled == record["output"].encode()


def test_rows_too_long_on_either_side_are_dropped(small_bpe, sentencepiece):
    examples, _ = encode_paired_records(RECORDS, small_bpe, sentencepiece)
    lengths = [(len(e.student_prompt_ids) + len(e.student_response_ids),
                len(e.teacher_prompt_ids) + len(e.teacher_response_ids)) for e in examples]
    limit = max(lengths[0])  # row 0 fits on both sides, exactly on its longer one
    kept, stats = encode_paired_records(RECORDS, small_bpe, sentencepiece, max_length=limit)
    expected = [i for i, pair in enumerate(lengths) if max(pair) <= limit]
    assert [e.index for e in kept] == expected
    assert stats["dropped_long_response"] == len(RECORDS) - len(expected)
    _, stats = encode_paired_records(RECORDS, small_bpe, sentencepiece, max_prompt_length=3)
    assert stats["dropped_long_prompt"] == 3


def test_a_batch_holds_both_rollouts_and_the_alignment_the_losses_take(small_bpe, sentencepiece):
    examples, _ = encode_paired_records(RECORDS, small_bpe, sentencepiece)
    batch = PairedCollator(small_bpe.pad_token_id, sentencepiece.pad_token_id)(examples)
    assert batch["student_groups"].shape == batch["response_ids"].shape
    assert batch["teacher_groups"].shape == batch["teacher_response_ids"].shape
    assert torch.equal(batch["student_groups"] >= 0, batch["response_mask"])
    assert torch.equal(batch["teacher_groups"] >= 0, batch["teacher_response_mask"])
    assert batch["group_mask"].sum(1).tolist() == [e.num_groups for e in examples]
    assert batch["teacher_prompt_mask"][:, -1].all()  # prompts left-padded
    groups = aligned_groups(batch)
    shared = shared_vocabulary(small_bpe, sentencepiece)
    student_logits = torch.randn(*batch["response_ids"].shape, len(small_bpe), requires_grad=True)
    teacher_logits = torch.randn(*batch["teacher_response_ids"].shape, len(sentencepiece))
    loss, _ = exact_match_loss(student_logits, teacher_logits, groups, shared.student_ids, shared.teacher_ids)
    loss = loss + uld_loss(student_logits, teacher_logits, groups)
    loss.backward()
    reached = student_logits.grad.abs().sum(-1) > 0
    assert torch.equal(reached, batch["response_mask"])  # every response token, EOS included, and no padding
