"""ROUGE-L and exact match against rouge-score itself, on hand-made pairs."""

import pytest
from rouge_score import rouge_scorer

from mgsr_lightning.evaluation.rouge import exact_match, normalize_answer, rouge_l

SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def reference_rouge_l(prediction, references):
    """MiniLLM's rouge_metric.py: raw strings into the stemmed scorer, F-measure, max over references, ×100."""
    references = [references] if isinstance(references, str) else references
    return 100.0 * max(SCORER.score(target=ref, prediction=prediction)["rougeL"].fmeasure for ref in references)


PAIRS = [
    ("The capital of France is Paris.", "Paris is the capital of France."),
    ("the cats are running quickly", "The cat runs quickly!"),  # stemming: cats→cat, running→run
    ("1, 3, 7, 9", "9 7 3 1"),  # order matters: LCS 1 of 4
    ("She walked to the old house on the hill.", "She walked up the hill to the old house, in the rain."),
    ("I don't know.", "I do not know"),
]


@pytest.mark.parametrize("prediction, reference", PAIRS)
def test_rouge_l_equals_rouge_score(prediction, reference):
    assert rouge_l(prediction, reference) == pytest.approx(reference_rouge_l(prediction, reference), abs=1e-12)
    assert 0.0 < rouge_l(prediction, reference) < 100.0


def test_rouge_l_is_the_max_over_references():
    prediction = "The children ran after her in the rain."
    references = ["A dog barked.", "The children ran after her.", "Rain fell on the old house."]
    per_reference = [reference_rouge_l(prediction, ref) for ref in references]
    assert rouge_l(prediction, references) == pytest.approx(max(per_reference))
    assert rouge_l(prediction, references) == pytest.approx(per_reference[1])
    assert len(set(per_reference)) == 3


def test_case_and_punctuation_do_not_count():
    assert rouge_l("PARIS!!!", "paris") == pytest.approx(100.0)
    assert rouge_l("Hello, world.", "hello world") == pytest.approx(100.0)


def test_empty_or_symbol_only_prediction_scores_zero():
    assert rouge_l("", "The capital of France is Paris.") == 0.0
    assert rouge_l("?!... --", ["Paris", "France"]) == 0.0


def test_normalisation_is_rouge_scores_own_not_squad():
    # MiniLLM feeds raw text to rouge-score; SQuAD normalisation first would make "don't" one token.
    prediction, reference = "I don't know", "I don t know"
    assert rouge_l(prediction, reference) == pytest.approx(100.0)
    assert reference_rouge_l(normalize_answer(prediction), normalize_answer(reference)) < 100.0


def test_rouge_l_needs_a_reference():
    with pytest.raises(ValueError, match="at least one reference"):
        rouge_l("Paris", [])


def test_exact_match_normalises_case_punctuation_and_spaces_and_takes_any_reference():
    assert normalize_answer("  The  Answer: 42! ") == "the answer 42"
    assert exact_match("The answer: 42!", ["41", "the answer 42"]) == 100.0
    assert exact_match("42", "forty-two") == 0.0
    assert exact_match("elppa", "elppa ") == 100.0
