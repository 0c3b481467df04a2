"""ROUGE-L and exact match, computed exactly as MiniLLM and DistiLLM score their evaluation sets.

Both peers score with ``rouge_metric.py`` (identical in microsoft/LMOps ``minillm/`` and
jongwooko/distillm):

- **ROUGE-L** is ``rouge_score.rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)`` applied to
  the *raw* prediction and reference strings. The only normalisation is rouge-score's own
  tokeniser: lower-case, every run of characters outside ``[a-z0-9]`` becomes a space (so
  punctuation and non-ASCII letters vanish), then the Porter stemmer on tokens longer than 3
  characters. The SQuAD-style ``normalize_answer`` is **not** applied before ROUGE (it would merge
  "don't" into one token "dont" where rouge-score sees "don" "t").
- The F-measure is taken, maximised over the references of an example, and reported ×100.
- An empty prediction (or one with no ``[a-z0-9]`` characters) scores 0: rouge-score returns
  F = 0 when either side has no tokens.
- **Exact match** compares ``normalize_answer(prediction) == normalize_answer(reference)``
  (lower-case, ASCII punctuation removed, whitespace collapsed; articles are kept), maximised over
  references, ×100.

The peers round each run's corpus mean to 4 decimals; we keep full precision and round only when
formatting tables.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from rouge_score import rouge_scorer

_ROUGE_L_SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
_PUNCTUATION = frozenset(string.punctuation)


def as_references(output: str | Sequence[str]) -> list[str]:
    """A record's ``output`` (one reference or a list of them) as a non-empty list of references."""
    references = [output] if isinstance(output, str) else list(output)
    if not references:
        raise ValueError("an example needs at least one reference")
    return references


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 answer normalisation without article removal (the peers' exact-match key):
    lower-case, drop ``string.punctuation`` characters, collapse whitespace."""
    without_punctuation = "".join(char for char in text.lower() if char not in _PUNCTUATION)
    return " ".join(without_punctuation.split())


def rouge_l(prediction: str, references: str | Sequence[str]) -> float:
    """ROUGE-L F-measure ×100 of ``prediction``, the maximum over ``references`` (in [0, 100])."""
    return 100.0 * max(
        _ROUGE_L_SCORER.score(target=reference, prediction=prediction)["rougeL"].fmeasure
        for reference in as_references(references)
    )


def exact_match(prediction: str, references: str | Sequence[str]) -> float:
    """100 if the normalised prediction equals any normalised reference, else 0."""
    key = normalize_answer(prediction)
    return 100.0 if any(key == normalize_answer(reference) for reference in as_references(references)) else 0.0
