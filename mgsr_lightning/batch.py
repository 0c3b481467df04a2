"""The batch contract: one ``Rollout`` layout for every forward pass, with its padding and packing.

Ground-truth batches, student rollouts, replayed and SCRG-revised sequences all share it:

    prompt_ids     [B, P]  pad pad x1 x2 x3        prompt_mask   [B, P]  0 0 1 1 1
    response_ids   [B, R]  y1 y2 EOS pad           response_mask [B, R]  1 1 1 0

and every model forward sees it through ``Rollout.model_inputs()``:

    input_ids       [B, P+R]   pad … pad  prompt  response  pad … pad
    attention_mask  [B, P+R]   0 … 0      1 … 1   1 … 1     0 … 0
    position_ids    [B, P+R]   0 … 0      0 1 2 …            (cumsum of the mask − 1, clamped at 0)

Prompts are left-padded (all prompts end at the same column, so generation continues from there) and
responses right-padded, so each row's real tokens are contiguous and its positions start at 0
whatever the padding; that is what makes a row's result independent of the batch it is in. Losses,
replay and teacher-logit reuse never convert between layouts.

A training step's sequences travel as :class:`TrainingSequences`: the rollout, where it came from
(:data:`Source`), and what the rollout step computed on it. A batch read with a teacher cache carries the
cache's entries under :data:`TEACHER_CACHE_KEYS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

Source = Literal["ground_truth", "fresh", "replay", "teacher"]
#: a teacher cache's entries in a batch, response-aligned: top-k ids [B, R, k], their log-probabilities [B, R, k],
#: and the log of the other tokens' mass [B, R] (:mod:`mgsr_lightning.losses.sparse_teacher` reads them)
TEACHER_CACHE_KEYS = ("teacher_top_ids", "teacher_top_logprobs", "teacher_rest_logprob")


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int, side: str) -> tuple[Tensor, Tensor]:
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


def pack_tokens(ids: Tensor, mask: Tensor, *, pad_token_id: int, side: str) -> tuple[Tensor, Tensor]:
    """Move each row's real tokens (``mask`` True) to the ``side`` ("left"/"right") end, in order.

    ``ids``/``mask`` [B, L] may have padding anywhere (e.g. a left-padded prompt followed by a
    right-padded response). Returns ``(ids, mask)`` [B, L'] with pad id elsewhere and the columns
    that are padding in every row dropped, i.e. the layout of ``Rollout.prompt_ids`` for
    side="left" and of ``Rollout.response_ids`` for side="right".
    """
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    # A stable sort on "is padding" (right) or "is real" (left) moves the tokens without reordering them.
    sort_key = mask.long() if side == "left" else (~mask).long()
    order = torch.sort(sort_key, dim=1, stable=True).indices
    packed_mask = mask.gather(1, order)
    packed_ids = ids.gather(1, order).masked_fill(~packed_mask, pad_token_id)
    width = int(mask.sum(-1).max()) if mask.numel() else 0
    if side == "left":
        return packed_ids[:, packed_ids.size(1) - width :], packed_mask[:, packed_mask.size(1) - width :]
    return packed_ids[:, :width], packed_mask[:, :width]


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """[B, L] mask → [B, L] long positions: 0 at each row's first real token, left padding held at 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


@dataclass
class Rollout:
    """Prompts with responses, in one layout that every model forward uses.

    prompt_ids [B,P] left-padded with pad id; prompt_mask [B,P] bool;
    response_ids [B,R] right-padded with pad id; response_mask [B,R] bool, True on real response
    tokens incl. the EOS that ended the response.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor

    @classmethod
    def from_token_lists(
        cls,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        pad_token_id: int,
        device: torch.device | str | None = None,
    ) -> Rollout:
        """Build the padded layout from per-row token lists (prompts left-padded, responses right-padded)."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        prompt_ids, prompt_mask = pad_sequences(prompts, pad_token_id, "left")
        response_ids, response_mask = pad_sequences(responses, pad_token_id, "right")
        return cls(prompt_ids, prompt_mask, response_ids, response_mask).to(device)

    @classmethod
    def from_batch(cls, batch: Mapping[str, object]) -> Rollout:
        """The ground-truth rollout of a collated batch (the keys ``tensors()`` writes)."""
        return cls(batch["prompt_ids"], batch["prompt_mask"], batch["response_ids"], batch["response_mask"])

    def tensors(self) -> dict[str, Tensor]:
        """The four tensors by name, as a collated batch holds them."""
        return {
            "prompt_ids": self.prompt_ids,
            "prompt_mask": self.prompt_mask,
            "response_ids": self.response_ids,
            "response_mask": self.response_mask,
        }

    def to_token_lists(self) -> tuple[list[list[int]], list[list[int]]]:
        """(prompts, responses) as lists of real token ids per row, padding removed."""
        prompts = [ids[mask].tolist() for ids, mask in zip(self.prompt_ids.cpu(), self.prompt_mask.cpu())]
        responses = [ids[mask].tolist() for ids, mask in zip(self.response_ids.cpu(), self.response_mask.cpu())]
        return prompts, responses

    @property
    def batch_size(self) -> int:
        return self.prompt_ids.size(0)

    @property
    def device(self) -> torch.device:
        return self.prompt_ids.device

    def prompt_lengths(self) -> Tensor:
        """[B] long: real prompt tokens per row."""
        return self.prompt_mask.sum(-1)

    def response_lengths(self) -> Tensor:
        """[B] long: real response tokens per row (the ending EOS included)."""
        return self.response_mask.sum(-1)

    def to(self, device: torch.device | str | None) -> Rollout:
        return Rollout(*(tensor.to(device) for tensor in self.tensors().values()))

    def select(self, rows: Tensor) -> Rollout:
        """The rollout of the given rows (an index [N] or a bool mask [B]), padding widths kept."""
        return Rollout(self.prompt_ids[rows], self.prompt_mask[rows], self.response_ids[rows], self.response_mask[rows])

    def model_inputs(self) -> dict[str, Tensor]:
        """input_ids, attention_mask (long) and position_ids, each [B, P+R]."""
        attention_mask = torch.cat([self.prompt_mask, self.response_mask], dim=1)
        return {
            "input_ids": torch.cat([self.prompt_ids, self.response_ids], dim=1),
            "attention_mask": attention_mask.long(),
            "position_ids": positions_from_mask(attention_mask),
        }


@dataclass
class TrainingSequences:
    """A step's training sequences, where they came from, and what the rollout step computed on them."""

    sequences: Rollout
    source: Source
    # Teacher response logits [B, R, V] over exactly ``sequences`` when SCRG computed them, else None.
    teacher_logits: Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # rollout timings and SCRG statistics
