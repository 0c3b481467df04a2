"""Byte-level BPE tokenizers trained locally, for the embedded default and the tests.

Real pairs use their own tokenizer (``AutoTokenizer.from_pretrained``); this module only exists so
that everything can run with no hub: a GPT-2-style byte-level BPE is trained on local text with
the ``tokenizers`` library and wrapped as a ``PreTrainedTokenizerFast`` that saves and loads like
any Hugging Face tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from mgsr_lightning.errors import ConfigError, LoadError

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 2048,
    save_dir: str | Path | None = None,
    model_max_length: int = 512,
) -> PreTrainedTokenizerFast:
    """Train a GPT-2-style byte-level BPE on ``texts``.

    The result has ``<|endoftext|>`` as BOS/EOS (as GPT-2) and a separate ``<|pad|>`` token, so that
    padding is never confused with the end of a response. Saved with ``save_pretrained`` when
    ``save_dir`` is given.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=model_max_length,
    )
    if save_dir is not None:
        fast.save_pretrained(str(save_dir))
    return fast


def load_tokenizer(name_or_path: str, gguf_file: str | None = None):
    """``AutoTokenizer.from_pretrained`` with a clear error, and a pad token guaranteed.

    Tokenizers without a pad token (GPT-2, LLaMA) pad with EOS; every batch carries explicit masks,
    so padding is never mistaken for an end of response.
    """
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError) as error:
        raise LoadError(
            f"could not load a tokenizer from {name_or_path!r}: "
            f"{str(error).splitlines()[0] if str(error) else error!r}. "
            "Give a folder written by `save_pretrained` (e.g. the one `python -m mgsr_lightning prepare-tiny` "
            "writes) or a hub id reachable from this machine."
        ) from error
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tokenizer_of(name_or_path: str, gguf_file: str | None = None):
    """The tokenizer saved with a model, or None when its folder or hub entry has none."""
    from transformers import AutoTokenizer

    folder = Path(name_or_path)
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if folder.is_dir() and not gguf_file and not any((folder / name).is_file() for name in tokenizer_files):
        return None  # a bare model folder: AutoTokenizer would improvise one from the config
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        return AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError):
        return None


def token_id(tokenizer, token: str | None) -> int:
    """Id of ``token`` (default: the tokenizer's EOS), failing clearly if it is not one token."""
    if token is None:
        if tokenizer.eos_token_id is None:
            raise ConfigError("the tokenizer has no EOS token; set `eos_token` to the token that ends a response")
        return tokenizer.eos_token_id
    index = tokenizer.convert_tokens_to_ids(token)
    if index is None or index == tokenizer.unk_token_id:
        raise ConfigError(f"{token!r} is not a single token of this tokenizer")
    return index
