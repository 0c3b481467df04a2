"""Generate responses for evaluation sets and score them with ROUGE-L (and exact match) over sampling seeds.

Protocol (MiniLLM/DistiLLM ``evaluate_main.py`` + ``run_eval.sh``):

- prompts: the record's ``prompt`` verbatim if present (MiniLLM's eval files), else the template;
  tokenised by ``data.datamodule.encode_records``, the same code as training;
- sampling: T = 1, top_k = 0, top_p = 1, at most 256 new tokens (MiniLLM: ``max_length 512`` minus
  prompts padded to ``max_prompt_length 256``), seeds 10, 20, 30, 40, 50;
- response: the generated tokens only, decoded with ``skip_special_tokens=True``, ``<n>`` turned
  into a newline, whitespace stripped;
- score: ROUGE-L F ×100 with rouge-score (stemmed, max over references), mean over examples per seed;
  the reported number is the mean over seeds, with the sample std across seeds.

**Reproducibility.** Example ``i`` of a set is sampled from its own random stream keyed by
``seed * 1_000_003 + i`` (:func:`mgsr_lightning.seeding.example_seeds`), so its response — and thus the score — does not
depend on the evaluation batch size, on the other examples in the batch, or on the number of DDP
ranks (for a given device type and library versions). The peers seed one global RNG per rank
(``seed + rank``), so their numbers change with batch size and GPU count.

**Long prompts.** MiniLLM cuts evaluation prompts to their first 256 tokens (which removes the
``### Response:`` cue); its Dolly processing drops them instead. We drop prompts longer than
``max_prompt_length`` tokens and report how many in ``dropped_long_prompts``; nothing is truncated.

**DDP.** With ``torch.distributed`` initialised, rank r generates examples r, r + W, r + 2W, ...;
ROUGE-L and exact match are summed across ranks by torchmetrics, generations are all-gathered, and
rank 0 writes the files. The model must be a full replica on every rank.

Outputs in ``output_dir``: ``generations.jsonl`` (one row per set × seed × example),
``metrics.json`` (the returned dict) and ``table.md``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from mgsr_lightning.atomic import atomic_path, write_text
from mgsr_lightning.data.collate import InstructionCollator
from mgsr_lightning.data.datamodule import encode_records
from mgsr_lightning.data.templates import PromptTemplate
from mgsr_lightning.distributed import gather_per_rank, rank_and_world_size
from mgsr_lightning.errors import ConfigError
from mgsr_lightning.evaluation.metrics import MeanScore
from mgsr_lightning.evaluation.readers import EVAL_SETS
from mgsr_lightning.evaluation.report import format_table1
from mgsr_lightning.evaluation.rouge import as_references, exact_match, rouge_l
from mgsr_lightning.generation.decode import Decoding, decode_responses, sample
from mgsr_lightning.generation.sampling import SamplingConfig
from mgsr_lightning.models.tokenizer import token_id
from mgsr_lightning.seeding import SEED_STRIDE, example_seeds

DEFAULT_SEEDS = (10, 20, 30, 40, 50)
SCORED_METRICS = ("rougeL", "exact_match")
# samples differ across these (and across device types), so metrics.json records them
VERSIONED_PACKAGES = ("torch", "transformers", "rouge-score", "nltk")


@dataclass
class EvalConfig:
    """How one model is evaluated.

    Args:
        seeds: sampling seeds; each gives one full pass over every set.
        sampling: decoding; default T = 1, top_k = 0, top_p = 1, max_new_tokens = 256.
        batch_size: prompts per generation batch (does not change the scores).
        max_prompt_length: prompts with more tokens are dropped and counted.
        max_examples: score only the first N rows of each set (quick checks); None = all.
        template: prompt template for records without a ``prompt``: alpaca, chat or plain.
        eos_token: token that ends a response; default the tokenizer's EOS.
        show_progress: tqdm bar on rank 0.
    """

    seeds: list[int] = field(default_factory=lambda: list(DEFAULT_SEEDS))
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    batch_size: int = 16
    max_prompt_length: int = 256
    max_examples: int | None = None
    template: PromptTemplate = "alpaca"
    eos_token: str | None = None
    show_progress: bool = True

    def __post_init__(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be a non-empty list of distinct integers, got {self.seeds}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")


def _mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (ddof = 1; 0 for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) >= 2 else 0.0


def _records_sha256(records: Sequence[Mapping[str, Any]]) -> str:
    """Fingerprint of the evaluated rows, so two result files can be checked to score the same data."""
    payload = json.dumps(list(records), sort_keys=True, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(payload).hexdigest()


def _generate_and_score(
    model: torch.nn.Module,
    tokenizer,
    batch: Mapping[str, torch.Tensor],
    records: Sequence[Mapping[str, Any]],
    decoding: Decoding,
    *,
    seed: int,
    set_name: str,
) -> list[dict[str, Any]]:
    """Sample one response per example of a collated batch and score it: one generations row per example."""
    device = next(model.parameters()).device
    rollout = sample(
        model, batch["prompt_ids"].to(device), batch["prompt_mask"].to(device), decoding,
        seeds=example_seeds(seed, batch["example_index"]),
    )
    rows = []
    for index, prediction, length in zip(
        batch["example_index"].tolist(), decode_responses(tokenizer, rollout), rollout.response_lengths().tolist()
    ):
        references = as_references(records[index]["output"])
        rows.append({
            "set": set_name, "seed": seed, "index": index, "prediction": prediction, "references": references,
            "response_tokens": length,
            "rougeL": rouge_l(prediction, references), "exact_match": exact_match(prediction, references),
        })
    return rows


@torch.no_grad()
def evaluate_model(
    model: torch.nn.Module,
    tokenizer,
    eval_sets: Mapping[str, Sequence[Mapping[str, Any]]],
    config: EvalConfig | None = None,
    output_dir: str | Path | None = None,
    *,
    method: str | None = None,
) -> dict[str, Any]:
    """Generate and score ``model`` on each set of ``eval_sets`` (name → records) for every seed.

    Returns (and writes as ``metrics.json``)::

        {"method": ..., "sets": {name: {
             "rougeL": mean over seeds, "rougeL_std": sample std over seeds, "rougeL_per_seed": [...],
             "exact_match": ..., "exact_match_std": ..., "exact_match_per_seed": [...],
             "num_rows": rows given, "num_examples": rows scored, "dropped_long_prompts": k,
             "mean_response_tokens": generated tokens per response (EOS included), "records_sha256": ...}},
         "avg": {"rougeL"/"exact_match" (+ _std, _per_seed): per seed the mean over sets, then as above},
         "config": {...}}
    """
    config = config or EvalConfig()
    rank, world_size = rank_and_world_size()
    device = next(model.parameters()).device
    eos_token_id = token_id(tokenizer, config.eos_token)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_id
    collator = InstructionCollator(pad_token_id)
    decoding = Decoding(config.sampling, eos_token_id, pad_token_id, vocab_size=len(tokenizer))

    prepared = {}
    for name, records in eval_sets.items():
        records = list(records)[: config.max_examples] if config.max_examples is not None else list(records)
        # Same prompt tokenisation and long-prompt policy as training; references are only scored, never
        # cut or used to drop a row, hence no total-length cap.
        examples, stats = encode_records(
            records, tokenizer, template=config.template, eos_token_id=eos_token_id, max_length=None,
            max_prompt_length=config.max_prompt_length, name=f"eval set {name}",
        )
        if not examples:
            raise ConfigError(f"eval set {name!r}: no example left to score ({stats['dropped_long_prompt']} of "
                             f"{len(records)} prompts exceed max_prompt_length={config.max_prompt_length})")
        prepared[name] = (records, examples[rank::world_size], stats)

    num_batches = sum(math.ceil(len(shard) / config.batch_size) for _, shard, _ in prepared.values())
    progress = tqdm(total=num_batches * len(config.seeds), desc="evaluate", unit="batch",
                    disable=not config.show_progress or rank != 0)
    results: dict[str, Any] = {"sets": {}}
    generations: list[dict[str, Any]] = []
    for name, (records, shard, stats) in prepared.items():
        per_seed: dict[str, list[float]] = {metric: [] for metric in SCORED_METRICS}
        rows = []
        for seed in config.seeds:
            progress.set_postfix(set=name, seed=seed)
            means = {metric: MeanScore().to(device) for metric in SCORED_METRICS}
            for start in range(0, len(shard), config.batch_size):
                batch_rows = _generate_and_score(
                    model, tokenizer, collator(shard[start : start + config.batch_size]), records, decoding,
                    seed=seed, set_name=name,
                )
                for metric in SCORED_METRICS:
                    means[metric].update([row[metric] for row in batch_rows])
                rows += batch_rows
                progress.update()
            for metric in SCORED_METRICS:
                per_seed[metric].append(float(means[metric].compute()))  # synced across ranks
        rows = sorted([row for part in gather_per_rank(rows) for row in part],
                      key=lambda row: (row["seed"], row["index"]))
        generations += rows
        set_result: dict[str, Any] = {"display_name": EVAL_SETS[name].display_name if name in EVAL_SETS else name}
        for metric, values in per_seed.items():
            set_result[metric], set_result[f"{metric}_std"] = _mean_and_std(values)
            set_result[f"{metric}_per_seed"] = values
        set_result.update(
            num_rows=len(records),
            num_examples=stats["kept"],
            dropped_long_prompts=stats["dropped_long_prompt"],
            mean_response_tokens=statistics.fmean(row["response_tokens"] for row in rows),
            records_sha256=_records_sha256(records),
        )
        results["sets"][name] = set_result
    progress.close()

    results["avg"] = {}
    for metric in SCORED_METRICS:
        per_seed_avg = [statistics.fmean(values) for values in
                        zip(*(result[f"{metric}_per_seed"] for result in results["sets"].values()))]
        results["avg"][metric], results["avg"][f"{metric}_std"] = _mean_and_std(per_seed_avg)
        results["avg"][f"{metric}_per_seed"] = per_seed_avg
    results["config"] = {
        "seeds": list(config.seeds),
        "sampling": asdict(config.sampling),
        "batch_size": config.batch_size,
        "max_prompt_length": config.max_prompt_length,
        "max_examples": config.max_examples,
        "template": config.template,
        "eos_token_id": eos_token_id,
        "world_size": world_size,
        "device_type": device.type,
        "example_seed": f"seed * {SEED_STRIDE} + example_index",
        "versions": {package: importlib.metadata.version(package) for package in VERSIONED_PACKAGES},
        "scorer": "rouge-score RougeScorer(['rougeL'], use_stemmer=True), F-measure x100, max over references",
    }
    if method is not None:
        results = {"method": method, **results}
    if output_dir is not None and rank == 0:
        write_outputs(results, generations, output_dir)
    return results


def format_seed_table(results: Mapping[str, Any]) -> str:
    """Markdown detail table: per set, ROUGE-L for each seed, mean ± std, exact match and counts."""
    seeds = results["config"]["seeds"]
    header = ["Set"] + [f"seed {seed}" for seed in seeds] + ["ROUGE-L", "EM", "scored", "dropped (long prompt)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for result in results["sets"].values():
        cells = [result["display_name"]] + [f"{value:.2f}" for value in result["rougeL_per_seed"]]
        cells += [f"{result['rougeL']:.2f} ± {result['rougeL_std']:.2f}",
                  f"{result['exact_match']:.2f} ± {result['exact_match_std']:.2f}",
                  str(result["num_examples"]), str(result["dropped_long_prompts"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(results: Mapping[str, Any], generations: Sequence[Mapping[str, Any]], output_dir: str | Path) -> None:
    """Write ``generations.jsonl``, ``metrics.json`` and ``table.md`` (Table-1 row + per-seed detail)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(output_dir / "generations.jsonl") as temporary, temporary.open("w", encoding="utf-8") as handle:
        for row in generations:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    write_text(output_dir / "metrics.json", json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    table_run = {**results, "method": results.get("method") or "model"}
    table = format_table1([table_run], exact_match=True) + "\n" + format_seed_table(results)
    write_text(output_dir / "table.md", table)
