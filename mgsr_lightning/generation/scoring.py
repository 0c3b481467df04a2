"""Scoring forwards: a causal LM over a rollout, its logits aligned with the response tokens.

``response_logits`` runs a model over a rollout and returns the logits aligned with the response
tokens, which is what every loss and SCRG's scoring compare (``response_hidden_states``: the hidden states
they are computed from, for the fused head); ``response_logits_and_cache`` also keeps the
forward's KV cache, from which ``response_logits_from_prefix`` scores a revised rollout without re-encoding
the columns it shares with the earlier one.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import Cache

from mgsr_lightning.batch import Rollout
from mgsr_lightning.generation.kv_cache import realigned_cache


def response_logits(model: nn.Module, rollout: Rollout, vocab_size: int | None = None) -> Tensor:
    """[B, R, V] logits of ``model`` over ``rollout``, where [:, r] predicts ``response_ids[:, r]``.

    Only the last R + 1 positions go through the output layer (``logits_to_keep``), so the prompt
    never costs a [P, V] block, and the vocabulary is cut to ``vocab_size`` (padded embedding rows).
    """
    return _response_forward(model, rollout, vocab_size, use_cache=False)[0]


def response_hidden_states(model: nn.Module, rollout: Rollout) -> Tensor:
    """[B, R, H] the last hidden states of ``model`` over ``rollout`` (after its final norm), where [:, r] is
    what ``response_logits``'s [:, r] is computed from: the output head applied to them gives those logits
    (``models.output_head``). The forward keeps the logits of one position only (``logits_to_keep=1``)."""
    if rollout.prompt_ids.size(1) == 0:
        raise ValueError("a rollout needs at least one prompt token per row to predict its response")
    prompt_width, response_width = rollout.prompt_ids.size(1), rollout.response_ids.size(1)
    outputs = model(**rollout.model_inputs(), use_cache=False, output_hidden_states=True, logits_to_keep=1)
    return outputs.hidden_states[-1][:, prompt_width - 1 : prompt_width - 1 + response_width]


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
