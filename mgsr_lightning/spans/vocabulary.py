"""The text each vocabulary entry stands for, from the raw token strings of a byte-level (GPT-2 style)
or SentencePiece vocabulary; used by both span priors (:mod:`mgsr_lightning.spans.token_prior`,
:mod:`mgsr_lightning.spans.text_prior`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

SCHEMES = ("auto", "byte_level", "sentencepiece")


def _byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves, the
    other 68 bytes map, in order, to U+0100 onwards ("Ġ" is the space, "Ċ" the newline)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


_BYTE_LEVEL = _byte_level_decoder()
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_texts(tokens: Sequence[str | None], scheme: str = "auto") -> list[str]:
    """The text each vocabulary entry stands for (a leading space marks a word start).

    tokens: the raw vocabulary strings by id (``convert_ids_to_tokens``). scheme: "byte_level"
    (GPT-2 style, "Ġ" = space), "sentencepiece" ("▁" = space, "<0xNN>" byte fallback) or "auto"
    (whichever marker prefixes more entries). Bytes that are not a whole UTF-8 character decode to
    U+FFFD. Missing entries (None) give "".
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if scheme == "auto":
        byte_level = sum(t.startswith("Ġ") for t in tokens if t)
        sentencepiece = sum(t.startswith("▁") for t in tokens if t)
        if byte_level == sentencepiece == 0:
            raise ValueError(
                "cannot tell the word-start marker of this vocabulary (no 'Ġ' or '▁' prefixes); pass scheme="
            )
        scheme = "byte_level" if byte_level > sentencepiece else "sentencepiece"
    texts = []
    for token in tokens:
        if token is None:
            texts.append("")
        elif scheme == "byte_level" and all(ch in _BYTE_LEVEL for ch in token):
            texts.append(bytes(_BYTE_LEVEL[ch] for ch in token).decode("utf-8", errors="replace"))
        elif scheme == "sentencepiece" and (fallback := _BYTE_FALLBACK.fullmatch(token)):
            texts.append(bytes([int(fallback.group(1), 16)]).decode("utf-8", errors="replace"))
        else:
            texts.append(token.replace("▁", " ") if scheme == "sentencepiece" else token)
    return texts
