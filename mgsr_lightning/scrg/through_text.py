"""SCRG through text: sequence correction and re-generation when the teacher has its own tokenizer.

Per round, for a batch of student rollouts:

1. the student's response ids are spelled out as text and re-tokenised for the teacher, after the
   teacher's own prompts (:func:`mgsr_lightning.cross_tokenizer.teacher_side.retokenized_teacher_side`);
2. one teacher forward scores them and the error is found on the teacher's side, at one of *its*
   positions ``j`` with its token ``c`` (:func:`mgsr_lightning.scrg.error_search.find_error_positions`
   with a criterion that reads the teacher only: ``first_unlikely`` or ``max_teacher_nll``; the student's
   distributions are over other tokens, so ``max_difference`` cannot be computed);
3. the correction is carried to the student's tokens through text
   (:func:`mgsr_lightning.cross_tokenizer.correction.correction_through_text`): the student keeps its
   first tokens that spell a prefix of the revised text, the rest of that text is tokenised by the
   student's tokenizer, and the student continues generating from there (unless the teacher's token was
   its EOS), within the rollout's length budget.

Later rounds consider only teacher tokens from the end of the previous correction's text on. The
re-generation re-encodes the kept prefix (no KV cache reuse, unlike same-tokenizer SCRG), and the teacher's
logits over the final sequences are left to the caller (another re-tokenisation and forward).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn

from mgsr_lightning.batch import Rollout
from mgsr_lightning.cross_tokenizer.correction import correction_through_text
from mgsr_lightning.cross_tokenizer.teacher_side import retokenized_teacher_side
from mgsr_lightning.generation.decode import Decoding, eval_mode, sample
from mgsr_lightning.generation.scoring import response_logits
from mgsr_lightning.scrg.error_search import find_error_positions
from mgsr_lightning.scrg.revise import ScrgConfig
from mgsr_lightning.seeding import derive_seeds

TEACHER_ONLY_CRITERIA = ("first_unlikely", "max_teacher_nll")


@torch.no_grad()
def revise_through_text(
    student: nn.Module,
    teacher: nn.Module,
    rollout: Rollout,
    teacher_prompt_ids: Tensor,
    teacher_prompt_mask: Tensor,
    config: ScrgConfig,
    decoding: Decoding,
    *,
    student_tokenizer,
    teacher_tokenizer,
    student_surfaces: dict,
    teacher_surfaces: dict,
    teacher_vocab_size: int,
    seeds: Tensor | None = None,
) -> tuple[Rollout, dict[str, float]]:
    """Correct each row of ``rollout`` (the student's) up to ``config.n_corrections`` times (module docstring).

    ``teacher_prompt_ids``/``teacher_prompt_mask`` [B, Pt]: the teacher's tokens of the same prompts.
    Returns the revised student rollout (prompts unchanged) and stats: ``corrected_fraction``,
    ``refused_corrections`` (corrections that would end inside a character), ``regenerated_tokens``, ``seconds``.
    """
    if config.criterion not in TEACHER_ONLY_CRITERIA:
        raise ValueError(f"SCRG through text needs a criterion that reads the teacher only "
                         f"({', '.join(TEACHER_ONLY_CRITERIA)}), got {config.criterion!r}")
    started = time.perf_counter()
    batch_size, device = rollout.batch_size, rollout.device
    eos_id = decoding.eos_token_id if isinstance(decoding.eos_token_id, int) else decoding.eos_token_id[0]
    pad_id = decoding.pad_token_id
    prompts, responses = rollout.to_token_lists()
    length_cap = decoding.max_length if decoding.max_length is not None else 10**9
    budgets = [min(decoding.sampling.max_new_tokens, length_cap - len(p)) for p in prompts]
    start_chars = [0] * batch_size  # text before this is settled by an earlier correction
    corrected = [False] * batch_size
    refused = regenerated = 0
    with eval_mode(student, teacher):
        for round_index in range(config.n_corrections):
            current = Rollout.from_token_lists(prompts, responses, pad_token_id=pad_id, device=device)
            teacher_sequences, _ = retokenized_teacher_side(
                current, teacher_prompt_ids, teacher_prompt_mask, student_surfaces, teacher_tokenizer,
                student_eos_id=eos_id, student_pad_id=pad_id)
            teacher_logits = response_logits(teacher, teacher_sequences, teacher_vocab_size)  # [B, Rt, Vt]
            teacher_lists = teacher_sequences.to_token_lists()[1]
            start = torch.tensor([_tokens_before(ids, chars, teacher_surfaces)
                                  for ids, chars in zip(teacher_lists, start_chars)], device=device)
            errors = find_error_positions(
                teacher_logits, teacher_logits, teacher_sequences.response_ids, teacher_sequences.response_mask,
                start=start, criterion=config.criterion, unlikely_below=config.unlikely_below, teacher_token="argmax")
            prefixes: dict[int, list[int]] = {}
            for row in errors.has_error.nonzero().flatten().tolist():
                position, token = int(errors.positions[row]), int(errors.teacher_tokens[row])
                correction = correction_through_text(student_surfaces, responses[row], teacher_surfaces,
                                                     teacher_lists[row], position, token)
                if correction is None:
                    refused += 1
                    continue
                prefix = responses[row][:correction.keep] + student_tokenizer(
                    correction.text, add_special_tokens=False)["input_ids"]
                prefix = prefix[:budgets[row]]
                start_chars[row] = len(_spelled(student_surfaces, prefix))
                corrected[row] = True
                if correction.ends or len(prefix) >= budgets[row]:
                    responses[row] = prefix + ([eos_id] if correction.ends and len(prefix) < budgets[row] else [])
                else:
                    prefixes[row] = prefix
            if not prefixes and not errors.has_error.any():
                break
            if prefixes:
                rows = sorted(prefixes)
                continued = Rollout.from_token_lists([prompts[r] + prefixes[r] for r in rows], [[] for _ in rows],
                                                     pad_token_id=pad_id, device=device)
                row_seeds = derive_seeds(seeds, round_index, "regenerate")[rows] if seeds is not None else None
                caps = torch.tensor([len(prompts[r]) + budgets[r] for r in rows], device=device)
                generated = sample(student, continued.prompt_ids, continued.prompt_mask, decoding, seeds=row_seeds,
                                   max_length=caps).to_token_lists()[1]
                for row, new in zip(rows, generated):
                    responses[row] = prefixes[row] + new
                    regenerated += len(new)
    revised = Rollout.from_token_lists(prompts, responses, pad_token_id=pad_id, device=device)
    stats = {
        "corrected_fraction": sum(corrected) / batch_size if batch_size else 0.0,
        "refused_corrections": float(refused),
        "regenerated_tokens": float(regenerated),
        "seconds": time.perf_counter() - started,
    }
    return revised, stats


def _spelled(surfaces: dict, ids: list[int]) -> str:
    """The text ``ids`` spell (special tokens spell nothing)."""
    data = b"".join(piece for piece in (surfaces.get(i) for i in ids) if isinstance(piece, bytes))
    return data.decode("utf-8", errors="replace")


def _tokens_before(teacher_ids: list[int], chars: int, teacher_surfaces: dict) -> int:
    """How many of the teacher's first tokens lie within the first ``chars`` characters of the text."""
    if chars == 0:
        return 0
    spelled = 0
    for count, token_id in enumerate(teacher_ids):
        piece = teacher_surfaces.get(token_id)
        spelled += len(piece.decode("utf-8", errors="replace")) if isinstance(piece, bytes) else 0
        if spelled > chars:
            return count
    return len(teacher_ids)
