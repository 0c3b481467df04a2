"""One rank of the 2-process CPU (gloo) run in test_metrics.py: it updates the metrics with its own
share of the pairs and runs evaluate_model on the fixture sets, then writes what it computed."""

import json
from pathlib import Path

import torch
import torch.distributed as dist
from tiny_models import build_tiny_model
from transformers import AutoTokenizer

from mgsr_lightning.evaluation.evaluate import EvalConfig, evaluate_model
from mgsr_lightning.evaluation.metrics import ExactMatch, RougeL
from mgsr_lightning.evaluation.readers import load_eval_set
from mgsr_lightning.generation.sampling import SamplingConfig

DATA_ROOT = Path(__file__).parent / "fixtures" / "minillm_data"
PREDICTIONS = ["Paris is the capital.", "1 3 7 9", "", "the cats ran home", "HELLO"]
REFERENCES = ["The capital of France is Paris.", ["9 7 3 1", "1 3 7 9"], "Anything", "The cat runs home.", "hello"]
RANK_SLICES = [slice(0, 3), slice(3, 5)]  # unequal shares: a mean of per-rank means would be wrong


def eval_sets():
    return {"dolly": load_eval_set("dolly", DATA_ROOT), "sinst": load_eval_set("sinst", DATA_ROOT)}


def eval_config():
    return EvalConfig(seeds=[10, 20], sampling=SamplingConfig(max_new_tokens=8), batch_size=2,
                      max_prompt_length=200, show_progress=False)


def tiny_model(vocab_size):
    return build_tiny_model("gpt2", vocab_size, seed=5, max_positions=256)


def run_rank(rank: int, world_size: int, port: int, tokenizer_dir: str, output_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        rouge, exact = RougeL(), ExactMatch()
        share = RANK_SLICES[rank]
        rouge.update(PREDICTIONS[share], REFERENCES[share])
        exact.update(PREDICTIONS[share], REFERENCES[share])
        metric_values = {"rougeL": float(rouge.compute()), "exact_match": float(exact.compute()),
                         "local_examples": float(rouge.num_examples)}

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        results = evaluate_model(tiny_model(len(tokenizer)), tokenizer, eval_sets(), eval_config(),
                                 Path(output_dir) / "ddp_eval")
        payload = {"metrics": metric_values, "evaluate": results}
        (Path(output_dir) / f"rank{rank}.json").write_text(json.dumps(payload))
    finally:
        dist.destroy_process_group()
