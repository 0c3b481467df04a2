"""evaluate_model with a tiny random GPT-2: determinism per seed, batch-size independence, seed averaging,
long-prompt accounting and the files it writes."""

import json
import statistics
from pathlib import Path

import pytest
from rouge_score import rouge_scorer
from tiny_models import build_tiny_model

from mgsr_lightning.batch import Rollout
from mgsr_lightning.evaluation.evaluate import EvalConfig, evaluate_model
from mgsr_lightning.evaluation.readers import load_eval_set
from mgsr_lightning.generation.decode import decode_responses
from mgsr_lightning.generation.sampling import SamplingConfig

DATA_ROOT = Path(__file__).parent / "fixtures" / "minillm_data"
SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


@pytest.fixture(scope="module")
def eval_sets():
    return {"dolly": load_eval_set("dolly", DATA_ROOT), "sinst": load_eval_set("sinst", DATA_ROOT)}


@pytest.fixture
def model(tiny_tokenizer):
    return build_tiny_model("gpt2", len(tiny_tokenizer), seed=3, max_positions=256)


def make_config(**overrides):
    values = dict(seeds=[10, 20, 30], sampling=SamplingConfig(max_new_tokens=12), batch_size=2,
                  max_prompt_length=200, show_progress=False)
    return EvalConfig(**{**values, **overrides})


def read_generations(output_dir):
    return [json.loads(line) for line in (output_dir / "generations.jsonl").read_text().splitlines()]


def predictions_by_key(rows):
    return {(row["set"], row["seed"], row["index"]): row["prediction"] for row in rows}


def test_same_seed_repeats_and_different_seeds_differ(model, tiny_tokenizer, eval_sets, tmp_path):
    evaluate_model(model, tiny_tokenizer, eval_sets, make_config(), tmp_path / "first")
    evaluate_model(model, tiny_tokenizer, eval_sets, make_config(), tmp_path / "second")
    first, second = read_generations(tmp_path / "first"), read_generations(tmp_path / "second")
    assert first == second
    by_key = predictions_by_key(first)
    differing = [k for k in by_key if k[1] == 10 and by_key[k] != by_key[(k[0], 20, k[2])]]
    assert len(differing) == 6  # every example gets a different sample under another seed


def test_scores_do_not_depend_on_batch_size(model, tiny_tokenizer, eval_sets, tmp_path):
    one = evaluate_model(model, tiny_tokenizer, eval_sets, make_config(batch_size=1), tmp_path / "one")
    four = evaluate_model(model, tiny_tokenizer, eval_sets, make_config(batch_size=4), tmp_path / "four")
    assert read_generations(tmp_path / "one") == read_generations(tmp_path / "four")
    assert one["sets"] == four["sets"]


def test_seed_average_and_std_from_the_generations(model, tiny_tokenizer, eval_sets, tmp_path):
    # References = the seed-10 samples, so seed 10 matches exactly and the other seeds partly.
    evaluate_model(model, tiny_tokenizer, eval_sets, make_config(), tmp_path / "samples")
    samples = read_generations(tmp_path / "samples")
    seed10 = {(row["set"], row["index"]): row["prediction"] for row in samples if row["seed"] == 10}
    self_sets = {name: [{**record, "output": seed10[(name, i)]} for i, record in enumerate(records)]
                 for name, records in eval_sets.items()}
    results = evaluate_model(model, tiny_tokenizer, self_sets, make_config(), tmp_path / "scored")

    rows = read_generations(tmp_path / "scored")
    assert len(rows) == 2 * 3 * 3  # sets × seeds × examples
    for name, result in results["sets"].items():
        expected_per_seed = [
            100 * statistics.fmean(SCORER.score(seed10[(name, r["index"])], r["prediction"])["rougeL"].fmeasure
                                   for r in rows if r["set"] == name and r["seed"] == seed)
            for seed in (10, 20, 30)
        ]
        assert result["rougeL_per_seed"] == pytest.approx(expected_per_seed, abs=1e-9)
        assert result["rougeL"] == pytest.approx(statistics.fmean(expected_per_seed))
        assert result["rougeL_std"] == pytest.approx(statistics.stdev(expected_per_seed))
        assert result["rougeL_per_seed"][0] > max(result["rougeL_per_seed"][1:])
        assert result["rougeL_std"] > 0
        assert result["exact_match_per_seed"][0] == 100.0
    per_seed_avg = [statistics.fmean(v) for v in zip(*(r["rougeL_per_seed"] for r in results["sets"].values()))]
    assert results["avg"]["rougeL_per_seed"] == pytest.approx(per_seed_avg)
    assert results["avg"]["rougeL"] == pytest.approx(statistics.fmean(r["rougeL"] for r in results["sets"].values()))


def test_long_prompts_are_dropped_counted_and_do_not_shift_seeds(model, tiny_tokenizer, eval_sets, tmp_path):
    full = evaluate_model(model, tiny_tokenizer, {"dolly": eval_sets["dolly"]}, make_config(), tmp_path / "full")
    short = evaluate_model(model, tiny_tokenizer, {"dolly": eval_sets["dolly"]}, make_config(max_prompt_length=100),
                           tmp_path / "short")
    assert full["sets"]["dolly"]["dropped_long_prompts"] == 0
    assert short["sets"]["dolly"]["dropped_long_prompts"] == 2  # prompts of 125 and 113 tokens
    assert short["sets"]["dolly"]["num_examples"] == 1 and short["sets"]["dolly"]["num_rows"] == 3
    kept = read_generations(tmp_path / "short")
    assert {row["index"] for row in kept} == {0}
    full_predictions = predictions_by_key(read_generations(tmp_path / "full"))
    assert all(full_predictions[("dolly", row["seed"], 0)] == row["prediction"] for row in kept)


def test_files_written(model, tiny_tokenizer, eval_sets, tmp_path):
    results = evaluate_model(model, tiny_tokenizer, eval_sets, make_config(), tmp_path, method="tiny-gpt2")
    assert json.loads((tmp_path / "metrics.json").read_text()) == results
    assert results["method"] == "tiny-gpt2" and results["config"]["seeds"] == [10, 20, 30]
    assert set(results["config"]["versions"]) == {"torch", "transformers", "rouge-score", "nltk"}
    assert results["sets"]["sinst"]["display_name"] == "S-NI"
    row = read_generations(tmp_path)[0]
    assert set(row) == {"set", "seed", "index", "prediction", "references", "response_tokens", "rougeL", "exact_match"}
    assert 1 <= row["response_tokens"] <= 12
    table = (tmp_path / "table.md").read_text()
    assert "| Method | DollyEval | S-NI | Avg |" in table and "| tiny-gpt2 |" in table
    assert f"{results['sets']['dolly']['rougeL']:.2f} ± {results['sets']['dolly']['rougeL_std']:.2f}" in table


def test_decode_responses_strips_special_tokens_and_restores_newlines(tiny_tokenizer):
    eos, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id
    first = tiny_tokenizer(" Hello<n>world ", add_special_tokens=False)["input_ids"] + [eos]
    second = tiny_tokenizer("fox", add_special_tokens=False)["input_ids"]  # hit max_new_tokens: no EOS
    rollout = Rollout.from_token_lists([[5], [6, 7]], [first, second], pad_token_id=pad)
    assert rollout.response_ids[1, -1] == pad
    assert decode_responses(tiny_tokenizer, rollout) == ["Hello\nworld", "fox"]


def test_config_rejects_repeated_seeds():
    with pytest.raises(ValueError, match="distinct"):
        EvalConfig(seeds=[10, 10])
