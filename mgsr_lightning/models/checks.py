"""What a model's config and saved tokenizer say, read without its weights: the positions it takes and whether its
vocabulary is the data's. :func:`mgsr_lightning.cli.validation.check_run_config` and ``evaluate`` check with them
before any model is loaded."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mgsr_lightning.errors import ConfigError, MissingFileError
from mgsr_lightning.missing import describe_missing, looks_like_path

POSITION_ATTRIBUTES = ("n_positions", "max_position_embeddings", "n_ctx", "max_sequence_length")


def get_dotted(namespace: Any, dotted: str, default: Any = None) -> Any:
    """``namespace.a.b`` for ``dotted = "a.b"``, through attributes and mappings alike; ``default`` where a
    part is missing or None."""
    value = namespace
    for part in dotted.split("."):
        if value is None:
            return default
        value = value.get(part, default) if isinstance(value, Mapping) else getattr(value, part, default)
    return value


def model_positions(name_or_path: str | None, config: Mapping[str, Any] | None = None) -> int | None:
    """Most positions (prompt + response tokens) the model takes, read from its config only (no weights).

    None when unknown: a hub id that cannot be reached, or an architecture without a position limit.
    """
    from transformers import AutoConfig

    overrides = dict(config or {})
    try:
        if name_or_path is not None:
            model_config = AutoConfig.from_pretrained(name_or_path)
        elif "model_type" in overrides:
            model_config = AutoConfig.for_model(overrides["model_type"])
        else:
            return None
    except (OSError, ValueError, KeyError):
        return None
    for attribute in POSITION_ATTRIBUTES:
        value = overrides.get(attribute, getattr(model_config, attribute, None))
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_positions(role: str, source: Any, needed: int, why: str) -> None:
    """``needed`` tokens fit in the position table of the model ``source`` describes."""
    name_or_path, config = get_dotted(source, "name_or_path"), get_dotted(source, "config")
    if (name_or_path is not None and not Path(name_or_path).expanduser().exists()
            and (looks_like_path(name_or_path) or os.path.lexists(Path(name_or_path).expanduser()))):
        raise MissingFileError(f"{role}: model folder {describe_missing(name_or_path)}")
    positions = model_positions(name_or_path, config)
    if positions is not None and needed > positions:
        raise ConfigError(
            f"the {role} has {positions} positions but {why} = {needed} tokens; lower them to at most {positions}"
        )


def check_vocabulary(tokenizer: str | None, sources: dict[str, Any]) -> None:
    """The vocabulary check of :func:`mgsr_lightning.models.loading.check_vocabularies`, for models in local
    folders, from their ``config.json`` and saved tokenizers instead of their weights."""
    from transformers import AutoConfig

    from mgsr_lightning.models.loading import check_vocabularies
    from mgsr_lightning.models.tokenizer import load_tokenizer, tokenizer_of

    folders = {role: get_dotted(source, "name_or_path") for role, source in sources.items() if source is not None}
    folders = {role: folder for role, folder in folders.items()
               if folder and Path(folder).is_dir() and not get_dotted(sources[role], "gguf_file")}
    if not folders or tokenizer is None or not Path(tokenizer).expanduser().exists():
        return
    data_tokenizer = load_tokenizer(tokenizer)
    rows = {}
    for role, folder in folders.items():
        try:
            config = AutoConfig.from_pretrained(folder)
        except (OSError, ValueError):
            continue
        vocab_size = (get_dotted(sources[role], "config") or {}).get("vocab_size", getattr(config, "vocab_size", None))
        if isinstance(vocab_size, int):
            rows[role] = vocab_size
    own = {role: tokenizer_of(folder) for role, folder in folders.items()}
    check_vocabularies(len(data_tokenizer), rows, {"data": data_tokenizer} | own)
