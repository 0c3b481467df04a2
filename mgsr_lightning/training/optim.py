"""The optimizer: AdamW over the student (no decay on biases and norms) and ClipNet's own group."""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from transformers import get_scheduler


@dataclass
class OptimizerConfig:
    """AdamW with a warm-up and a decay schedule (DistiLLM: weight decay 1e-2, cosine, no warm-up).

    Args:
        lr: Peak learning rate of the student.
        weight_decay: Decoupled weight decay (not applied to biases and norms).
        betas: Adam betas.
        warmup_steps: Linear warm-up steps.
        schedule: ``cosine``, ``linear`` or ``constant`` (any name of ``transformers.get_scheduler``).
    """

    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    schedule: str = "cosine"


def no_decay_names(model: nn.Module) -> set[str]:
    """Names of the parameters without weight decay (biases, norms). Read them before any sharding
    wrapper flattens the parameters."""
    return {name for name, p in model.named_parameters() if p.ndim < 2 or "norm" in name.lower()}


def _unwrapped(name: str) -> str:
    """A parameter name without the prefixes sharding wrappers insert."""
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


def parameter_groups(
    student: nn.Module,
    config: OptimizerConfig,
    no_decay: set[str],
    clip_net: nn.Module | None = None,
    clip_net_lr: float | None = None,
) -> list[dict]:
    """The student's trainable parameters with and without decay, and ClipNet's (no decay, own lr)."""
    decay_params, no_decay_params = [], []
    for name, parameter in student.named_parameters():
        if parameter.requires_grad:
            (no_decay_params if _unwrapped(name) in no_decay else decay_params).append(parameter)
    groups = [{"params": decay_params, "weight_decay": config.weight_decay},
              {"params": no_decay_params, "weight_decay": 0.0}]
    if clip_net is not None:
        groups.append({"params": list(clip_net.parameters()), "weight_decay": 0.0, "lr": clip_net_lr})
    return groups


def build_optimizer(groups: list[dict], config: OptimizerConfig, total_steps: int) -> dict:
    """AdamW over ``groups`` and its per-step schedule, as ``configure_optimizers`` returns them."""
    optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas))
    scheduler = get_scheduler(
        config.schedule, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=total_steps
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def clip_gradients(module: L.LightningModule, optimizer, clip_val: float | None, algorithm: str | None) -> None:
    """Lightning's gradient clipping, except under FSDP: its precision plugin refuses norm clipping,
    so the root FSDP module clips by the norm across all shards (``clip_grad_norm_``)."""
    if clip_val and algorithm in (None, "norm") and isinstance(module.trainer.strategy, FSDPStrategy):
        module.trainer.strategy.model.clip_grad_norm_(clip_val)
    else:
        module.clip_gradients(optimizer, clip_val, algorithm)
