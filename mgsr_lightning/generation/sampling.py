"""How a decode loop picks tokens and runs: the sampling and decode-loop settings, and the token choice.

:class:`SamplingConfig` is what is sampled (temperature, top-k, top-p, the response budget);
:class:`DecodingConfig` is how the loop runs (a preallocated KV cache, the one-token step compiled).
``choose_tokens`` draws the next token per row; with seeds, row b's token i sits at the inverse CDF
of ``counter_uniforms(seeds, i)[b]`` (a SplitMix64 hash of the row's seed and i,
:mod:`mgsr_lightning.seeding`): one uniform per row and step for the whole batch, no generator objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

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
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class DecodingConfig:
    """How the decode loop runs; the tokens do not depend on it (up to float rounding).

    Args:
        static_cache: preallocate each rollout's KV cache once at its final length (prompt + response
            budget; transformers' ``StaticCache``) and write every step in place, so every one-token
            step has the same shapes. False (the default): a ``DynamicCache`` that grows by one column per
            step. What each costs is measured by ``experiments/benchmarks/bench_decode.py`` (figures:
            ``experiments/results/speed/README.md``). It needs a transformers model (its ``config``).
        compile: run the one-token step under ``torch.compile`` (needs ``static_cache``); on CUDA in
            ``reduce-overhead`` mode, which captures it as a CUDA graph. The first rollouts of each
            shape pay the compilation.
    """

    static_cache: bool = False
    compile: bool = False

    def __post_init__(self) -> None:
        if self.compile and not self.static_cache:
            raise ValueError("decoding.compile needs decoding.static_cache: a growing cache changes shapes every step")


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
