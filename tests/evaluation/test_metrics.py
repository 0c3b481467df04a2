"""torchmetrics aggregation: batches and DDP ranks (2 CPU processes, gloo) give the single-process value."""

import json
import socket
import statistics

import pytest
import torch
import torch.multiprocessing as mp

from mgsr_lightning.evaluation.evaluate import evaluate_model
from mgsr_lightning.evaluation.metrics import ExactMatch, MeanScore, RougeL
from mgsr_lightning.evaluation.rouge import exact_match, rouge_l

from . import ddp_worker


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric RougeL was called before")
def test_rouge_l_metric_is_the_mean_over_examples_across_updates():
    metric = RougeL()
    metric.update(ddp_worker.PREDICTIONS[:2], ddp_worker.REFERENCES[:2])
    metric.update(ddp_worker.PREDICTIONS[2:], ddp_worker.REFERENCES[2:])
    expected = statistics.fmean(rouge_l(p, r) for p, r in zip(ddp_worker.PREDICTIONS, ddp_worker.REFERENCES))
    assert metric.compute().item() == pytest.approx(expected, abs=1e-12)
    assert metric.compute().dtype == torch.float64
    metric.reset()
    assert metric.num_examples.item() == 0 and metric.compute().item() == 0.0


def test_exact_match_metric():
    metric = ExactMatch()
    metric.update(ddp_worker.PREDICTIONS, ddp_worker.REFERENCES)
    expected = statistics.fmean(exact_match(p, r) for p, r in zip(ddp_worker.PREDICTIONS, ddp_worker.REFERENCES))
    assert metric.compute().item() == pytest.approx(expected) == 40.0  # "1 3 7 9" and "HELLO"


def test_mean_score_takes_precomputed_scores_and_checks_lengths():
    metric = MeanScore()
    metric.update([10.0, 20.0])
    metric.update(torch.tensor([60.0]))
    assert metric.compute().item() == pytest.approx(30.0)
    with pytest.raises(ValueError, match="2 predictions but 1"):
        RougeL().update(["a", "b"], ["a"])


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_run(tiny_tokenizer_dir, tmp_path_factory):
    """Two gloo ranks on CPU, spawned once; returns each rank's payload and the output folder."""
    output_dir = tmp_path_factory.mktemp("ddp")
    mp.spawn(ddp_worker.run_rank, args=(2, free_port(), str(tiny_tokenizer_dir), str(output_dir)), nprocs=2, join=True)
    payloads = [json.loads((output_dir / f"rank{rank}.json").read_text()) for rank in range(2)]
    return payloads, output_dir


def test_metric_across_two_ranks_equals_single_process(ddp_run):
    payloads, _ = ddp_run
    single_rouge, single_exact = RougeL(), ExactMatch()
    single_rouge.update(ddp_worker.PREDICTIONS, ddp_worker.REFERENCES)
    single_exact.update(ddp_worker.PREDICTIONS, ddp_worker.REFERENCES)
    assert [p["metrics"]["local_examples"] for p in payloads] == [3.0, 2.0]
    for payload in payloads:  # every rank gets the synced value
        assert payload["metrics"]["rougeL"] == pytest.approx(single_rouge.compute().item(), abs=1e-9)
        assert payload["metrics"]["exact_match"] == pytest.approx(single_exact.compute().item(), abs=1e-9)


def test_evaluate_on_two_ranks_equals_single_process(ddp_run, tiny_tokenizer, tmp_path):
    payloads, output_dir = ddp_run
    single = evaluate_model(ddp_worker.tiny_model(len(tiny_tokenizer)), tiny_tokenizer, ddp_worker.eval_sets(),
                            ddp_worker.eval_config(), tmp_path)
    for payload in payloads:
        distributed = payload["evaluate"]
        assert distributed["config"]["world_size"] == 2
        for name, result in single["sets"].items():
            for key in ("rougeL_per_seed", "exact_match_per_seed", "num_examples", "mean_response_tokens"):
                assert distributed["sets"][name][key] == pytest.approx(result[key], abs=1e-9), (name, key)
    assert (output_dir / "ddp_eval" / "generations.jsonl").read_text() == (tmp_path / "generations.jsonl").read_text()
