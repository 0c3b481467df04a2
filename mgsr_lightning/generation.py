"""Sampling from a causal LM into the batch contract (:class:`mgsr_lightning.batch.Rollout`).

``response_logits`` runs a model over a rollout and returns the logits aligned with the response
tokens, which is what every loss and SCRG's scoring compare.

``sample`` is our own decode loop over a Hugging Face ``DynamicCache`` rather than
``model.generate``, for two things ``generate`` does not offer: one ``torch.Generator`` per row (so a
row's sample depends only on its own seed) and a per-row length cap. What it needs besides the model,
prompts and seeds is one :class:`Decoding`: the sampling config, the special ids and the limits,
built once by the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from mgsr_lightning.batch import Rollout, positions_from_mask
from mgsr_lightning.distributed import every_rank, is_distributed, max_over_ranks
from mgsr_lightning.seeding import row_generators

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
    if rollout.prompt_ids.size(1) == 0:
        raise ValueError("a rollout needs at least one prompt token per row to predict its response")
    response_width = rollout.response_ids.size(1)
    # Column P-1+r of the full sequence predicts response token r: the last R+1 columns, less the last.
    logits = model(**rollout.model_inputs(), use_cache=False, logits_to_keep=response_width + 1).logits
    return logits[:, :response_width, :vocab_size]  # the last column predicts past the sequence


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


def choose_tokens(
    logits: Tensor, config: SamplingConfig, generators: Sequence[torch.Generator] | None = None
) -> Tensor:
    """Next token per row from [N, V] logits: greedy, or a draw from the filtered distribution.

    With ``generators`` (one per row) row i draws only from ``generators[i]``; otherwise from the
    global torch RNG.
    """
    if not config.do_sample:
        return logits.argmax(-1)
    probs = filter_logits(logits.float(), config).softmax(-1)  # [N, V]
    if generators is None:
        return torch.multinomial(probs, 1).squeeze(-1)
    return torch.cat([torch.multinomial(row_probs, 1, generator=g) for row_probs, g in zip(probs, generators)])


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
) -> Rollout:
    """Sample a response per prompt with a KV cache: one prefill over the prompts, then one token per step.

    Args:
        model: a Hugging Face causal LM (GPT-2, OPT, LLaMA, ...); run in eval mode, its mode restored after.
        prompt_ids: [B, P] left-padded with the pad id; every row needs >= 1 real token.
        prompt_mask: [B, P] bool, True on real prompt tokens.
        decoding: sampling config, special ids, vocabulary cut, length cap and lockstep (see ``Decoding``).
        seeds: [B] int64; row i then draws only from a generator seeded with seeds[i], so its
            sample does not depend on the other rows or on its padding. None: global torch RNG.
        max_length: cap on prompt real length + response length, an int or one per row [B], in
            place of ``decoding.max_length``.

    Runs under ``torch.no_grad`` (not ``inference_mode``), so the ids can feed a forward with grad.

    Returns:
        A ``Rollout`` with the given prompts and responses [B, R], R = the number of decode steps run.
    """
    config, pad_token_id, vocab_size = decoding.sampling, decoding.pad_token_id, decoding.vocab_size
    max_length = decoding.max_length if max_length is None else max_length
    device = prompt_ids.device
    prompt_mask = prompt_mask.bool()
    prompt_lengths = prompt_mask.sum(-1)  # [B]
    if bool((prompt_lengths == 0).any()):
        raise ValueError("every prompt needs at least one real token")
    eos_ids = token_id_tensor(decoding.eos_token_id, device)
    generators = row_generators(seeds, device) if seeds is not None else None

    budgets = torch.full_like(prompt_lengths, config.max_new_tokens)  # [B] most response tokens per row
    if max_length is not None:
        budgets = torch.minimum(budgets, torch.as_tensor(max_length, device=device) - prompt_lengths).clamp_min(0)
    done = budgets == 0  # [B]
    max_steps = int(budgets.max()) if budgets.numel() else 0
    synced = decoding.synced and is_distributed()
    if synced:
        max_steps = int(max_over_ranks(torch.tensor(max_steps, device=device)))

    response_tokens: list[Tensor] = []  # per step: [B]
    response_real: list[Tensor] = []  # per step: [B] bool
    with eval_mode(model):
        # The first step is the prefill over the whole prompt; later steps feed one token per row.
        input_ids, attention_mask = prompt_ids, prompt_mask.long()
        positions = positions_from_mask(prompt_mask)  # [B, P]
        cache = None
        for step in range(max_steps):
            outputs = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = outputs.cache
            logits = outputs.logits[:, -1, :vocab_size]  # [B, V]
            active = (~done).nonzero().squeeze(-1)  # only live rows draw, so a row's RNG stream is its own
            tokens = torch.full_like(prompt_lengths, pad_token_id)
            active_generators = [generators[i] for i in active.tolist()] if generators is not None else None
            if active.numel():  # none when this rank is done and only keeps pace with others (synced)
                tokens[active] = choose_tokens(logits[active], config, active_generators)
            response_tokens.append(tokens)
            response_real.append(~done)
            done = done | torch.isin(tokens, eos_ids) | (step + 1 >= budgets)
            if every_rank(done.all(), synced):
                break
            input_ids = tokens[:, None]  # [B, 1]
            attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
            # Left padding keeps each row's last column real, so its next position is one past it.
            # Finished rows keep theirs: their outputs are discarded, and a position past the end of
            # a short row's max_length could overflow a model's position table while others go on.
            positions = positions[:, -1:] + (~done).long()[:, None]  # [B, 1]

    if response_tokens:
        response_ids = torch.stack(response_tokens, dim=1)  # [B, R]
        response_mask = torch.stack(response_real, dim=1)
        if synced:  # steps run only for other ranks are padding everywhere here: drop them
            width = int(response_mask.sum(-1).max())
            response_ids, response_mask = response_ids[:, :width], response_mask[:, :width]
    else:
        response_ids = prompt_ids.new_empty(prompt_ids.size(0), 0)
        response_mask = prompt_mask.new_empty(prompt_ids.size(0), 0)
    return Rollout(prompt_ids, prompt_mask, response_ids, response_mask)


def decode_responses(tokenizer, rollout: Rollout) -> list[str]:
    """The response text of each row: real response tokens decoded without special tokens (EOS, pad),
    MiniLLM's ``<n>`` newline marker restored, surrounding whitespace stripped."""
    _, responses = rollout.to_token_lists()
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    return [text.replace("<n>", "\n").strip() for text in texts]
