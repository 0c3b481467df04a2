"""Distilling across tokenizers: the alignment of two tokenizations on the text, and the shared vocabulary.

The losses themselves are pure functions of tensors in :mod:`mgsr_lightning.losses.cross_tokenizer`.
"""

from mgsr_lightning.cross_tokenizer.alignment import (
    SideTokens,
    TextAlignment,
    TokenizedSide,
    align_spans,
    align_texts,
    align_tokens,
    pad_token_id_of,
    require_offsets,
    tokenize_with_spans,
)
from mgsr_lightning.cross_tokenizer.retokenize import align_student_ids, text_and_spans
from mgsr_lightning.cross_tokenizer.vocabulary_map import SharedVocabulary, shared_vocabulary, token_surfaces

__all__ = [
    "SharedVocabulary",
    "SideTokens",
    "TextAlignment",
    "TokenizedSide",
    "align_spans",
    "align_student_ids",
    "align_texts",
    "align_tokens",
    "pad_token_id_of",
    "require_offsets",
    "shared_vocabulary",
    "text_and_spans",
    "tokenize_with_spans",
    "token_surfaces",
]
