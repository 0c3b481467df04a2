"""Sharding a teacher/student pair with FSDP, configured from YAML.

``FSDPStrategy``'s ``auto_wrap_policy`` takes Python classes, which a YAML config cannot name
directly; :class:`DecoderLayerFSDP` takes their import paths instead. Teacher and student layers
become separate FSDP units, so the frozen teacher is sharded across devices like the student
(a 13B teacher never has to fit on one GPU), and ``use_orig_params`` lets frozen and trainable
parameters share the root unit.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy


def import_class(path: str) -> type:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"cannot import {path!r} (a layer class for FSDP wrapping): {error}") from error


class DecoderLayerFSDP(FSDPStrategy):
    """FSDP that wraps every decoder layer class named in ``layer_classes``.

    Args:
        layer_classes: Import paths of the transformer block classes to wrap, e.g.
            ``transformers.models.llama.modeling_llama.LlamaDecoderLayer``.
        activation_checkpointing: Also checkpoint the activations of those layers.
        **kwargs: Any other ``FSDPStrategy`` argument (``sharding_strategy``, ``cpu_offload``, ...).
    """

    def __init__(self, layer_classes: list[str], activation_checkpointing: bool = False, **kwargs: Any):
        classes = {import_class(path) for path in layer_classes}
        kwargs.setdefault("use_orig_params", True)
        if activation_checkpointing:
            kwargs["activation_checkpointing_policy"] = classes
        super().__init__(auto_wrap_policy=classes, **kwargs)
