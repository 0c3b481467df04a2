"""The exact-match vocabulary map: the token strings two vocabularies share, as two id tensors.

Tokens are compared by what they spell, as UTF-8 bytes, after undoing each tokenizer's own encoding
of its pieces, read from its decoder (``tokenizer.json``):

- byte-level BPE (GPT-2, LLaMA-3, Qwen): each character of a piece stands for one byte (``Ġ`` = space,
  ``Ċ`` = newline); pieces that are part of a multi-byte character are their raw bytes;
- SentencePiece style (LLaMA-2, Gemma): ``▁`` is a space and ``<0xAB>`` a byte-fallback token (byte 0xAB);
- WordPiece (BERT): ``##piece`` continues a word (``piece``), any other piece starts one (`` piece``,
  as the WordPiece decoder puts a space before it);
- anything else: the piece's own UTF-8.

Special tokens (the tokenizer's added special tokens: BOS, EOS, pad, chat markers) are matched by their
literal string only, never with text; and the two end-of-sequence tokens are paired by role when their
strings differ. Pieces spelling the same bytes twice in one vocabulary keep one id (a piece before a byte-fallback
token, then the lowest id); the others are left unmatched, so that no id appears twice in the map.

Known limits: a first word without its leading space (SentencePiece's ``▁Hello`` against BPE's
``Hello``) matches only when both spell it alike; a piece's meaning beyond its bytes (a word start or
not) is not compared.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import torch
from torch import Tensor

from mgsr_lightning.cross_tokenizer.alignment import require_offsets

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(frozen=True)
class SharedVocabulary:
    """student_ids [S] and teacher_ids [S] (long): entry j of both is the same string, ``surfaces[j]``
    (its bytes; special tokens as ``("special", string)``). No id appears twice on a side."""

    student_ids: Tensor
    teacher_ids: Tensor
    surfaces: list[bytes | tuple[str, str]]

    def __len__(self) -> int:
        return len(self.surfaces)


def shared_vocabulary(student_tokenizer, teacher_tokenizer) -> SharedVocabulary:
    """The strings both vocabularies hold (module docstring), ordered by student id."""
    require_offsets(student_tokenizer, "student")
    require_offsets(teacher_tokenizer, "teacher")
    teacher_by_surface = _id_by_surface(teacher_tokenizer)
    pairs = [(student_id, teacher_by_surface[surface], surface)
             for surface, student_id in _id_by_surface(student_tokenizer).items() if surface in teacher_by_surface]
    student_eos, teacher_eos = student_tokenizer.eos_token_id, teacher_tokenizer.eos_token_id
    paired_student, paired_teacher = {p[0] for p in pairs}, {p[1] for p in pairs}
    if (student_eos is not None and teacher_eos is not None and student_eos not in paired_student
            and teacher_eos not in paired_teacher):
        pairs.append((student_eos, teacher_eos, ("special", "<end of sequence>")))
    pairs.sort(key=lambda pair: pair[0])
    return SharedVocabulary(
        student_ids=torch.tensor([p[0] for p in pairs], dtype=torch.long),
        teacher_ids=torch.tensor([p[1] for p in pairs], dtype=torch.long),
        surfaces=[p[2] for p in pairs],
    )


def token_surfaces(tokenizer) -> dict[int, bytes | tuple[str, str]]:
    """id -> what the token spells: bytes for text pieces, ``("special", string)`` for special tokens."""
    require_offsets(tokenizer, "given")
    decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    kinds = _decoder_kinds(decoder)
    special = set(tokenizer.all_special_tokens)
    byte_decoder = _byte_level_decoder() if "ByteLevel" in kinds else None
    surfaces = {}
    for piece, token_id in tokenizer.get_vocab().items():
        if piece in special:
            surfaces[token_id] = ("special", piece)
        elif byte_decoder is not None and all(c in byte_decoder for c in piece):
            surfaces[token_id] = bytes(byte_decoder[c] for c in piece)
        elif "ByteFallback" in kinds and _BYTE_FALLBACK.fullmatch(piece):
            surfaces[token_id] = bytes([int(_BYTE_FALLBACK.fullmatch(piece).group(1), 16)])
        elif "WordPiece" in kinds:
            surfaces[token_id] = piece[2:].encode() if piece.startswith("##") else b" " + piece.encode()
        elif "Metaspace" in kinds or "Replace" in kinds:
            surfaces[token_id] = piece.replace("▁", " ").encode()
        else:
            surfaces[token_id] = piece.encode()
    return surfaces


def _id_by_surface(tokenizer) -> dict[bytes | tuple[str, str], int]:
    """surface -> the id that spells it; of several, a piece before a byte-fallback token (``▁`` before
    ``<0x20>``: the tokenizer emits the piece), then the lowest id."""
    surfaces = token_surfaces(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(surfaces))
    fallback = {i for i, piece in zip(surfaces, pieces) if _BYTE_FALLBACK.fullmatch(piece)}
    by_surface: dict = {}
    for token_id in sorted(surfaces, key=lambda i: (i in fallback, i)):
        by_surface.setdefault(surfaces[token_id], token_id)
    return by_surface


def _decoder_kinds(decoder: dict) -> set[str]:
    """The decoder types in a ``tokenizer.json`` decoder, sequences flattened."""
    kinds = {decoder.get("type", "")}
    for inner in decoder.get("decoders") or []:
        kinds |= _decoder_kinds(inner)
    return kinds


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes stand for themselves, the others
    are shifted to code points 256 and up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    decoder = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            decoder[chr(256 + shifted)] = b
            shifted += 1
    return decoder
