"""Saving a trained student in Hugging Face format, ready for ``transformers.pipeline``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from transformers import GenerationConfig, PreTrainedModel

from mgsr_lightning.atomic import atomic_folder
from mgsr_lightning.models.lora import merged_lora

log = logging.getLogger(__name__)

# beside an exported model: how it was trained to be prompted, so `evaluate` prompts it the same way
TRAINING_SETTINGS = "mgsr_training.json"


def export_student(
    student: PreTrainedModel,
    tokenizer,
    folder: str | Path,
    eos_token_id: int | None = None,
    state_dict: dict | None = None,
    training_settings: dict[str, Any] | None = None,
) -> Path:
    """``save_pretrained`` the student and its tokenizer into ``folder``.

    ``state_dict`` (the student's full weights) replaces the model's own, e.g. a best checkpoint's,
    or the gathered weights of a sharded model.

    The folder is written beside ``folder`` and moved in when complete, so a full disk never leaves
    a half-written model that looks finished.

    The generation config records the EOS that ends a response and the pad token, so
    ``pipeline("text-generation", model=folder)`` stops where training taught the student to stop.

    A LoRA student is saved with its adapters merged into the weights: a plain model of the base's
    architecture, which loads without ``peft``.

    ``training_settings`` (the prompt template, length limits and data of the run; see
    :func:`training_settings`) are written to ``mgsr_training.json``, where ``evaluate`` finds them.
    """
    folder = Path(folder)
    if hasattr(student, "merge_and_unload"):  # LoRA: the adapters merged in, a plain model saved
        student, state_dict = merged_lora(student, state_dict), None
    eos = eos_token_id if eos_token_id is not None else tokenizer.eos_token_id
    student.config.eos_token_id = eos
    student.config.pad_token_id = tokenizer.pad_token_id
    student.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    with atomic_folder(folder) as temporary:  # config.json, the mark of a complete folder, arrives last
        student.save_pretrained(temporary, state_dict=state_dict)
        tokenizer.save_pretrained(temporary)
        if training_settings is not None:
            (temporary / TRAINING_SETTINGS).write_text(json.dumps(training_settings, indent=2) + "\n")
    log.info("student saved to %s", folder)
    return folder


def training_settings(data_hparams: dict[str, Any] | None, max_new_tokens: int | None) -> dict[str, Any] | None:
    """What evaluating a model the way it was trained needs: its data module's template, prompt and
    total length limits, EOS and data files, and the response length its rollouts sampled."""
    if not data_hparams:
        return None
    keys = ("template", "max_prompt_length", "max_length", "eos_token", "train_data", "val_data", "test_data")
    return {**{key: data_hparams.get(key) for key in keys}, "max_new_tokens": max_new_tokens}
