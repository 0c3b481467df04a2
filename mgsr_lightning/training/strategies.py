"""Sharding a teacher/student pair with FSDP, configured from YAML.

``FSDPStrategy``'s ``auto_wrap_policy`` takes Python objects, which a YAML config cannot name
directly; :class:`DecoderLayerFSDP` takes the decoder layer classes' import paths instead and
builds the policy: every decoder layer is an FSDP unit, and so is the frozen teacher as a whole.
The teacher being its own unit keeps its (bf16, frozen) parameters out of the root unit, whose
student embeddings and ClipNet are fp32 and trainable: FSDP flattens one dtype per unit. So the
teacher is sharded across devices like the student, and a 13B teacher never has to fit on one.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy
from transformers import PreTrainedModel


def import_class(path: str) -> type:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"cannot import {path!r} (a layer class for FSDP wrapping): {error}") from error


def is_frozen_model(module: nn.Module) -> bool:
    """A whole pretrained model none of whose parameters train: the teacher."""
    return isinstance(module, PreTrainedModel) and not any(p.requires_grad for p in module.parameters())


class DecoderLayerFSDP(FSDPStrategy):
    """FSDP that wraps every decoder layer class named in ``layer_classes``, and the frozen teacher.

    Args:
        layer_classes: Import paths of the transformer block classes to wrap, e.g.
            ``transformers.models.llama.modeling_llama.LlamaDecoderLayer``.
        activation_checkpointing: Also checkpoint the activations of those layers.
        **kwargs: Any other ``FSDPStrategy`` argument (``sharding_strategy``, ``cpu_offload``, ...).
    """

    def __init__(self, layer_classes: list[str], activation_checkpointing: bool = False, **kwargs: Any):
        classes = tuple(import_class(path) for path in layer_classes)
        kwargs.setdefault("use_orig_params", True)
        if activation_checkpointing:
            kwargs["activation_checkpointing_policy"] = set(classes)
        policy = functools.partial(
            lambda_auto_wrap_policy, lambda_fn=lambda module: isinstance(module, classes) or is_frozen_model(module)
        )
        super().__init__(auto_wrap_policy=policy, **kwargs)
