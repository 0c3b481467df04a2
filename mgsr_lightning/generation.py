"""Sampling from a causal LM into the batch contract (:class:`mgsr_lightning.batch.Rollout`).

``response_logits`` runs a model over a rollout and returns the logits aligned with the response
tokens, which is what every loss and SCRG's scoring compare.

``sample`` is our own decode loop over a Hugging Face ``DynamicCache`` rather than
``model.generate``, for two things ``generate`` does not offer: per-row random streams (so a row's
sample depends only on its own seed) and a per-row length cap. What it needs besides the model,
prompts and seeds is one :class:`Decoding`: the sampling config, the special ids and the limits,
built once by the caller. It can also continue from a KV cache the caller already holds
(:func:`realigned_cache`), which is how SCRG re-generates without re-encoding the kept prefix.

Sampling with seeds draws token i of row b at the inverse CDF of ``counter_uniforms(seeds, i)[b]``
(a SplitMix64 hash of the row's seed and i, :mod:`mgsr_lightning.seeding`): one uniform per row
and step for the whole batch, no generator objects. Before this sampler, rows drew from one
``torch.Generator`` each with ``torch.multinomial``; the same seed now gives other (equally
distributed) samples than those versions did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from transformers import Cache, DynamicCache
from transformers.cache_utils import DynamicLayer

from mgsr_lightning.batch import Rollout, positions_from_mask
from mgsr_lightning.distributed import every_rank, is_distributed, max_over_ranks
from mgsr_lightning.seeding import counter_uniforms


@dataclass
class SamplingConfig:
    """Sampling for student rollouts and evaluation (defaults = DistiLLM/MiniLLM: T=1, top_k=0 (off), top_p=1).

    Args:
        do_sample: sample from the (filtered) distribution; False = greedy argmax.
        temperature: logits are divided by it before top-k/top-p (sampling only).
        top_k: keep the k most likely tokens (ties at the k-th logit are kept); 0 = off.
        top_p: keep the smallest set of most likely tokens whose mass reaches top_p; 1 = off.
        max_new_tokens: most response tokens per row (the EOS that ends a response included).
    """

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 256

    def __post_init__(self) -> None:
        if self.do_sample and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")


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
    """

    sampling: SamplingConfig
    eos_token_id: int | Sequence[int]
    pad_token_id: int
    vocab_size: int | None = None
    max_length: int | None = None
    synced: bool = False

    def with_max_new_tokens(self, max_new_tokens: int | None) -> Decoding:
        """The same decoding with another response budget (None: unchanged)."""
        if max_new_tokens is None:
            return self
        return replace(self, sampling=replace(self.sampling, max_new_tokens=max_new_tokens))


def response_logits(model: nn.Module, rollout: Rollout, vocab_size: int | None = None) -> Tensor:
    """[B, R, V] logits of ``model`` over ``rollout``, where [:, r] predicts ``response_ids[:, r]``.

    Only the last R + 1 positions go through the output layer (``logits_to_keep``), so the prompt
    never costs a [P, V] block, and the vocabulary is cut to ``vocab_size`` (padded embedding rows).
    """
    return _response_forward(model, rollout, vocab_size, use_cache=False)[0]


def response_logits_and_cache(
    model: nn.Module, rollout: Rollout, vocab_size: int | None = None
) -> tuple[Tensor, Cache]:
    """``response_logits`` and the KV cache of the same forward, over ``rollout.model_inputs()``'s columns."""
    return _response_forward(model, rollout, vocab_size, use_cache=True)


def _response_forward(model: nn.Module, rollout: Rollout, vocab_size: int | None, use_cache: bool):
    if rollout.prompt_ids.size(1) == 0:
        raise ValueError("a rollout needs at least one prompt token per row to predict its response")
    response_width = rollout.response_ids.size(1)
    # Column P-1+r of the full sequence predicts response token r: the last R+1 columns, less the last.
    outputs = model(**rollout.model_inputs(), use_cache=use_cache, logits_to_keep=response_width + 1)
    return outputs.logits[:, :response_width, :vocab_size], outputs.cache  # the last column predicts past the sequence


def response_logits_from_prefix(
    model: nn.Module, rollout: Rollout, earlier_logits: Tensor, cache: Cache, unchanged: int,
    vocab_size: int | None = None,
) -> Tensor | None:
    """``response_logits(model, rollout)`` without re-encoding what an earlier forward already saw.

    The earlier forward (``response_logits_and_cache``) ran over another rollout with the same
    prompts and the same first ``unchanged`` response columns (ids and mask), and returned
    ``earlier_logits`` [B, R0, V] (R0 > ``unchanged``) and ``cache``. Logits that read only those
    columns (response positions 0..``unchanged``) are taken from ``earlier_logits``; the rest come
    from one forward over the new columns on top of the cache cut after prompt + ``unchanged``.
    Equal to a full forward up to float rounding. Returns None when the cache cannot be cut
    (``realigned_cache``'s rule), so the caller runs the full forward.
    """
    prompt_width, response_width = rollout.prompt_ids.size(1), rollout.response_ids.size(1)
    if not 0 <= unchanged < earlier_logits.size(1):
        raise ValueError(
            f"unchanged must be in [0, {earlier_logits.size(1)}) (the earlier response width), got {unchanged}"
        )
    if unchanged >= response_width:
        return earlier_logits[:, :response_width, :vocab_size]
    kept = torch.arange(prompt_width + unchanged, device=rollout.device).expand(rollout.batch_size, -1)  # [B, P+u]
    prefix_cache = realigned_cache(cache, torch.arange(rollout.batch_size, device=rollout.device), kept)
    if prefix_cache is None:
        return None
    inputs = rollout.model_inputs()
    start = prompt_width + unchanged
    outputs = model(input_ids=inputs["input_ids"][:, start:], attention_mask=inputs["attention_mask"],
                    position_ids=inputs["position_ids"][:, start:], cache=prefix_cache, use_cache=True)
    # earlier columns P-1 .. P-1+u predict response positions 0..u; new column P+u+c predicts u+1+c
    suffix = outputs.logits[:, : response_width - unchanged - 1, :vocab_size]
    return torch.cat([earlier_logits[:, : unchanged + 1, :vocab_size], suffix], dim=1)


def realigned_cache(cache: Cache, rows: Tensor, columns: Tensor) -> DynamicCache | None:
    """A new cache whose row n, column c holds ``cache``'s row ``rows[n]``, column ``columns[n, c]``.

    rows: [N] long; columns: [N, L] long. The cached keys already carry their positions (absolute
    embeddings are in the hidden states, rotary ones are applied before caching), so moving an entry
    to another column changes nothing as long as the attention mask follows it. This is how a
    prefix of a forward over ``prompt + response`` becomes the cache of a left-padded
    ``prompt + response[:j]``. Returns None when ``cache`` is not a plain ``DynamicCache`` of full
    layers (sliding windows, quantised or offloaded caches), so the caller re-encodes instead.
    """
    if type(cache) is not DynamicCache or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    if any(layer.keys is None or layer.keys.dim() != 4 for layer in cache.layers):
        return None
    moved = []
    for layer in cache.layers:
        keys, values = layer.keys[rows], layer.values[rows]  # [N, H, S, D]
        index = columns[:, None, :, None].to(keys.device)  # [N, 1, L, 1]
        moved.append((keys.gather(2, index.expand(-1, keys.size(1), -1, keys.size(3))),
                      values.gather(2, index.expand(-1, values.size(1), -1, values.size(3)))))
    return DynamicCache(moved)


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


def filter_logits(logits: Tensor, config: SamplingConfig) -> Tensor:
    """Temperature, then top-k, then top-p on [N, V] logits, as HF's warpers; removed tokens get -inf."""
    logits = logits / config.temperature
    if config.top_k > 0:
        kth_largest = logits.topk(min(config.top_k, logits.size(-1)), dim=-1).values[..., -1:]  # [N, 1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, sorted_index = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # A token is kept while the mass strictly before it is below top_p, so the top-1 always stays.
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        remove_sorted = mass_before >= config.top_p
        remove_sorted[..., 0] = False
        remove = remove_sorted.scatter(-1, sorted_index, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def choose_tokens(logits: Tensor, config: SamplingConfig, seeds: Tensor | None = None, counter: int = 0) -> Tensor:
    """Next token per row from [N, V] logits: greedy, or a draw from the filtered distribution.

    With ``seeds`` [N] int64, row i takes the inverse CDF of its distribution at
    ``counter_uniforms(seeds, counter)[i]``, so its draw depends only on its seed, the counter and its
    logits; otherwise the draws come from the global torch RNG.
    """
    if not config.do_sample:
        return logits.argmax(-1)
    probs = filter_logits(logits.float(), config).softmax(-1)  # [N, V]
    if seeds is None:
        return torch.multinomial(probs, 1).squeeze(-1)
    return inverse_cdf(probs, counter_uniforms(seeds.to(probs.device), counter))


def inverse_cdf(probs: Tensor, uniforms: Tensor) -> Tensor:
    """[N] token ids: for each row of ``probs`` [N, V], the first token whose cumulative mass exceeds
    ``uniforms`` [N] (in [0, 1)) times the row's total. A token of probability 0 is never chosen."""
    cumulative = probs.double().cumsum(-1)  # [N, V]; float64 so that V = 150k small steps stay exact enough
    total = cumulative[:, -1:]
    tokens = torch.searchsorted(cumulative, uniforms[:, None] * total, right=True).squeeze(-1)  # [N]
    # u·total can round up to total: take the last token with mass then (the first to reach the total)
    last_real = (cumulative < total).sum(-1)
    return torch.minimum(tokens, last_real)


def token_id_tensor(token_ids: int | Sequence[int], device: torch.device) -> Tensor:
    """[K] long: one id or several (e.g. a model with more than one end-of-turn token), for ``torch.isin``."""
    return torch.as_tensor([token_ids] if isinstance(token_ids, int) else list(token_ids), device=device)


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
) -> Rollout:
    """Sample a response per prompt with a KV cache: one prefill over the prompts, then one token per step.

    Args:
        model: a Hugging Face causal LM (GPT-2, OPT, LLaMA, ...); run in eval mode, its mode restored after.
        prompt_ids: [B, P] left-padded with the pad id; every row needs >= 1 real token.
        prompt_mask: [B, P] bool, True on real prompt tokens.
        decoding: sampling config, special ids, vocabulary cut, length cap and lockstep (see ``Decoding``).
        seeds: [B] int64; row i's token t is then drawn with ``counter_uniforms(seeds, t)[i]``, so
            its sample does not depend on the other rows or on its padding. None: global torch RNG.
        max_length: cap on prompt real length + response length, an int or one per row [B], in
            place of ``decoding.max_length``.
        cache: the model's KV cache over ``prompt_ids[:, :-1]`` (same columns, same mask), e.g. from
            :func:`realigned_cache`; the prefill then feeds only the last prompt column. Extended in place.

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
    attention_mask = torch.cat([prompt_mask.long(), prompt_mask.new_ones(batch_size, max_steps, dtype=torch.long)], 1)
    steps_run = 0
    with eval_mode(model):
        # The first step is the prefill over the whole prompt (or its last column, continuing a cache);
        # later steps feed one token per row.
        positions = positions_from_mask(prompt_mask)  # [B, P]
        fed = 1 if cache is not None else prompt_width
        input_ids, positions = prompt_ids[:, prompt_width - fed :], positions[:, prompt_width - fed :]
        for step in range(max_steps):
            outputs = model(
                input_ids=input_ids,
                attention_mask=attention_mask[:, : prompt_width + step],
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
    return Rollout(prompt_ids, prompt_mask, response_ids, response_mask)


def decode_responses(tokenizer, rollout: Rollout) -> list[str]:
    """The response text of each row: real response tokens decoded without special tokens (EOS, pad),
    MiniLLM's ``<n>`` newline marker restored, surrounding whitespace stripped."""
    _, responses = rollout.to_token_lists()
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    return [text.replace("<n>", "\n").strip() for text in texts]
