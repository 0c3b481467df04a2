"""KV caches for the decode loop: a prefix of a scoring forward's cache realigned to new columns, a
preallocated (static) cache, and the compiled one-token step that runs on it.

A ``DynamicCache`` grows by one column per decode step (a ``cat`` of every layer's keys and values);
transformers' ``StaticCache`` is allocated once at its final length and written in place, so every
one-token step has the same shapes: the step can then be compiled and, on CUDA, captured as a graph.
The attention mask given with a static cache spans all its columns; columns not yet written sit past
the query's position, where the causal mask already hides them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn
from transformers import Cache, DynamicCache, StaticCache
from transformers.cache_utils import DynamicLayer


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


def preallocated_cache(model: nn.Module, length: int, prefix: DynamicCache | None = None) -> StaticCache:
    """A ``StaticCache`` of ``length`` columns for ``model``, holding ``prefix``'s columns first when given.

    Its tensors are allocated at the first write ([B, H, length, D] per layer, B, H, D and the dtype
    taken from that write); ``prefix`` ([B, H, S, D] per layer, S < length) is that first write.
    """
    cache = StaticCache(config=model.config, max_cache_len=length)
    if prefix is not None:
        if len(prefix.layers) != len(cache.layers):
            raise ValueError(f"the prefix cache has {len(prefix.layers)} layers, the model {len(cache.layers)}")
        for static_layer, layer in zip(cache.layers, prefix.layers):
            static_layer.update(layer.keys, layer.values)
    return cache


_COMPILED_STEPS: weakref.WeakKeyDictionary[nn.Module, Callable] = weakref.WeakKeyDictionary()


def one_token_step(model: nn.Module, compiled: bool) -> Callable:
    """The callable that runs ``model``'s one-token decode steps: the model itself, or its forward under
    ``torch.compile`` (compiled once per model; ``reduce-overhead``, i.e. a CUDA graph, on CUDA)."""
    if not compiled:
        return model
    step = _COMPILED_STEPS.get(model)
    if step is None:
        on_cuda = next(model.parameters()).device.type == "cuda"
        # The class's forward, not the bound method, so the cached callable holds no reference to the model.
        forward = torch.compile(type(model).forward, mode="reduce-overhead" if on_cuda else None)
        step = _COMPILED_STEPS[model] = forward
    return lambda **inputs: step(model, **inputs)
