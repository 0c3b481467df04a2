"""SCRG's cut-and-continue: write the teacher's token at each row's error, drop what follows, and let the
student re-generate the rest in one batched ``sample`` call (:func:`mgsr_lightning.scrg.revise.revise` runs the rounds).

The re-generation continues from the student's scoring forward: its KV cache over ``prompt + response``
is cut at each row's error and realigned to the left-padded ``prompt + response[:j]``
(``kv_cache.realigned_cache``), so only the teacher's token and the new tokens go through the student.
With the decode loop's static cache, that prefix is copied once into the preallocated cache.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mgsr_lightning.batch import Rollout, pack_tokens
from mgsr_lightning.distributed import any_rank
from mgsr_lightning.generation.decode import Decoding, sample
from mgsr_lightning.generation.kv_cache import realigned_cache
from mgsr_lightning.generation.sampling import token_id_tensor
from mgsr_lightning.scrg.error_search import ErrorPositions


def correct_and_regenerate(
    student: nn.Module,
    rollout: Rollout,
    errors: ErrorPositions,
    decoding: Decoding,
    seeds: Tensor | None,
    student_cache=None,
) -> tuple[Rollout, Tensor]:
    """Write the teacher token at each error, drop what follows, re-generate; returns (rollout, [B] new tokens).

    ``student_cache``: the student's KV cache over ``rollout.model_inputs()``; when given (and
    realignable) the re-generation continues from it instead of re-encoding the kept prefix.
    """
    pad_token_id, synced = decoding.pad_token_id, decoding.synced
    batch_size, response_width = rollout.response_ids.shape
    device = rollout.device
    columns = torch.arange(response_width, device=device)[None, :]  # [1, R]
    error_at = errors.positions[:, None]  # [B, 1]
    has_error = errors.has_error[:, None]

    # Corrected rows keep response[:j] and the teacher token at j; other rows keep everything.
    keep = rollout.response_mask & (~has_error | (columns <= error_at))  # [B, R]
    prefix_ids = torch.where(has_error & (columns == error_at), errors.teacher_tokens[:, None], rollout.response_ids)
    prefix_ids = prefix_ids.masked_fill(~keep, pad_token_id)  # [B, R]

    # The budget the rollout was sampled under: max_new_tokens response tokens, max_length in all.
    prompt_lengths = rollout.prompt_lengths()
    length_caps = prompt_lengths + decoding.sampling.max_new_tokens  # [B] most prompt + response tokens
    if decoding.max_length is not None:
        length_caps = length_caps.clamp_max(decoding.max_length)
    needs_regeneration = (
        errors.has_error
        & ~torch.isin(errors.teacher_tokens, token_id_tensor(decoding.eos_token_id, device))
        & (prompt_lengths + keep.sum(-1) < length_caps)
    )  # [B]

    continuation_ids = rollout.response_ids.new_full((batch_size, 0), pad_token_id)  # [B, C]
    continuation_mask = keep.new_zeros(batch_size, 0)
    if any_rank(needs_regeneration.any(), synced):
        # Synced: every row takes part (the others with no budget) so that all ranks run the same forwards.
        rows = torch.arange(batch_size, device=device) if synced else needs_regeneration.nonzero().squeeze(-1)  # [N]
        contexts_end = prompt_lengths + keep.sum(-1)
        caps = torch.where(needs_regeneration, length_caps, contexts_end)[rows]
        # The new prompts (prompt + corrected prefix) differ in length: re-left-pad them.
        context_ids, context_mask = pack_tokens(
            torch.cat([rollout.prompt_ids, prefix_ids], dim=1)[rows],
            torch.cat([rollout.prompt_mask, keep], dim=1)[rows],
            pad_token_id=pad_token_id,
            side="left",
        )  # [N, L], L = the longest prompt + corrected prefix
        cache = None
        if student_cache is not None and context_ids.size(1) > 1:
            cached_columns = _cached_columns(rollout.prompt_mask, keep, rows, context_ids.size(1) - 1)
            cache = realigned_cache(student_cache, rows, cached_columns)
        continuation = sample(
            student, context_ids, context_mask, decoding, seeds=seeds[rows] if seeds is not None else None,
            max_length=caps, cache=cache,
        )
        continuation_ids = continuation_ids.new_full((batch_size, continuation.response_ids.size(1)), pad_token_id)
        continuation_mask = continuation_mask.new_zeros(batch_size, continuation.response_ids.size(1))
        continuation_ids[rows] = continuation.response_ids
        continuation_mask[rows] = continuation.response_mask

    response_ids, response_mask = pack_tokens(
        torch.cat([prefix_ids, continuation_ids], dim=1),
        torch.cat([keep, continuation_mask], dim=1),
        pad_token_id=pad_token_id,
        side="right",
    )  # [B, R'], R' = the longest revised response
    revised = Rollout(rollout.prompt_ids, rollout.prompt_mask, response_ids, response_mask)
    return revised, continuation_mask.sum(-1)


def _cached_columns(prompt_mask: Tensor, keep: Tensor, rows: Tensor, width: int) -> Tensor:
    """[N, width] columns of ``model_inputs()`` whose cached keys make the context of each row in ``rows``
    less its last token: prompt + kept response without the last kept column (the teacher's token,
    not yet encoded), left-packed as ``pack_tokens`` packs the context."""
    real = torch.cat([prompt_mask, keep], dim=1)[rows]  # [N, P+R]
    last_real = real.size(1) - 1 - real.flip(1).long().argmax(1)  # [N]
    cached = real.clone()
    cached[torch.arange(real.size(0), device=real.device), last_real] = False
    cached_first, order = torch.sort(cached.long(), dim=1, stable=True)  # real columns last, in order
    # the left-padding slots are masked: they read column 0, which every cache has (a decode loop's cache
    # ends before the rollout's last column)
    return order[:, real.size(1) - width :].masked_fill(cached_first[:, real.size(1) - width :] == 0, 0)
