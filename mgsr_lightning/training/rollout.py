"""The rollout step: fresh responses to a batch's prompts, the student's revised by SCRG when it is on, or
MiniLLM's teacher-mixed ones (:func:`fresh_outputs` decides which, once).

It returns the sequences together with what it computed on them: SCRG's teacher logits over
exactly the final sequences (None when SCRG is off), its correction statistics (the teacher's NLL
before and after revision among them) and the step's timings, so the training step reuses them
without hidden state.
"""

from __future__ import annotations

import time

from torch import Tensor, nn

from mgsr_lightning.batch import Rollout, TrainingSequences
from mgsr_lightning.generation.decode import DecodeState, Decoding, sample
from mgsr_lightning.losses.minillm import MiniLLMConfig
from mgsr_lightning.scrg.revise import ScrgConfig, revise
from mgsr_lightning.training.minillm_rollout import teacher_mixed_rollout


def fresh_outputs(
    student: nn.Module,
    teacher: nn.Module | None,
    prompts: Rollout,
    decoding: Decoding,
    seeds: Tensor,
    *,
    scrg: ScrgConfig | None,
    minillm: MiniLLMConfig | None,
) -> TrainingSequences:
    """A step's fresh responses to ``prompts`` (row i with ``seeds[i]``): MiniLLM's teacher-mixed samples when
    ``minillm`` mixes the teacher in (``teacher_mix`` > 0, with the teacher's logits over them), else the
    student's own, revised by SCRG when ``scrg`` is set (MiniLLM runs without SCRG)."""
    if minillm is not None and minillm.teacher_mix > 0:
        return teacher_mixed_rollout(student, teacher, prompts, decoding, minillm.teacher_mix, seeds)
    return student_rollout(student, teacher, prompts, decoding, scrg, seeds)


def student_rollout(
    student: nn.Module,
    teacher: nn.Module | None,
    prompts: Rollout,
    decoding: Decoding,
    scrg: ScrgConfig | None,
    seeds: Tensor,
) -> TrainingSequences:
    """Sample the student's response to each prompt of ``prompts`` (row i with ``seeds[i]``), then
    revise them with SCRG (``scrg`` not None). Metrics: ``rollout/seconds``, ``rollout/response_tokens``
    (mean sampled response length) and ``scrg/<stat>`` (see ``scrg.revise``)."""
    started = time.perf_counter()
    state = DecodeState() if scrg is not None else None  # its KV cache and token NLL stand in for a student forward
    rollout = sample(student, prompts.prompt_ids, prompts.prompt_mask, decoding, seeds=seeds, state=state)
    metrics = {
        "rollout/seconds": time.perf_counter() - started,
        "rollout/response_tokens": float(rollout.response_mask.sum(-1).float().mean()),
    }
    if scrg is None:
        return TrainingSequences(rollout, "fresh", metrics=metrics)
    result = revise(student, teacher, rollout, scrg, decoding, seeds=seeds, rollout_state=state)
    metrics |= {f"scrg/{k}": v for k, v in result.stats.items()}
    return TrainingSequences(result.rollout, "fresh", result.teacher_logits, metrics)
