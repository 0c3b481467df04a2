"""MiniLLM's rollouts: responses sampled from the teacher-mixed distribution ``p̃ = α·p + (1 − α)·q``.

Each next token is drawn from the mixture of the teacher's and the student's next-token
distributions (each filtered by temperature, top-k and top-p as the student's samples are), so
early in training, when the student's own samples are poor, the responses stay closer to what the
teacher would say; the loss corrects the bias with importance weights
(:func:`mgsr_lightning.losses.minillm.mixture_importance_weights`). Both models decode side by side
with a growing KV cache each. The teacher's logits of every step are kept: they are the teacher's logits over
the final responses, so the training step needs no teacher forward of its own. With α = 0 the
student's ordinary rollout is used instead (:func:`mgsr_lightning.training.rollout.fresh_outputs` decides).

Row b's token t is drawn at the inverse CDF of ``counter_uniforms(seeds, t)[b]``, as in
:func:`mgsr_lightning.generation.decode.sample`, so a row's sample does not depend on the other rows.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn

from mgsr_lightning.batch import Rollout, TrainingSequences, positions_from_mask
from mgsr_lightning.distributed import every_rank, is_distributed, max_over_ranks
from mgsr_lightning.generation.decode import Decoding, eval_mode
from mgsr_lightning.generation.sampling import filter_logits, inverse_cdf, token_id_tensor
from mgsr_lightning.seeding import counter_uniforms


def mixed_next_tokens(
    student_logits: Tensor, teacher_logits: Tensor, alpha: float, decoding: Decoding, seeds: Tensor | None, step: int,
) -> Tensor:
    """[N] tokens drawn from ``α·softmax(filter(teacher)) + (1 − α)·softmax(filter(student))`` ([N, V] logits each);
    greedy decoding takes the mixture's argmax."""
    config = decoding.sampling
    student_probs = filter_logits(student_logits.float(), config).softmax(-1)
    teacher_probs = filter_logits(teacher_logits.float(), config).softmax(-1)
    probs = (1 - alpha) * student_probs + alpha * teacher_probs  # [N, V]
    if not config.do_sample:
        return probs.argmax(-1)
    if seeds is None:
        return torch.multinomial(probs, 1).squeeze(-1)
    return inverse_cdf(probs, counter_uniforms(seeds.to(probs.device), step))


@torch.no_grad()
def teacher_mixed_sample(
    student: nn.Module, teacher: nn.Module, prompts: Rollout, decoding: Decoding, alpha: float,
    seeds: Tensor | None = None,
) -> tuple[Rollout, Tensor | None]:
    """A response per prompt of ``prompts`` sampled from the teacher-mixed distribution.

    Returns the rollout (prompts kept, responses [B, R]) and the teacher's logits [B, R, V] over its
    responses, aligned as :func:`mgsr_lightning.generation.scoring.response_logits` aligns them (the values
    at masked positions are unused; None when no step ran). Runs both models in eval mode under ``no_grad``.
    """
    prompt_ids, prompt_mask = prompts.prompt_ids, prompts.prompt_mask.bool()
    device, (batch_size, prompt_width) = prompt_ids.device, prompt_ids.shape
    prompt_lengths = prompt_mask.sum(-1)
    if bool((prompt_lengths == 0).any()):
        raise ValueError("every prompt needs at least one real token")
    eos_ids = token_id_tensor(decoding.eos_token_id, device)
    budgets = torch.full_like(prompt_lengths, decoding.sampling.max_new_tokens)  # [B]
    if decoding.max_length is not None:
        budgets = torch.minimum(budgets, decoding.max_length - prompt_lengths).clamp_min(0)
    done = budgets == 0
    max_steps = int(budgets.max()) if budgets.numel() else 0
    synced = decoding.synced and is_distributed()
    if synced:
        max_steps = int(max_over_ranks(torch.tensor(max_steps, device=device)))
    response_ids = prompt_ids.new_full((batch_size, max_steps), decoding.pad_token_id)  # [B, R]
    response_mask = prompt_mask.new_zeros(batch_size, max_steps)
    attention_mask = torch.cat([prompt_mask.long(), prompt_mask.new_ones(batch_size, max_steps, dtype=torch.long)], 1)
    teacher_steps: list[Tensor] = []
    caches: dict[str, object] = {"student": None, "teacher": None}
    with eval_mode(student, teacher):
        input_ids, positions = prompt_ids, positions_from_mask(prompt_mask)  # the prefill, then one token per step
        for step in range(max_steps):
            logits = {}
            for name, model in (("student", student), ("teacher", teacher)):
                outputs = model(input_ids=input_ids, attention_mask=attention_mask[:, : prompt_width + step],
                                position_ids=positions, cache=caches[name], use_cache=True, logits_to_keep=1)
                caches[name] = outputs.cache
                logits[name] = outputs.logits[:, -1, : decoding.vocab_size]  # [B, V]
            teacher_steps.append(logits["teacher"])
            tokens = mixed_next_tokens(logits["student"], logits["teacher"], alpha, decoding, seeds, step)
            tokens = tokens.masked_fill(done, decoding.pad_token_id)
            response_ids[:, step], response_mask[:, step] = tokens, ~done
            done = done | torch.isin(tokens, eos_ids) | (step + 1 >= budgets)
            if every_rank(done.all(), synced):
                break
            input_ids = tokens[:, None]
            positions = positions[:, -1:] + (~done).long()[:, None]  # finished rows keep theirs (see ``sample``)
    width = int(response_mask.sum(-1).max()) if response_mask.numel() else 0  # steps run for other ranks: dropped
    teacher_logits = torch.stack(teacher_steps, dim=1)[:, :width] if teacher_steps else None
    return Rollout(prompt_ids, prompt_mask, response_ids[:, :width], response_mask[:, :width]), teacher_logits


def teacher_mixed_rollout(
    student: nn.Module, teacher: nn.Module, prompts: Rollout, decoding: Decoding, alpha: float, seeds: Tensor,
) -> TrainingSequences:
    """MiniLLM's fresh responses to ``prompts``, teacher-mixed with ``alpha`` > 0, with the teacher's logits over
    them. Metrics as ``rollout.student_rollout``'s."""
    started = time.perf_counter()
    rollout, teacher_logits = teacher_mixed_sample(student, teacher, prompts, decoding, alpha, seeds)
    metrics = {
        "rollout/seconds": time.perf_counter() - started,
        "rollout/response_tokens": float(rollout.response_mask.sum(-1).float().mean()),
    }
    return TrainingSequences(rollout, "fresh", teacher_logits, metrics)
