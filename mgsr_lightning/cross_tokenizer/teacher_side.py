"""A training step's teacher side when the teacher has its own tokenizer: its token sequences and the groups
that align them with the student's.

Two sources, as the training sequences come:

- **ground truth**: the paired batch (:mod:`mgsr_lightning.data.paired_tokens`) carries the teacher's own
  prompt and response ids under ``teacher_*`` keys and the alignment of the two responses;
  :func:`paired_teacher_side` reads them.
- **the student's own ids** (rollouts, replayed rollouts): the ids are spelled out as text and
  re-tokenised for the teacher (:func:`mgsr_lightning.cross_tokenizer.retokenize.align_student_ids`);
  :func:`retokenized_teacher_side` puts the result in the training step's layout.

Both return the teacher's :class:`~mgsr_lightning.batch.Rollout` (its prompt, then its response ids) and the
losses' :class:`~mgsr_lightning.losses.cross_tokenizer.AlignedGroups`, response-aligned as ``response_logits``
are: the student's ids and groups span the training sequences' response width, the teacher's its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from mgsr_lightning.batch import Rollout
from mgsr_lightning.cross_tokenizer.retokenize import align_student_ids
from mgsr_lightning.losses.cross_tokenizer import AlignedGroups

#: what a paired batch holds besides the student's rollout (``data.paired_tokens.PairedCollator``)
PAIRED_KEYS = ("teacher_prompt_ids", "teacher_prompt_mask", "teacher_response_ids", "teacher_response_mask",
               "student_groups", "teacher_groups", "group_mask", "one_to_one")


def is_paired(batch: Mapping[str, Any]) -> bool:
    """Whether a collated batch carries the teacher's tokens and the alignment."""
    return all(key in batch for key in PAIRED_KEYS)


def aligned_groups(batch: Mapping[str, Any]) -> AlignedGroups:
    """The losses' view of a paired batch's responses: ids and groups of each side, response-aligned."""
    return AlignedGroups(
        student_ids=batch["response_ids"],
        student_groups=batch["student_groups"],
        teacher_ids=batch["teacher_response_ids"],
        teacher_groups=batch["teacher_groups"],
        group_mask=batch["group_mask"],
    )


def paired_teacher_side(batch: Mapping[str, Any]) -> tuple[Rollout, AlignedGroups]:
    """The teacher's ground-truth rollout of a paired batch and the alignment of its response with the student's."""
    teacher = Rollout(batch["teacher_prompt_ids"], batch["teacher_prompt_mask"], batch["teacher_response_ids"],
                      batch["teacher_response_mask"])
    return teacher, aligned_groups(batch)


def retokenized_teacher_side(sequences: Rollout, teacher_prompt_ids: Tensor, teacher_prompt_mask: Tensor,
                             student_surfaces: dict, teacher_tokenizer, *, student_eos_id: int | None,
                             student_pad_id: int) -> tuple[Rollout, AlignedGroups]:
    """The student's responses in ``sequences`` re-tokenised for the teacher, after the teacher's own prompts
    ``teacher_prompt_ids``/``teacher_prompt_mask`` [B, Pt] (left-padded), and the alignment.

    The student's side is never re-tokenised (its loss is on the ids it sampled): its groups [B, R] cover
    ``sequences.response_ids`` column for column, −1 past each row's response.
    """
    _, responses = sequences.to_token_lists()
    _, alignment = align_student_ids(responses, student_surfaces, teacher_tokenizer, student_eos_id=student_eos_id,
                                     student_pad_id=student_pad_id)
    device = sequences.device
    width = sequences.response_ids.size(1)
    student_groups = torch.full((sequences.batch_size, width), -1, dtype=torch.long)
    aligned_width = min(width, alignment.student.groups.size(1))
    student_groups[:, :aligned_width] = alignment.student.groups[:, :aligned_width]
    teacher = Rollout(teacher_prompt_ids, teacher_prompt_mask, alignment.teacher.input_ids.to(device),
                      alignment.teacher.attention_mask.to(device))
    groups = AlignedGroups(
        student_ids=sequences.response_ids,
        student_groups=student_groups.to(device),
        teacher_ids=teacher.response_ids,
        teacher_groups=alignment.teacher.groups.to(device),
        group_mask=alignment.group_mask.to(device),
    )
    return teacher, groups
