"""Sampling from a causal LM into the batch contract (:class:`mgsr_lightning.batch.Rollout`).

``sample`` is our own decode loop rather than ``model.generate``, for two things ``generate`` does not
offer: per-row random streams (so a row's sample depends only on its own seed,
:func:`mgsr_lightning.generation.sampling.choose_tokens`) and a per-row length cap. What it needs besides the
model, prompts and seeds is one :class:`Decoding`: the sampling config, the decode loop's config, the
special ids and the limits, built once by the caller. By default its KV cache grows by one column per
step; with ``decoding.loop.static_cache`` it is preallocated at the rollout's final length and written in
place (:mod:`mgsr_lightning.generation.kv_cache`), so the one-token step has fixed shapes and can be
compiled (``decoding.loop.compile``). It can also continue from a KV cache the caller already holds
(:func:`mgsr_lightning.generation.kv_cache.realigned_cache`), which is how SCRG re-generates without
re-encoding the kept prefix.

Before the counter-based sampler, rows drew from one ``torch.Generator`` each with
``torch.multinomial``; the same seed now gives other (equally distributed) samples than those versions did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn
from transformers import Cache

from mgsr_lightning.batch import Rollout, positions_from_mask
from mgsr_lightning.distributed import every_rank, is_distributed, max_over_ranks
from mgsr_lightning.generation.kv_cache import one_token_step, preallocated_cache
from mgsr_lightning.generation.sampling import DecodingConfig, SamplingConfig, choose_tokens, token_id_tensor


@dataclass(frozen=True)
class Decoding:
    """Everything a decode call needs besides the model, the prompts and the seeds.

    Args:
        sampling: greedy or sampling, temperature, top-k, top-p, max_new_tokens.
        eos_token_id: id(s) that end a response; the EOS is kept in the response and masked True.
        pad_token_id: fills the response after a row ends.
        vocab_size: logits are cut to [..., :vocab_size] so padded embedding rows are never sampled.
        max_length: cap on prompt real length + response length.
        synced: keep decoding (finished rows only feed padding) until every rank of the process
            group has finished. Needed when a forward is a collective, as under FSDP: a rank that
            stopped early would leave the others waiting. The result is the same as unsynced.
        loop: how the decode loop runs (static KV cache, compiled step); the tokens do not depend on it.
    """

    sampling: SamplingConfig
    eos_token_id: int | Sequence[int]
    pad_token_id: int
    vocab_size: int | None = None
    max_length: int | None = None
    synced: bool = False
    loop: DecodingConfig = field(default_factory=DecodingConfig)

    def with_max_new_tokens(self, max_new_tokens: int | None) -> Decoding:
        """The same decoding with another response budget (None: unchanged)."""
        if max_new_tokens is None:
            return self
        return replace(self, sampling=replace(self.sampling, max_new_tokens=max_new_tokens))


@dataclass
class DecodeState:
    """What a ``sample`` call computed besides the tokens, filled in when the caller passes one (``state=``), so a
    later step (SCRG) reuses it instead of a scoring forward over the rollout.

    Attributes:
        cache: the KV cache the loop grew, over the returned rollout's ``model_inputs()`` columns up to its last
            fed token (the last sampled token is never fed); None with a static cache (it cannot be realigned)
            or when no step ran.
        token_nll: [B, R] float32, −log p(token) of each sampled response token under the model's unfiltered
            distribution at temperature 1 (the vocabulary cut applied), 0 at padding: the NLL a scoring forward
            over the rollout gives (``response_cross_entropy``), up to float rounding.
    """

    cache: Cache | None = None
    token_nll: Tensor | None = None


@contextlib.contextmanager
def eval_mode(*models: nn.Module) -> Iterator[None]:
    """Switch models to eval mode (dropout off) and restore each one's train/eval flag on exit."""
    previous = [model.training for model in models]
    for model in models:
        model.eval()
    try:
        yield
    finally:
        for model, was_training in zip(models, previous):
            model.train(was_training)


@torch.no_grad()
def sample(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    decoding: Decoding,
    *,
    seeds: Tensor | None = None,
    max_length: int | Tensor | None = None,
    cache: Cache | None = None,
    state: DecodeState | None = None,
) -> Rollout:
    """Sample a response per prompt with a KV cache: one prefill over the prompts, then one token per step.

    Args:
        model: a Hugging Face causal LM (GPT-2, OPT, LLaMA, ...); run in eval mode, its mode restored after.
        prompt_ids: [B, P] left-padded with the pad id; every row needs >= 1 real token.
        prompt_mask: [B, P] bool, True on real prompt tokens.
        decoding: sampling, decode loop, special ids, vocabulary cut, length cap and lockstep (``Decoding``).
        seeds: [B] int64; row i's token t is then drawn with ``counter_uniforms(seeds, t)[i]``, so
            its sample does not depend on the other rows or on its padding. None: global torch RNG.
        max_length: cap on prompt real length + response length, an int or one per row [B], in
            place of ``decoding.max_length``.
        cache: the model's KV cache over ``prompt_ids[:, :-1]`` (same columns, same mask), e.g. from
            :func:`~.kv_cache.realigned_cache`; the prefill then feeds only the last prompt column. Extended in
            place, or with ``decoding.loop.static_cache`` copied once into the preallocated cache.
        state: a ``DecodeState`` to fill with the loop's KV cache and the sampled tokens' NLL.

    Runs under ``torch.no_grad`` (not ``inference_mode``), so the ids can feed a forward with grad.

    Returns:
        A ``Rollout`` with the given prompts and responses [B, R], R = the number of decode steps run.
    """
    config, pad_token_id, vocab_size = decoding.sampling, decoding.pad_token_id, decoding.vocab_size
    max_length = decoding.max_length if max_length is None else max_length
    device = prompt_ids.device
    prompt_mask = prompt_mask.bool()
    batch_size, prompt_width = prompt_ids.shape
    prompt_lengths = prompt_mask.sum(-1)  # [B]
    if bool((prompt_lengths == 0).any()):
        raise ValueError("every prompt needs at least one real token")
    eos_ids = token_id_tensor(decoding.eos_token_id, device)
    if seeds is not None:
        seeds = seeds.to(device)

    budgets = torch.full_like(prompt_lengths, config.max_new_tokens)  # [B] most response tokens per row
    if max_length is not None:
        budgets = torch.minimum(budgets, torch.as_tensor(max_length, device=device) - prompt_lengths).clamp_min(0)
    done = budgets == 0  # [B]
    max_steps = int(budgets.max()) if budgets.numel() else 0
    synced = decoding.synced and is_distributed()
    if synced:
        max_steps = int(max_over_ranks(torch.tensor(max_steps, device=device)))

    # Allocated once: the response and the attention mask over prompt + response columns.
    response_ids = prompt_ids.new_full((batch_size, max_steps), pad_token_id)  # [B, R]
    response_mask = prompt_mask.new_zeros(batch_size, max_steps)
    token_nll = torch.zeros(batch_size, max_steps, dtype=torch.float32, device=device) if state is not None else None
    attention_mask = torch.cat([prompt_mask.long(), prompt_mask.new_ones(batch_size, max_steps, dtype=torch.long)], 1)
    steps_run = 0
    fed = 1 if cache is not None else prompt_width
    static = decoding.loop.static_cache and max_steps > 0
    if static:  # every column the loop writes, allocated once: [B, H, P + R, D] per layer
        cache = preallocated_cache(model, prompt_width + max_steps, cache)
    one_token = one_token_step(model, decoding.loop.compile)
    with eval_mode(model):
        # The first step is the prefill over the whole prompt (or its last column, continuing a cache);
        # later steps feed one token per row.
        positions = positions_from_mask(prompt_mask)  # [B, P]
        input_ids, positions = prompt_ids[:, prompt_width - fed :], positions[:, prompt_width - fed :]
        for step in range(max_steps):
            # A static cache takes the mask over all its columns (fixed shapes); the causal mask hides
            # the columns not written yet. A dynamic cache takes the columns written so far.
            outputs = (one_token if input_ids.size(1) == 1 else model)(
                input_ids=input_ids,
                attention_mask=attention_mask if static else attention_mask[:, : prompt_width + step],
                position_ids=positions,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = outputs.cache
            logits = outputs.logits[:, -1, :vocab_size]  # [B, V]
            # Finished rows draw too (their draw is discarded): a row's stream is indexed by its step, not by state.
            tokens = choose_tokens(logits, config, seeds, counter=step).masked_fill(done, pad_token_id)  # [B]
            response_ids[:, step] = tokens
            if token_nll is not None:
                scores = logits.float()
                nll = scores.logsumexp(-1) - scores.gather(-1, tokens[:, None].clamp_max(scores.size(-1) - 1))[:, 0]
                token_nll[:, step] = nll.masked_fill(done, 0.0)
            response_mask[:, step] = ~done
            steps_run = step + 1
            done = done | torch.isin(tokens, eos_ids) | (step + 1 >= budgets)
            if every_rank(done.all(), synced):
                break
            input_ids = tokens[:, None]  # [B, 1]
            # Left padding keeps each row's last column real, so its next position is one past it.
            # Finished rows keep theirs: their outputs are discarded, and a position past the end of
            # a short row's max_length could overflow a model's position table while others go on.
            positions = positions[:, -1:] + (~done).long()[:, None]  # [B, 1]

    response_ids, response_mask = response_ids[:, :steps_run], response_mask[:, :steps_run]
    if synced and steps_run:  # steps run only for other ranks are padding everywhere here: drop them
        width = int(response_mask.sum(-1).max())
        response_ids, response_mask = response_ids[:, :width], response_mask[:, :width]
    if state is not None:
        state.cache = cache if steps_run and not static else None
        state.token_nll = token_nll[:, : response_ids.size(1)]
    return Rollout(prompt_ids, prompt_mask, response_ids, response_mask)


def decode_responses(tokenizer, rollout: Rollout) -> list[str]:
    """The response text of each row: real response tokens decoded without special tokens (EOS, pad),
    MiniLLM's ``<n>`` newline marker restored, surrounding whitespace stripped."""
    _, responses = rollout.to_token_lists()
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    return [text.replace("<n>", "\n").strip() for text in texts]
