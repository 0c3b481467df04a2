"""Saving a trained student in Hugging Face format, ready for ``transformers.pipeline``."""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import GenerationConfig, PreTrainedModel

from mgsr_lightning.atomic import atomic_folder
from mgsr_lightning.models import merged_lora

log = logging.getLogger(__name__)


def export_student(
    student: PreTrainedModel,
    tokenizer,
    folder: str | Path,
    eos_token_id: int | None = None,
    state_dict: dict | None = None,
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
    log.info("student saved to %s", folder)
    return folder
