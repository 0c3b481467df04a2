"""Scripts under experiments/analyses/ that summarise runs: acceptance.py (per-method mean ± SE over training seeds
and the differences between methods, unpaired and paired by seed, from the metrics files ``reproduce``
writes) and exposure_bias.py's merge of several runs' curves."""

import json
import math
import runpy
import statistics
from pathlib import Path

import pytest

ANALYSES = Path(__file__).resolve().parents[1] / "experiments" / "analyses"
SCRIPT = ANALYSES / "acceptance.py"


def write_runs(root: Path, scores: dict[str, list[float]]) -> None:
    for method, values in scores.items():
        for seed, value in enumerate(values):
            folder = root / method / f"seed{seed}" / "eval"
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text(json.dumps({"avg": {"rougeL": value, "exact_match": 0.0}}))


def run(argv: list[str], capsys) -> str:
    main = runpy.run_path(str(SCRIPT))["main"]
    main(argv)
    return capsys.readouterr().out


def test_unpaired_and_paired_differences(tmp_path, capsys):
    # b is a plus a seed-specific offset; the paired difference sees the constant gap the unpaired one blurs
    a, b = [27.0, 28.0, 29.5], [27.5, 28.4, 30.1]
    write_runs(tmp_path, {"a": a, "b": b})
    out = run([str(tmp_path), "--methods", "a,b", "--compare", "b-a"], capsys)
    se_a, se_b = (statistics.stdev(v) / math.sqrt(3) for v in (a, b))
    difference = statistics.fmean(b) - statistics.fmean(a)
    gaps = [y - x for x, y in zip(a, b)]
    paired_se = statistics.stdev(gaps) / math.sqrt(3)
    assert f"| a | {statistics.fmean(a):.2f} ± {se_a:.2f} |" in out
    assert f"b − a: {difference:+.2f} rougeL = {difference / math.hypot(se_a, se_b):+.2f} SE" in out
    assert f"paired over 3 seeds {statistics.fmean(gaps):+.2f} ± {paired_se:.2f}" in out


def test_default_comparisons_and_missing_method(tmp_path, capsys):
    write_runs(tmp_path, {"sft": [27.0, 27.2], "kd": [27.5, 27.9]})
    out = run([str(tmp_path), "--methods", "sft,kd,distillm"], capsys)
    assert "| distillm | (no evaluated run) | |" in out
    assert "kd − sft: +0.60 rougeL" in out
    assert "distillm −" not in out


def test_training_seconds_column_is_the_mean_of_the_runs_and_a_dash_without_them(tmp_path, capsys):
    write_runs(tmp_path, {"a": [27.0, 28.0], "b": [27.5, 28.4]})
    (tmp_path / "a" / "seed0" / "train_seconds.txt").write_text("100.0\n")
    (tmp_path / "a" / "seed1" / "train_seconds.txt").write_text("300.0\n")
    out = run([str(tmp_path), "--methods", "a,b", "--compare", "b-a"], capsys)
    assert "| a | 27.50 ± 0.50 | seed0 27.00, seed1 28.00 | 200 |" in out
    assert "| b | 27.95 ± 0.45 | seed0 27.50, seed1 28.40 | — |" in out


def test_malformed_compare_is_refused(tmp_path, capsys):
    write_runs(tmp_path, {"sft": [27.0, 27.2]})
    with pytest.raises(SystemExit):
        run([str(tmp_path), "--compare", "sft"], capsys)
    assert "give a-b pairs" in capsys.readouterr().err


def test_exposure_bias_merge_is_the_pointwise_mean_and_standard_error(tmp_path):
    merge_runs = runpy.run_path(str(ANALYSES / "exposure_bias.py"))["merge_runs"]
    runs = {
        "seed0": {"sft": [1.0, 2.0, 4.0], "kd": [0.0, 1.0, 1.0]},
        "seed1": {"sft": [3.0, 2.0, 8.0], "kd": [2.0, 1.0, 3.0]},
        "seed2": {"sft": [2.0, 5.0, 6.0]},  # no kd here: kd is left out of the merge
    }
    for name, students in runs.items():
        (tmp_path / name).mkdir()
        curves = {s: {"regret": c, "forced_error": [x / 2 for x in c], "ex_acc_err": [x * 10 for x in c]}
                  for s, c in students.items()}
        (tmp_path / name / "exposure_bias.json").write_text(json.dumps({"prompts": 4, "samples": 2, "curves": curves}))

    merged = merge_runs([tmp_path / name for name in runs])

    assert list(merged["curves"]) == ["sft"]
    sft = merged["curves"]["sft"]
    assert sft["regret"] == pytest.approx([2.0, 3.0, 6.0])
    assert sft["regret_se"] == pytest.approx([1 / math.sqrt(3), math.sqrt(3) / math.sqrt(3), 2 / math.sqrt(3)])
    assert sft["ex_acc_err"] == pytest.approx([20.0, 30.0, 60.0])
    assert (merged["prompts"], merged["samples"]) == (4, 2)


@pytest.mark.parametrize("family, reference, prediction, right", [
    ("chain_arithmetic", "23 minus 12 is 11. 11 minus 17 is -6. Final value: -6.",
     "23 - 12 = 11. 11 - 17 = -6. The result is -6.", True),
    ("chain_arithmetic", "23 minus 12 is 11. Final value: 11.", "23 - 12 = 11. So the answer is 12.", False),
    ("sort_explain", "Take 2. Take 53. So the order is 2, 53.",
     "The smallest left is 2. The smallest left is 53. Sorted: 2, 53.", True),
    ("list_transform", "Doubled: 4, 6. Final list: 4, 6.", "After doubling we get 4, 6. The result is 6, 4.", False),
    ("word_transform", "In capitals: ACKE. The final word is ACKE.", "Now uppercased, it is ACKE. Result: ACKE.", True),
    ("follow", "The friend of Tebak is Bulen. The last one is Bulen.",
     "Tebak's friend is Bulen. We end at Bulen.", True),
    ("follow", "The friend of Tebak is Bulen. The last one is Bulen.",
     "Tebak's friend is Tirum. We end at Tirum.", False),
    ("compare", "The Kodul has two legs. The Brodok has six legs. So the Brodok has more legs.",
     "The Brodok has six legs. The Kodul has four legs. So the Brodok has more legs.", True),
])
def test_final_answers_compare_the_last_step_whatever_the_phrasing(family, reference, prediction, right):
    final_answer = runpy.run_path(str(ANALYSES / "final_answers.py"))["final_answer"]
    assert (final_answer(prediction, family) == final_answer(reference, family)) is right
    assert final_answer(reference, "describe_record") is None


def test_a_facts_description_is_right_when_every_fact_is_true_and_as_many_as_asked():
    from mgsr_lightning.data.tasks.knowledge import VALUES, world

    facts_true = runpy.run_path(str(ANALYSES / "final_answers.py"))["facts_true"]
    creature = next(iter(world().values()))
    home, food = creature.attributes["home"], creature.attributes["food"]
    legs, wrong_food = creature.attributes["legs"], next(f for f in VALUES["food"] if f != food)
    row = {"family": "describe", "input": f"Creature: {creature.name}. Facts: three."}
    assert facts_true(f"The {creature.name} lives in the {home}. It eats {food}. It has {legs} legs.", row)
    assert not facts_true(f"The {creature.name} lives in the {home}. It eats {wrong_food}. It has {legs} legs.", row)
    assert not facts_true(f"The {creature.name} lives in the {home}. It eats {food}.", row)  # two of three
    assert not facts_true(f"The {creature.name} eats {food}. It eats {food}. It has {legs} legs.", row)  # one twice


def test_final_answers_of_a_generations_file(tmp_path, capsys):
    rows = [{"family": "chain_arithmetic", "output": "1 + 2 = 3. The result is 3."},
            {"family": "describe_record", "output": "Rosa is 53 years old."},
            {"family": "word_transform", "output": "Reversed: god. The final word is god."}]
    data = tmp_path / "validation.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    generations = tmp_path / "generations.jsonl"
    predictions = ["1 plus 2 is 3. Final value: 3.", "Rosa is aged 53.", "Reversed: dog. Result: dog."]
    generations.write_text("".join(json.dumps({"index": i, "prediction": p}) + "\n" for i, p in enumerate(predictions)))
    main = runpy.run_path(str(ANALYSES / "final_answers.py"))["main"]

    main(["--generations", str(generations), "--data", str(data)])

    # describe_record has no final answer; of the other two, one is right
    assert f"| {generations} | 50.00 (one run) | chain_arithmetic 100, word_transform 0 |" in capsys.readouterr().out


def write_curve(run_dir: Path, values: list[float]) -> None:
    logs = run_dir / "logs" / "version_0"
    logs.mkdir(parents=True)
    rows = ["step,train/loss,val/rougeL"] + [f"{99 + 100 * i},1.0,{v}" for i, v in enumerate(values)]
    rows.insert(1, "5,1.0,")  # a training row without a validation value
    (logs / "metrics.csv").write_text("\n".join(rows) + "\n")


def test_sweep_table_reads_best_validation_and_keeps_the_default_on_a_tie(tmp_path, monkeypatch):
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        "methods:\n"
        "  m: {m: {config: m}, m_a: {config: m}, m_b: {config: m}}\n"
        "  n: {n: {config: n}, n_a: {config: n}}\n"
    )
    runs = tmp_path / "runs" / "reproduce-facts"
    write_curve(runs / "m" / "seed0", [40.0, 41.0, 40.5])
    write_curve(runs / "m_a" / "seed0", [39.0, 41.05])  # within the tie margin of the default
    write_curve(runs / "m_b" / "seed0", [38.0, 40.0])
    write_curve(runs / "n" / "seed0", [30.0])
    write_curve(runs / "n_a" / "seed0", [30.0, 31.2])
    monkeypatch.chdir(tmp_path)
    sweep = runpy.run_path(str(ANALYSES / "sweep.py"))
    text = sweep["table"](sweep["load_grid"](grid), 0)
    assert "| m | m_a | 41.05 | 199 | 39.0, 41.0 |" in text
    assert "- m: **m**" in text and "- n: **n_a**" in text


def test_add_table_rows_inserts_relabelled_seeds_replaces_a_label_and_refuses_another_protocol(tmp_path, capsys):
    main = runpy.run_path(str(ANALYSES / "add_table_rows.py"))["main"]

    def run_of(method: str, score: float, seeds=(10, 20)) -> dict:
        return {"method": method, "config": {"seeds": list(seeds)},
                "sets": {"test": {"rougeL": score, "exact_match": 0.0, "records_sha256": "rows"}},
                "avg": {"rougeL": score, "exact_match": 0.0}}

    results = tmp_path / "results"
    results.mkdir()
    (results / "runs.json").write_text(json.dumps({"runs": [run_of("Teacher", 60.0), run_of("KD", 50.0),
                                                            run_of("MGSR", 52.0)], "train_seconds": {}}))
    (results / "table.md").write_text("# My table\n")
    new = tmp_path / "minillm"
    for seed, score in enumerate([51.0, 53.0]):
        (new / f"seed{seed}" / "eval").mkdir(parents=True)
        (new / f"seed{seed}" / "eval" / "metrics.json").write_text(json.dumps(run_of("minillm", score)))
        (new / f"seed{seed}" / "train_seconds.txt").write_text(f"{100 + seed}\n")
    for _ in range(2):  # run again: the label's rows are replaced, not added twice
        main([str(results), "--rows", f"MiniLLM={new}", "--after", "KD"])
    written = json.loads((results / "runs.json").read_text())
    assert [run["method"] for run in written["runs"]] == ["Teacher", "KD", "MiniLLM", "MiniLLM", "MGSR"]
    assert written["train_seconds"] == {"minillm/seed0": "100", "minillm/seed1": "101"}
    table = (results / "table.md").read_text()
    assert table.startswith("# My table") and "| MiniLLM | 52.00 ± 1.41" in table
    assert (results / "chart.png").is_file()
    (new / "seed1" / "eval" / "metrics.json").write_text(json.dumps(run_of("minillm", 53.0, seeds=(10,))))
    with pytest.raises(Exception, match="evaluated differently"):
        main([str(results), "--rows", f"MiniLLM={new}"])


def test_training_diagnostics_regenerated_share_is_the_rows_regenerated_tokens_over_the_rollouts(tmp_path):
    diagnostics = runpy.run_path(str(ANALYSES / "training_diagnostics.py"))
    run = tmp_path / "mgsr" / "seed0" / "logs" / "version_0"
    run.mkdir(parents=True)
    header = "step,epoch,scrg/corrected_fraction,scrg/mean_regenerated_tokens,rollout/response_tokens,val/rougeL"
    rows = ["0,0,0.5,20,40,", "1,0,1.0,30,60,", "2,0,,,,50.0"]  # shares 0.25 and 0.5; a validation row
    (run / "metrics.csv").write_text("\n".join([header, *rows]) + "\n")
    methods = diagnostics["runs_by_method"]([tmp_path])
    assert methods["mgsr"][0]["scrg/regenerated_share"] == [(0, 0.25), (1, 0.5)]
    table = diagnostics["table"](methods)
    heading = table.splitlines()[0].split(" | ")
    cells = table.splitlines()[2].split(" | ")
    assert cells[heading.index("SCRG re-generated share")] == "0.375"
