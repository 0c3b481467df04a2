"""SeqKD's cache of teacher responses on disk: built once, reused while it matches its prompts and teacher.

The file maps each training example's index to the teacher's response ids and records a
fingerprint of the prompts and of what answered them (teacher, sampling, lengths, seed), so a cache
made for other data or another teacher is rebuilt, never reused silently. The regime that trains on
it is :class:`mgsr_lightning.training.regimes.TeacherGenerated`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from mgsr_lightning.distributed import gather_per_rank

log = logging.getLogger(__name__)


def cache_fingerprint(prompts: Iterable[list[int]], identity: dict[str, Any]) -> str:
    """Hash of the prompts and of what produced the responses (teacher, sampling, lengths, seed)."""
    digest = hashlib.sha256(repr(sorted(identity.items())).encode())
    for prompt in prompts:
        digest.update(repr(prompt).encode())
    return digest.hexdigest()[:16]


def load_or_generate_responses(
    path: str | Path,
    examples: list,
    generate: Callable[[list], list[list[int]]],
    batch_size: int,
    identity: dict[str, Any],
    rank: int = 0,
    world_size: int = 1,
) -> dict[int, list[int]]:
    """The responses cached at ``path``, or new ones: ``generate(examples_chunk)`` answers each example.

    With several ranks each generates a share (all ranks run the same number of batches, as
    sharded models need) and the shares are gathered; rank 0 writes the file.
    """
    path = Path(path)
    fingerprint = cache_fingerprint((e.prompt_ids for e in examples), identity)
    if path.is_file():
        cached = torch.load(path, weights_only=True)
        if cached.get("fingerprint") == fingerprint:
            log.info("loaded %d teacher responses from %s", len(cached["responses"]), path)
            return cached["responses"]
        log.warning("%s was made for other prompts or another teacher; generating the responses again", path)
    from tqdm.auto import tqdm

    share = examples[rank::world_size]
    n_batches = -(-len(examples) // (batch_size * world_size))  # the same on every rank
    responses: dict[int, list[int]] = {}
    starts = range(0, n_batches * batch_size, batch_size)
    for start in tqdm(starts, desc="teacher responses (SeqKD)", disable=rank != 0):
        chunk = share[start : start + batch_size] or share[-1:]  # a rank out of examples repeats one
        for example, response in zip(chunk, generate(chunk)):
            responses[example.index] = list(response)
    if world_size > 1:
        responses = {index: ids for part in gather_per_rank(responses) for index, ids in part.items()}
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"fingerprint": fingerprint, "responses": responses}, path)
    return responses
