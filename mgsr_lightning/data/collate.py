"""Batching encoded examples into the one layout every forward pass uses.

A batch holds the prompt **left-padded** (so that all prompts end at the same column and generation
continues from there) and the response **right-padded** after it:

    prompt_ids     [B, P]  pad pad x1 x2 x3        prompt_mask   [B, P]  0 0 1 1 1
    response_ids   [B, R]  y1 y2 EOS pad           response_mask [B, R]  1 1 1 0

Ground-truth batches, student rollouts and SCRG-revised sequences all share it
(:class:`mgsr_lightning.generation.Rollout`), so losses, replay and teacher-logit reuse never convert
between layouts. Position ids are derived from the mask, so left padding does not shift positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class EncodedExample:
    """One tokenised example: ``response_ids`` ends with EOS; ``references`` are the reference texts."""

    index: int
    prompt_ids: list[int]
    response_ids: list[int]
    references: list[str] = field(default_factory=list)


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to ``[N, max_len]`` on ``side`` ("left" or "right"); returns (ids, bool mask)."""
    width = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, sequence in enumerate(sequences):
        if not sequence:
            continue
        span = slice(width - len(sequence), width) if side == "left" else slice(0, len(sequence))
        ids[row, span] = torch.as_tensor(sequence, dtype=torch.long)
        mask[row, span] = True
    return ids, mask


class InstructionCollator:
    """Collate :class:`EncodedExample` s into ``prompt_ids/prompt_mask`` (left-padded),
    ``response_ids/response_mask`` (right-padded), ``example_index`` ``[B]`` and ``references``
    (a list of B lists of reference texts, for generation metrics)."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, examples: Sequence[EncodedExample]) -> dict[str, torch.Tensor | list[list[str]]]:
        prompt_ids, prompt_mask = pad_sequences([e.prompt_ids for e in examples], self.pad_token_id, "left")
        response_ids, response_mask = pad_sequences([e.response_ids for e in examples], self.pad_token_id, "right")
        return {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "example_index": torch.tensor([e.index for e in examples], dtype=torch.long),
            "references": [e.references for e in examples],
        }
