"""Distilling from a teacher cache: the teacher's top-k over the ground truth, computed once.

On ground-truth rows the teacher only ever produces the same logits, so ``cache-teacher`` runs it
once over the training split (:func:`write_teacher_cache`) and a run given the cache
(``data.teacher_cache``) reads them back with each batch (:func:`cached_teacher_logits`). A method
whose training sequences are always the ground truth (KD, SFT+KD, RKL, ...) then never loads the
teacher (:func:`needs_live_teacher`); a sampling method (GKD, DistiLLM, ABKD, MGSR) still loads it
for its fresh and replayed rows (SCRG needs it live) and reads the cache on its ground-truth steps.
Storage: :mod:`mgsr_lightning.data.teacher_cache`; the sparse format and its densification:
:mod:`mgsr_lightning.losses.sparse_teacher`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from mgsr_lightning.batch import Rollout
from mgsr_lightning.data.collate import EncodedExample, InstructionCollator
from mgsr_lightning.data.teacher_cache import BATCH_KEYS, TeacherCacheWriter, check_teacher
from mgsr_lightning.generation.scoring import response_logits
from mgsr_lightning.losses.sparse_teacher import densify, top_k_entries
from mgsr_lightning.training.regimes import TrainingSequences

__all__ = ["cached_teacher_logits", "check_teacher", "needs_live_teacher", "write_teacher_cache"]


def needs_live_teacher(regime_name: str, scrg_on: bool, teacher_cache: str | None) -> bool:
    """Whether a run must load the teacher: always without a cache; with one, only when some training
    sequences are not the ground truth (student samples, replay, SeqKD's generation) or SCRG is on."""
    return teacher_cache is None or regime_name != "ground_truth" or scrg_on


def cached_teacher_logits(batch: dict[str, Any], step: TrainingSequences, vocab_size: int) -> Tensor | None:
    """Teacher log-probabilities [B, R, V] of a ground-truth step from the batch's cached entries (usable as
    ``teacher_logits`` by every loss); None when the step trains on other sequences or there is no cache."""
    if step.source != "ground_truth" or BATCH_KEYS[0] not in batch:
        return None
    return densify(*(batch[key] for key in BATCH_KEYS), vocab_size)


@torch.no_grad()
def write_teacher_cache(
    teacher: nn.Module,
    examples: Sequence[EncodedExample],
    folder: str,
    *,
    top_k: int,
    vocab_size: int,
    pad_token_id: int,
    batch_size: int,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """Run ``teacher`` once over ``examples``' ground-truth responses and write each position's top-k,
    with a progress bar; returns the metadata written (``meta`` plus k, V, rows, positions, bytes)."""
    from tqdm.auto import tqdm

    device = next(teacher.parameters()).device
    collate = InstructionCollator(pad_token_id)
    writer = TeacherCacheWriter(folder)
    with tqdm(total=sum(len(e.response_ids) for e in examples), desc="teacher cache", unit="tok") as progress:
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            rollout = Rollout.from_batch(collate(chunk)).to(device)
            entries = top_k_entries(response_logits(teacher, rollout, vocab_size), top_k)
            lengths = [len(e.response_ids) for e in chunk]
            writer.write([e.index for e in chunk], lengths, *entries)
            progress.update(sum(lengths))
    return writer.close(meta | {"top_k": top_k, "vocab_size": vocab_size})
