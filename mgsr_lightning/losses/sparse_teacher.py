"""A sparse teacher: each position's top-k log-probabilities and the log of the mass left over.

A teacher cache (:mod:`mgsr_lightning.data.teacher_cache`) stores, per response position,

    top_ids       [..., k]  the k most likely token ids (any order)
    top_logprobs  [..., k]  their log-probabilities, log p_i
    rest_logprob  [...]     log(1 − Σ_i p_i): the mass of the V − k other tokens (−inf when k = V)

and every loss reads it back densified into full log-probabilities [..., V]: the top-k entries as
stored, and the rest mass **spread evenly** over the V − k other tokens, each getting
``rest_logprob − log(V − k)``. The result sums to 1, is a valid ``teacher_logits`` for every loss
(log-probabilities are logits, and ``softmax(logp / T)`` is the tempered teacher exactly), and with
k = V it is the teacher's distribution itself, so the losses equal the live teacher's. Both
functions work on any leading shape, so a chunked loss can densify one chunk of positions at a time.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def top_k_entries(teacher_logits: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """``teacher_logits`` [..., V] → (top_ids [..., k] long, top_logprobs [..., k] fp32, rest_logprob [...] fp32).

    ``rest_logprob`` is a log-sum-exp over the tokens outside the top k (not ``log1p(−Σp)``, which
    loses the tail to rounding when the top k hold nearly all the mass).
    """
    vocab_size = teacher_logits.size(-1)
    if not 1 <= k <= vocab_size:
        raise ValueError(f"k must be between 1 and the vocabulary size {vocab_size}, got {k}")
    logprobs = torch.log_softmax(teacher_logits.float(), dim=-1)
    top_logprobs, top_ids = logprobs.topk(k, dim=-1)
    rest_logprob = torch.logsumexp(logprobs.scatter(-1, top_ids, float("-inf")), dim=-1)
    return top_ids, top_logprobs, rest_logprob


def densify(top_ids: Tensor, top_logprobs: Tensor, rest_logprob: Tensor, vocab_size: int) -> Tensor:
    """Full teacher log-probabilities [..., V] (fp32) from a sparse teacher, the rest spread evenly."""
    k = top_ids.size(-1)
    others = vocab_size - k
    fill = rest_logprob.float() - math.log(others) if others > 0 else torch.full_like(rest_logprob.float(), -math.inf)
    dense = fill.unsqueeze(-1).expand(*rest_logprob.shape, vocab_size).clone()
    return dense.scatter_(-1, top_ids.long(), top_logprobs.float())
