"""torchmetrics ``Metric``s for generated text: mean ROUGE-L and mean exact match over examples.

Each metric keeps two float64 states, ``score_sum`` (Σ of per-example scores) and ``num_examples``,
both reduced with ``dist_reduce_fx="sum"``. ``compute()`` returns ``score_sum / num_examples`` over
every example seen by every rank, so the value does not depend on how the examples were split
across DDP ranks or batches (up to float64 summation order). ``callbacks.GenerationMetrics``
updates one per validation batch and logs ``compute()`` at epoch end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torchmetrics import Metric

from mgsr_lightning.evaluation.rouge import exact_match, rouge_l


class MeanScore(Metric):
    """Mean of per-example scores; ``update(scores)`` takes N floats (a list or a [N] tensor).

    ``compute()``: a 0-dim float64 tensor, Σ scores / N over all updates and ranks (0 when N = 0).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("score_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_examples", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: Sequence[float] | torch.Tensor) -> None:
        scores = torch.as_tensor(scores, dtype=torch.float64, device=self.score_sum.device).flatten()
        self.score_sum += scores.sum()
        self.num_examples += scores.numel()

    def compute(self) -> torch.Tensor:
        return self.score_sum / self.num_examples.clamp_min(1)


class MeanTextScore(MeanScore):
    """Mean over examples of ``score_fn(prediction, references)``.

    ``update(predictions, references)``: N prediction strings and N reference entries, each a
    string or a list of strings.
    """

    def __init__(self, score_fn: Callable[[str, str | Sequence[str]], float], **kwargs):
        super().__init__(**kwargs)
        self.score_fn = score_fn

    def update(self, predictions: Sequence[str], references: Sequence[str | Sequence[str]]) -> None:
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} reference entries")
        super().update([self.score_fn(prediction, refs) for prediction, refs in zip(predictions, references)])


class RougeL(MeanTextScore):
    """Mean ROUGE-L F ×100 (rouge-score, stemmed, max over references), as MiniLLM/DistiLLM report it."""

    def __init__(self, **kwargs):
        super().__init__(rouge_l, **kwargs)


class ExactMatch(MeanTextScore):
    """Mean exact match ×100 (SQuAD normalisation without article removal, max over references)."""

    def __init__(self, **kwargs):
        super().__init__(exact_match, **kwargs)
