"""Examples tokenised for a student and a teacher with different tokenizers, and their batches.

Each example's response is one text, tokenised by both tokenizers and aligned on its characters
(:mod:`mgsr_lightning.cross_tokenizer.alignment`); each side then appends its own EOS, and the two EOS
form the last group (both say "the answer ends here"; the shared vocabulary pairs them by role). The
prompt is rendered per side (the ``chat`` template is the tokenizer's own) and never compared. The
alignment is computed once per example, when the data is encoded; a batch only pads it.

A batch holds the student's rollout under the usual keys (``prompt_ids``, ``prompt_mask``,
``response_ids``, ``response_mask``: the single-tokenizer contract, so the student's side of a training
step is unchanged), the teacher's under ``teacher_prompt_ids`` ..., and the alignment of the two
responses: ``student_groups`` [B, Rs], ``teacher_groups`` [B, Rt] (the group of each response token, −1
for padding), ``group_mask`` and ``one_to_one`` [B, G].
:func:`mgsr_lightning.cross_tokenizer.teacher_side.aligned_groups` turns a batch into the losses'
:class:`~mgsr_lightning.losses.cross_tokenizer.AlignedGroups` (response-aligned, as ``response_logits`` are).

Length policy: a row whose prompt on either side is longer than ``max_prompt_length``, or whose prompt +
response + EOS on either side is longer than ``max_length``, is dropped and counted (truncating would
cut the two sides at different characters; the alignment would drop the cut group, but the row's
ground truth would no longer be the same text on both sides).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mgsr_lightning.batch import Rollout, pad_sequences
from mgsr_lightning.cross_tokenizer.alignment import align_spans, require_offsets, tokenize_with_spans
from mgsr_lightning.data.templates import PromptTemplate, render_prompt


@dataclass
class PairedExample:
    """One example for both sides: prompt and response ids (the response ending with that side's EOS),
    each response token's group (EOS included, the last group), the number of groups, the references."""

    index: int
    student_prompt_ids: list[int]
    student_response_ids: list[int]
    teacher_prompt_ids: list[int]
    teacher_response_ids: list[int]
    student_groups: list[int]
    teacher_groups: list[int]
    num_groups: int
    references: list[str] = field(default_factory=list)


def encode_paired_records(
    records: Sequence[dict[str, Any]],
    student_tokenizer,
    teacher_tokenizer,
    *,
    template: PromptTemplate = "alpaca",
    max_length: int | None = None,
    max_prompt_length: int = 10**9,
    student_eos_id: int | None = None,
) -> tuple[list[PairedExample], dict[str, int]]:
    """Render, tokenise per side and align each record (module docstring); returns the examples and the
    counts ``kept``, ``dropped_long_prompt``, ``dropped_long_response``. ``student_eos_id``: the id ending the
    student's responses (default its tokenizer's EOS; the teacher's responses end with the teacher's)."""
    require_offsets(student_tokenizer, "student")
    require_offsets(teacher_tokenizer, "teacher")
    add_special = template != "chat"  # chat templates already contain BOS and role markers
    responses = [r["output"] if isinstance(r["output"], str) else r["output"][0] for r in records]
    sides = {}
    for side, tokenizer in (("student", student_tokenizer), ("teacher", teacher_tokenizer)):
        prompts = [record.get("prompt") or render_prompt(record, template, tokenizer) for record in records]
        prompt_ids = tokenizer(prompts, add_special_tokens=add_special)["input_ids"] if prompts else []
        eos_id = student_eos_id if side == "student" and student_eos_id is not None else tokenizer.eos_token_id
        sides[side] = (prompt_ids, tokenize_with_spans(tokenizer, responses, side=side), eos_id)
    stats = {"kept": 0, "dropped_long_prompt": 0, "dropped_long_response": 0}
    examples = []
    (student_prompt, student, student_eos), (teacher_prompt, teacher, teacher_eos) = sides["student"], sides["teacher"]
    for index, response in enumerate(responses):
        prompts = (student_prompt[index], teacher_prompt[index])
        if max(len(p) for p in prompts) > max_prompt_length:
            stats["dropped_long_prompt"] += 1
            continue
        if max_length is not None and (len(prompts[0]) + len(student.ids[index]) + 1 > max_length
                                       or len(prompts[1]) + len(teacher.ids[index]) + 1 > max_length):
            stats["dropped_long_response"] += 1
            continue
        student_groups, teacher_groups, cuts = align_spans(response, student.spans[index], teacher.spans[index])
        eos_group = len(cuts)
        output = records[index]["output"]
        examples.append(PairedExample(
            index=index,
            student_prompt_ids=list(prompts[0]),
            student_response_ids=[*student.ids[index], student_eos],
            teacher_prompt_ids=list(prompts[1]),
            teacher_response_ids=[*teacher.ids[index], teacher_eos],
            student_groups=[*student_groups, eos_group],
            teacher_groups=[*teacher_groups, eos_group],
            num_groups=eos_group + 1,
            references=[output] if isinstance(output, str) else list(output),
        ))
        stats["kept"] += 1
    return examples, stats


class PairedCollator:
    """Collate :class:`PairedExample` s into both sides' rollouts and the alignment (module docstring)."""

    def __init__(self, student_pad_id: int, teacher_pad_id: int):
        self.student_pad_id, self.teacher_pad_id = student_pad_id, teacher_pad_id

    def __call__(self, examples: Sequence[PairedExample]) -> dict[str, Any]:
        student = Rollout.from_token_lists([e.student_prompt_ids for e in examples],
                                           [e.student_response_ids for e in examples], pad_token_id=self.student_pad_id)
        teacher = Rollout.from_token_lists([e.teacher_prompt_ids for e in examples],
                                           [e.teacher_response_ids for e in examples], pad_token_id=self.teacher_pad_id)
        student_groups, _ = pad_sequences([e.student_groups for e in examples], -1, "right")
        teacher_groups, _ = pad_sequences([e.teacher_groups for e in examples], -1, "right")
        num_groups = max((e.num_groups for e in examples), default=0)
        group_mask = torch.zeros(len(examples), num_groups, dtype=torch.bool)
        one_to_one = torch.zeros(len(examples), num_groups, dtype=torch.bool)
        for row, example in enumerate(examples):
            student_sizes = _group_sizes(example.student_groups, num_groups)
            teacher_sizes = _group_sizes(example.teacher_groups, num_groups)
            group_mask[row] = (student_sizes > 0) & (teacher_sizes > 0)
            one_to_one[row] = (student_sizes == 1) & (teacher_sizes == 1)
        return {
            **student.tensors(),
            **{f"teacher_{name}": tensor for name, tensor in teacher.tensors().items()},
            "student_groups": student_groups,
            "teacher_groups": teacher_groups,
            "group_mask": group_mask,
            "one_to_one": one_to_one,
            "example_index": torch.tensor([e.index for e in examples], dtype=torch.long),
            "references": [e.references for e in examples],
        }


def _group_sizes(groups: list[int], num_groups: int) -> torch.Tensor:
    """Tokens per group, [num_groups]."""
    return torch.bincount(torch.tensor([g for g in groups if g >= 0], dtype=torch.long), minlength=num_groups)

