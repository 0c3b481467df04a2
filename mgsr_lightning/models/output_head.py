"""A causal LM's output head as a matrix: logits = last hidden states @ weight.T (+ bias).

The fused head (:mod:`mgsr_lightning.losses.fused_head`) computes the logits itself, chunk by chunk, so it
needs the head as a plain linear map of the hidden states ``response_hidden_states`` returns. Models whose
forward does more (Gemma-2's final soft-capping, a logit scale, an adapted or quantised head, a head
sharded by FSDP) are refused with the reason, and their logits come from the model's own forward.
"""

from __future__ import annotations

from torch import Tensor, nn


def linear_output_head(model: nn.Module) -> tuple[Tensor, Tensor | None] | str:
    """``(weight [V', H], bias [V'] | None)`` of ``model``'s output head, or why its logits are not that."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not nn.Linear:  # an adapter's or a quantised layer computes more than weight @ x
        return f"its output head is {type(head).__name__}, not a plain nn.Linear"
    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling"):
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            return f"its forward changes the head's output ({name} = {value})"
    if type(head.weight).__name__ == "DTensor" or head.weight.dim() != 2:
        return "its output head is sharded or flattened (FSDP)"
    return head.weight, head.bias
