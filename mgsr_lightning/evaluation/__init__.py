"""Evaluation: MiniLLM/DistiLLM's ROUGE-L protocol over sampling seeds, the five evaluation sets,
DDP-correct metrics for validation, and the Table-1 report.

- :mod:`.rouge`: ROUGE-L ×100 and exact match per example, exactly as the peers' ``rouge_metric.py``.
- :mod:`.metrics`: torchmetrics ``RougeL`` / ``ExactMatch`` (sum/count states) for validation
  (``callbacks.GenerationMetrics``).
- :mod:`.readers`: DollyEval, SelfInst, Vicuna, S-NI, UnNI (``EVAL_SETS``) and Dolly-15k's 1,000-row split.
- :mod:`.evaluate`: ``evaluate_model`` (generate + score over seeds; generations.jsonl, metrics.json, table.md).
- :mod:`.report`: Table 1 in markdown and as a bar chart, from several runs' metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mgsr_lightning.lazy import lazy_exports

if TYPE_CHECKING:
    from mgsr_lightning.evaluation.evaluate import DEFAULT_SEEDS, EvalConfig, evaluate_model
    from mgsr_lightning.evaluation.metrics import ExactMatch, MeanScore, MeanTextScore, RougeL
    from mgsr_lightning.evaluation.readers import (
        EVAL_SETS,
        EvalSetSpec,
        load_dolly15k,
        load_eval_set,
        split_dolly15k,
    )
    from mgsr_lightning.evaluation.report import format_table1, plot_table1, summarize_runs, write_report
    from mgsr_lightning.evaluation.rouge import exact_match, normalize_answer, rouge_l
    from mgsr_lightning.generation.decode import decode_responses
    from mgsr_lightning.seeding import example_seeds

__all__ = [
    "DEFAULT_SEEDS",
    "EVAL_SETS",
    "EvalConfig",
    "EvalSetSpec",
    "ExactMatch",
    "MeanScore",
    "MeanTextScore",
    "RougeL",
    "decode_responses",
    "evaluate_model",
    "exact_match",
    "example_seeds",
    "format_table1",
    "load_dolly15k",
    "load_eval_set",
    "normalize_answer",
    "plot_table1",
    "rouge_l",
    "split_dolly15k",
    "summarize_runs",
    "write_report",
]

# each name's module, imported on first use (PEP 562): importing one submodule (``rouge``, ``metrics``)
# does not load the evaluation loop and the data package
_HOMES = {
    **dict.fromkeys(("DEFAULT_SEEDS", "EvalConfig", "evaluate_model"), "mgsr_lightning.evaluation.evaluate"),
    **dict.fromkeys(("ExactMatch", "MeanScore", "MeanTextScore", "RougeL"), "mgsr_lightning.evaluation.metrics"),
    **dict.fromkeys(("EVAL_SETS", "EvalSetSpec", "load_dolly15k", "load_eval_set", "split_dolly15k"),
                    "mgsr_lightning.evaluation.readers"),
    **dict.fromkeys(("format_table1", "plot_table1", "summarize_runs", "write_report"),
                    "mgsr_lightning.evaluation.report"),
    **dict.fromkeys(("exact_match", "normalize_answer", "rouge_l"), "mgsr_lightning.evaluation.rouge"),
    "decode_responses": "mgsr_lightning.generation.decode",
    "example_seeds": "mgsr_lightning.seeding",
}

__getattr__, __dir__ = lazy_exports(globals(), _HOMES)
