"""Evaluation: MiniLLM/DistiLLM's ROUGE-L protocol over sampling seeds, the five evaluation sets,
DDP-correct metrics for validation, and the Table-1 report.

- :mod:`.rouge`: ROUGE-L ×100 and exact match per example, exactly as the peers' ``rouge_metric.py``.
- :mod:`.metrics`: torchmetrics ``RougeL`` / ``ExactMatch`` (sum/count states) for validation
  (``training.callbacks.GenerationMetrics``).
- :mod:`.readers`: DollyEval, SelfInst, Vicuna, S-NI, UnNI (``EVAL_SETS``) and Dolly-15k's 1,000-row split.
- :mod:`.evaluate`: ``evaluate_model`` (generate + score over seeds; generations.jsonl, metrics.json, table.md).
- :mod:`.report`: Table 1 in markdown and as a bar chart, from several runs' metrics.
- :mod:`.exposure_bias`: ExAccErr curves of a student against its teacher.
"""
