"""Distilling across tokenizers: the alignment of two tokenizations on the text, the shared vocabulary, the
student's own ids re-tokenised for the teacher, a training step's teacher side (``teacher_side``), and SCRG's
corrections carried through text.

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
from mgsr_lightning.cross_tokenizer.correction import TextCorrection, correction_through_text
from mgsr_lightning.cross_tokenizer.retokenize import align_student_ids, text_and_spans
from mgsr_lightning.cross_tokenizer.teacher_side import (
    aligned_groups,
    is_paired,
    paired_teacher_side,
    retokenized_teacher_side,
)
from mgsr_lightning.cross_tokenizer.vocabulary_map import SharedVocabulary, shared_vocabulary, token_surfaces

__all__ = [
    "SharedVocabulary",
    "SideTokens",
    "TextAlignment",
    "TextCorrection",
    "TokenizedSide",
    "align_spans",
    "align_student_ids",
    "align_texts",
    "align_tokens",
    "aligned_groups",
    "correction_through_text",
    "is_paired",
    "paired_teacher_side",
    "pad_token_id_of",
    "require_offsets",
    "retokenized_teacher_side",
    "shared_vocabulary",
    "text_and_spans",
    "tokenize_with_spans",
    "token_surfaces",
]
