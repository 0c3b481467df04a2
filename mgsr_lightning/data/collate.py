"""Batching encoded examples into the batch contract (:class:`mgsr_lightning.batch.Rollout`).

A collated batch holds the rollout's four tensors by name (prompt left-padded, response
right-padded; see :mod:`mgsr_lightning.batch`), plus each example's index and reference texts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from mgsr_lightning.batch import Rollout


@dataclass
class EncodedExample:
    """One tokenised example: ``response_ids`` ends with EOS; ``references`` are the reference texts."""

    index: int
    prompt_ids: list[int]
    response_ids: list[int]
    references: list[str] = field(default_factory=list)


class InstructionCollator:
    """Collate :class:`EncodedExample` s into ``prompt_ids/prompt_mask`` (left-padded),
    ``response_ids/response_mask`` (right-padded), ``example_index`` ``[B]`` and ``references``
    (a list of B lists of reference texts, for generation metrics)."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, examples: Sequence[EncodedExample]) -> dict[str, torch.Tensor | list[list[str]]]:
        rollout = Rollout.from_token_lists(
            [e.prompt_ids for e in examples], [e.response_ids for e in examples], pad_token_id=self.pad_token_id
        )
        return {
            **rollout.tensors(),
            "example_index": torch.tensor([e.index for e in examples], dtype=torch.long),
            "references": [e.references for e in examples],
        }
