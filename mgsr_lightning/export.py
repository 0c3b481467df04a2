"""Saving a trained student in Hugging Face format, ready for ``transformers.pipeline``."""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import GenerationConfig, PreTrainedModel

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

    The generation config records the EOS that ends a response and the pad token, so
    ``pipeline("text-generation", model=folder)`` stops where training taught the student to stop.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    eos = eos_token_id if eos_token_id is not None else tokenizer.eos_token_id
    student.config.eos_token_id = eos
    student.config.pad_token_id = tokenizer.pad_token_id
    student.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    student.save_pretrained(folder, state_dict=state_dict)
    tokenizer.save_pretrained(folder)
    log.info("student saved to %s", folder)
    return folder
