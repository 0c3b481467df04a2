"""LoRA adapters on a student (through ``peft``): their settings, the wrapping, and the merge on export."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedModel

from mgsr_lightning.errors import ConfigError, LoadError


@dataclass
class LoraSettings:
    """LoRA adapters on a student (through ``peft``; merged into the weights on export).

    Args:
        r: Rank of each adapter.
        alpha: Scaling numerator (the update is ``alpha / r · B A``).
        dropout: Dropout on the adapters' input.
        targets: Names of the linear modules adapted (e.g. ``[q_proj, v_proj]``); default: every
            linear layer but the output head (peft's ``all-linear``).
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: list[str] | None = None

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ConfigError(f"lora.r must be at least 1, got {self.r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora.dropout must be in [0, 1), got {self.dropout}")


def add_lora(model: PreTrainedModel, settings: LoraSettings) -> PreTrainedModel:
    """Wrap ``model`` with trainable LoRA adapters (everything else frozen)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:
        raise LoadError("student.lora needs the `peft` package: pip install '.[lora]'") from error
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=settings.targets or "all-linear", task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as error:
        raise ConfigError(f"student.lora: {error}") from error


def merged_lora(model: PreTrainedModel, state_dict: dict | None = None) -> PreTrainedModel:
    """A plain copy of a LoRA-wrapped model with the adapters merged into the weights (the model itself
    is left as it is); a model without adapters is returned unchanged. ``state_dict`` (the wrapped
    model's keys) is loaded into the copy first."""
    if not hasattr(model, "merge_and_unload"):
        return model
    import copy

    wrapped = copy.deepcopy(model)
    if state_dict is not None:
        wrapped.load_state_dict(state_dict)
    return wrapped.merge_and_unload()
