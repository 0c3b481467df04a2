"""The runner of the cross-tokenizer benchmark (experiments/cross_tokenizer/benchmark.py) without training: its
jobs, the rows' overrides, the skip-if-done rule, the suite's runs standing for the same fits, and the table from
hand-made run results."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LABELS = ["SFT", "KD, cross-tokenizer (ULD)", "KD, cross-tokenizer (exact match)", "MGSR, cross-tokenizer",
          "KD (same tokenizer)", "MGSR (same tokenizer)"]


@pytest.fixture(scope="module")
def benchmark():
    spec = importlib.util.spec_from_file_location("cross_tokenizer_benchmark",
                                                  REPO / "experiments" / "cross_tokenizer" / "benchmark.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves its annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def layout(benchmark, tmp_path):
    return dataclasses.replace(benchmark.FULL, teacher_root=tmp_path / "xtok", runs=tmp_path / "runs",
                               results=tmp_path / "results", init_runs=tmp_path / "init_runs",
                               shares_suite_runs=False)


def write_result(layout, name: str, seed: int, rouge: float | None) -> None:
    result = {"name": name, "seed": seed, "curve": [[100, 1.0]]}
    if rouge is not None:
        result["test"] = {"rougeL": rouge}
    path = layout.results / "runs" / f"{name}-seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))


def test_the_rows_and_their_jobs_seed_by_seed(benchmark):
    assert [spec["label"] for spec in benchmark.ROWS.values()] == LABELS
    jobs = benchmark.jobs_of(list(benchmark.ROWS), [0, 1, 2])
    assert len(jobs) == 18 and len(set(jobs)) == 18
    assert [seed for _, seed in jobs] == [0] * 6 + [1] * 6 + [2] * 6
    assert [name for name, _ in jobs[:6]] == list(benchmark.ROWS)


def test_only_the_cross_rows_read_the_teacher_with_its_own_tokenizer(benchmark, layout):
    teacher = f"--model.init_args.teacher.name_or_path={(layout.teacher_root / 'teacher' / 'hf').resolve()}"
    tokenizer = f"--data.teacher_tokenizer={(layout.teacher_root / 'tokenizer').resolve()}"
    for name, spec in benchmark.ROWS.items():
        overrides = benchmark.row_overrides(name, layout)
        assert (teacher in overrides and tokenizer in overrides) == ("cross" in spec["label"]), name
    assert "--model.init_args.distill.cross_tokenizer=uld" in benchmark.row_overrides("kd_uld_cross", layout)
    assert "--model.init_args.distill.cross_tokenizer=exact_match" in benchmark.row_overrides("kd_exact_cross", layout)
    mgsr = benchmark.row_overrides("mgsr_cross", layout)
    assert "--model.init_args.span.weight=0.0" in mgsr and "--model.init_args.scrg.criterion=first_unlikely" in mgsr
    assert benchmark.row_overrides("kd", layout) == benchmark.row_overrides("sft", layout) == ()
    assert {benchmark.ROWS[name]["config"] for name in ("kd", "kd_uld_cross", "kd_exact_cross")} == {"kd"}
    assert {benchmark.ROWS[name]["config"] for name in ("mgsr", "mgsr_cross")} == {"mgsr"}


def test_a_scored_run_is_skipped_and_an_unscored_or_missing_one_is_not(benchmark, layout):
    write_result(layout, "sft", 0, 40.0)
    write_result(layout, "kd", 0, None)  # trained, not scored on the test split
    jobs = benchmark.jobs_of(["sft", "kd", "mgsr"], [0, 1])
    assert benchmark.pending(layout, jobs) == [("kd", 0), ("mgsr", 0), ("sft", 1), ("kd", 1), ("mgsr", 1)]


def test_an_unknown_row_or_a_malformed_seed_list_is_refused_in_one_line_before_any_work(benchmark, capsys):
    with pytest.raises(SystemExit, match="unknown row nope; the rows: sft, kd_uld_cross"):
        benchmark.main(["train", "--smoke", "--only", "sft,nope"])
    with pytest.raises(SystemExit) as stopped:
        benchmark.main(["train", "--smoke", "--seeds", "0,one"])
    assert stopped.value.code == 2 and "invalid seed_list value: '0,one'" in capsys.readouterr().err


def cells_of(text: str) -> dict[str, list[str]]:
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [cell.strip() for cell in cells[1:]] for cells in rows}


def mean_and_error(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values) / math.sqrt(len(values)):.2f}"


def test_table_means_paired_differences_and_shares_from_hand_made_results(benchmark, layout):
    sft, kd, uld, mgsr, mgsr_cross = [40.1, 42.7, 39.4], [43.0, 44.9, 41.1], [41.5, 45.8], [39.0, 42.0, 39.0], \
        [41.0, 43.3, 40.0]
    for name, scores in (("sft", sft), ("kd", kd), ("kd_uld_cross", uld), ("mgsr", mgsr), ("mgsr_cross", mgsr_cross)):
        for seed, score in enumerate(scores):
            write_result(layout, name, seed, score)
    write_result(layout, "kd_exact_cross", 0, None)  # trained, not scored: no numbers
    table = cells_of(benchmark.render_table(layout))
    assert list(table) == ["Row", *LABELS]
    assert table["SFT"] == [mean_and_error(sft), "–", "–", "0, 1, 2", "–"]
    kd_gain = [k - s for k, s in zip(kd, sft)]
    assert table["KD (same tokenizer)"] == [mean_and_error(kd), "+" + mean_and_error(kd_gain), "–", "0, 1, 2", "–"]
    uld_gain = [u - s for u, s in zip(uld, sft)]  # paired on the two seeds both have
    share = statistics.mean(uld_gain) / statistics.mean(kd_gain)
    assert table["KD, cross-tokenizer (ULD)"] == [mean_and_error(uld), "+" + mean_and_error(uld_gain), f"{share:.2f}",
                                                  "0, 1", "–"]
    assert table["KD, cross-tokenizer (exact match)"] == ["–", "–", "–", "–", "–"]
    mgsr_gain = [m - s for m, s in zip(mgsr, sft)]
    assert statistics.mean(mgsr_gain) < 0  # no share of a negative same-tokenizer gain
    assert table["MGSR (same tokenizer)"][1] == f"{statistics.mean(mgsr_gain):+.2f} ± " \
        f"{statistics.stdev(mgsr_gain) / math.sqrt(3):.2f}"
    assert table["MGSR, cross-tokenizer"][2] == "–"


def test_one_training_seed_has_no_error_bar(benchmark, layout):
    write_result(layout, "sft", 0, 40.0)
    write_result(layout, "kd", 0, 41.5)
    table = cells_of(benchmark.render_table(layout))
    assert table["SFT"][0] == "40.00 ± nan"
    assert table["KD (same tokenizer)"][:2] == ["41.50 ± nan", "+1.50 ± nan"]


def save_weights(folder: Path, seed: int, nudge: float = 0.0) -> None:
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.randn(3, 4, generator=generator) + nudge, "b": torch.zeros(4)}, folder / "model.safetensors")


def test_the_init_students_are_compared_tensor_by_tensor(benchmark, tmp_path):
    save_weights(tmp_path / "a", 0), save_weights(tmp_path / "b", 0)
    save_weights(tmp_path / "c", 0, nudge=1e-7), save_weights(tmp_path / "d", 1)
    assert benchmark.same_weights(tmp_path / "a", tmp_path / "b")
    assert not benchmark.same_weights(tmp_path / "a", tmp_path / "c")
    assert not benchmark.same_weights(tmp_path / "a", tmp_path / "d")
    assert not benchmark.same_weights(tmp_path / "a", tmp_path / "missing")


def test_the_suites_scored_runs_stand_for_the_same_fits_and_the_benchmarks_own_result_comes_first(
        benchmark, layout, monkeypatch, tmp_path):
    suite = {("sft", 0): 40.0, ("sft", 1): 41.0, ("kd", 0): 42.5, ("kd", 1): None, ("mgsr_on_policy", 0): 43.0}
    asked = []

    def read_suite_result(family, name, seed):
        asked.append((family, name, seed))
        if suite.get((name, seed), "absent") == "absent":
            return None
        result = {"name": name, "seed": seed, "curve": [[100, 1.0]]}
        return result if suite[(name, seed)] is None else {**result, "test": {"rougeL": suite[(name, seed)]}}

    monkeypatch.setattr(benchmark, "read_suite_result", read_suite_result)
    monkeypatch.setattr(benchmark, "SUITE_RUNS", tmp_path / "suite_runs")
    shared = dataclasses.replace(layout, init_runs=tmp_path / "own_runs", shares_suite_runs=True)
    for runs in (benchmark.SUITE_RUNS, shared.init_runs):  # both SFT-initialised students of seeds 0 and 1
        for seed in (0, 1):
            save_weights(runs / "facts" / "init" / f"seed{seed}" / "hf", seed)
    assert benchmark.read_result(layout, "sft", 0) is None  # this layout does not share the suite's runs
    assert benchmark.read_result(shared, "sft", 0)["from_suite"] == "sft"
    assert benchmark.read_result(shared, "kd", 1) is None  # trained by the suite, not scored: not a result
    assert benchmark.read_result(shared, "kd_uld_cross", 0) is None  # a cross row has no suite run
    assert {name for _, name, _ in asked} == {"sft", "kd"} and {family for family, _, _ in asked} == {"facts"}
    write_result(shared, "sft", 1, 39.0)  # the benchmark's own run of the fit comes first
    jobs = benchmark.jobs_of(["sft", "kd", "mgsr"], [0, 1])
    assert benchmark.pending(shared, jobs) == [("kd", 1), ("mgsr", 1)]
    table = cells_of(benchmark.render_table(shared))
    assert table["SFT"] == [mean_and_error([40.0, 39.0]), "–", "–", "0, 1", "0"]
    assert table["KD (same tokenizer)"][1:] == ["+2.50 ± nan", "–", "0", "0"]
    assert table["MGSR (same tokenizer)"][1:] == ["+3.00 ± nan", "–", "0", "0"]
    init = shared.init_runs / "facts" / "init" / "seed0" / "hf"
    save_weights(init, 0, nudge=1e-3)  # another init student: the suite's runs do not stand for this seed
    assert benchmark.read_result(shared, "mgsr", 0) is None and benchmark.read_result(shared, "sft", 1)["seed"] == 1
    save_weights(init, 0)
    benchmark.keep_suite_results(shared)  # kept in the benchmark's results, marked: the table needs no run folder
    kept = json.loads((shared.results / "runs" / "kd-seed0.json").read_text())
    assert kept["from_suite"] == "kd" and kept["test"]["rougeL"] == 42.5
    assert not (shared.results / "runs" / "kd-seed1.json").exists()
    save_weights(init, 0, nudge=1e-3)  # a kept result no longer needs the run folders
    assert benchmark.read_result(shared, "kd", 0)["from_suite"] == "kd"


def test_init_as_is_takes_an_exported_init_student_without_training_or_checking_it(benchmark, layout, monkeypatch):
    trained = []
    monkeypatch.setattr(benchmark, "init_overrides", lambda *args, **kwargs: trained.append(args) or ("--trained",))
    exported = layout.init_runs / "facts" / "init" / "seed0" / "hf"
    exported.mkdir(parents=True)
    (exported / "config.json").write_text("{}")
    (override,) = benchmark.init_student(layout, 0, {}, as_is=True)
    assert override.startswith("--model.init_args.student=") and str(exported.resolve()) in override
    assert not trained
    assert benchmark.init_student(layout, 0, {}) == ("--trained",)  # otherwise the suite's recipe decides
    assert benchmark.init_student(layout, 1, {}, as_is=True) == ("--trained",)  # nothing exported: trained
    assert len(trained) == 2


def test_gold_rows_pair_with_sft_and_say_where_gold_did_not_run(benchmark, layout):
    for seed, score in enumerate([40.0, 41.0, 42.0]):
        write_result(layout, "sft", seed, score)
    records = {"lmbda0-ce": {0: 41.0, 1: 41.5, 2: 43.5}, "lmbda0.5": {0: None, 1: None}}
    for setting, seeds in records.items():
        for seed, score in seeds.items():
            record = {"status": "ok", "rougeL": score, "steps_per_s": 1.0 + seed} if score is not None else \
                {"status": "failed", "reason": "IndexError: index out of range in self"}
            (layout.results / f"gold-{setting}-seed{seed}.json").write_text(json.dumps(record))
    table = cells_of(benchmark.render_gold_table(layout))
    ce = table["TRL GOLD, ground truth only, + CE (uld_crossentropy_weight 1)"]
    assert ce[:2] == [mean_and_error([41.0, 41.5, 43.5]), "+" + mean_and_error([1.0, 0.5, 1.5])]
    assert ce[2:] == ["2.00", "0, 1, 2", "–"]
    assert table["TRL GOLD, its defaults (on-policy share 0.5)"] == [
        "–", "–", "–", "–", "seeds 0, 1: IndexError: index out of range in self"]
    assert "TRL GOLD, ground truth only (lmbda 0)" not in table  # no file: no row
