"""Table 1 markdown and the bar chart, from hand-made per-run metric dicts."""

import statistics

import pytest

from mgsr_lightning.evaluation.report import (
    format_table1,
    mean_and_standard_error,
    plot_table1,
    summarize_runs,
    wrapped_title,
    write_report,
)


def run(method, per_set, exact=None):
    """A metrics dict as evaluate_model writes it: per set, per-seed ROUGE-L (and exact match)."""
    sets = {}
    for name, values in per_set.items():
        sets[name] = {"rougeL": statistics.fmean(values), "rougeL_per_seed": values}
        if exact is not None:
            sets[name]["exact_match"] = statistics.fmean(exact[name])
            sets[name]["exact_match_per_seed"] = exact[name]
    return {"method": method, "sets": sets, "config": {"seeds": [10, 20, 30]}}


MGSR_RUNS = [
    run("MGSR", {"dolly": [26.0, 27.0, 28.0], "sinst": [30.0, 30.0, 30.0]}),
    run("MGSR", {"dolly": [28.0, 29.0, 30.0], "sinst": [32.0, 32.0, 32.0]}),
]
KD_RUN = run("KD", {"sinst": [20.0, 22.0, 24.0], "dolly": [24.0, 24.0, 24.0]})


def test_several_training_runs_give_mean_and_std_across_runs():
    table = summarize_runs(MGSR_RUNS + [KD_RUN])
    assert [c.header for c in table.columns] == ["DollyEval", "S-NI", "Avg"]  # paper order, whatever the dict order
    dolly = table.cells["MGSR"]["DollyEval"]
    assert dolly.mean == pytest.approx(28.0)  # run means 27 and 29
    assert dolly.std == pytest.approx(statistics.stdev([27.0, 29.0]))
    avg = table.cells["MGSR"]["Avg"]  # run averages (27+30)/2 and (29+32)/2
    assert avg.mean == pytest.approx(29.5) and avg.std == pytest.approx(statistics.stdev([28.5, 30.5]))
    assert table.runs_per_method == {"MGSR": 2, "KD": 1}


def test_a_single_run_gives_mean_and_std_across_sampling_seeds():
    table = summarize_runs([KD_RUN])
    sni = table.cells["KD"]["S-NI"]
    assert sni.mean == pytest.approx(22.0) and sni.std == pytest.approx(2.0)
    avg = table.cells["KD"]["Avg"]  # per seed (24+20)/2, (24+22)/2, (24+24)/2
    assert avg.mean == pytest.approx(23.0) and avg.std == pytest.approx(statistics.stdev([22.0, 23.0, 24.0]))


def test_markdown_layout_bold_best_and_missing_cells():
    partial = run("SFT", {"dolly": [20.0, 21.0, 22.0]})
    text = format_table1(MGSR_RUNS + [KD_RUN, partial])
    lines = text.splitlines()
    assert lines[0] == "| Method | DollyEval | S-NI | Avg |"
    assert lines[2] == "| MGSR | **28.00 ± 1.41** | **31.00 ± 1.41** | **29.50 ± 1.41** |"
    assert lines[3] == "| KD | 24.00 ± 0.00 | 22.00 ± 2.00 | 23.00 ± 1.00 |"
    assert lines[4] == "| SFT | 21.00 ± 1.00 | – | – |"
    assert "Training runs: MGSR 2, KD 1, SFT 1" in text and "sampling seeds 10, 20, 30" in text


def test_tiny_task_layout_one_set_with_exact_match():
    runs = [run("KD", {"tiny-test": [40.0, 50.0, 60.0]}, exact={"tiny-test": [10.0, 20.0, 30.0]}),
            run("MGSR", {"tiny-test": [70.0, 70.0, 70.0]}, exact={"tiny-test": [50.0, 50.0, 50.0]})]
    lines = format_table1(runs, exact_match=True).splitlines()
    assert lines[0] == "| Method | tiny-test | tiny-test EM |"  # no Avg for a single set
    assert lines[2] == "| KD | 50.00 ± 10.00 | 20.00 ± 10.00 |"
    assert lines[3] == "| MGSR | **70.00 ± 0.00** | **50.00 ± 0.00** |"


def test_runs_need_a_method_name():
    with pytest.raises(ValueError, match="no 'method'"):
        summarize_runs([{"sets": {"dolly": {"rougeL": 1.0}}}])


def test_chart_is_a_png(tmp_path):
    path = plot_table1(MGSR_RUNS + [KD_RUN], tmp_path / "chart.png", exact_match=False, title="GPT-2")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000


def test_write_report_writes_table_and_chart(tmp_path):
    runs = [run("KD", {"tiny-test": [40.0, 50.0]}, exact={"tiny-test": [0.0, 100.0]})]
    paths = write_report(runs, tmp_path / "report", exact_match=True, title="Tiny task")
    assert paths["table"].read_text().startswith("# Tiny task\n\n| Method | tiny-test | tiny-test EM |")
    assert paths["chart"].read_bytes()[:4] == b"\x89PNG"


def test_mean_and_standard_error():
    mean, error = mean_and_standard_error([27.0, 28.0, 29.5])
    assert mean == pytest.approx(28.1666667)
    assert error == pytest.approx(statistics.stdev([27.0, 28.0, 29.5]) / 3 ** 0.5)
    assert mean_and_standard_error([4.0]) == (4.0, None)


def test_a_long_chart_title_is_wrapped_to_the_figure_width():
    title = "ROUGE-L, GPT-2-style 4x256 teacher -> 2x128 student (embedded knowledge task)"
    lines = wrapped_title(title, 6.0).splitlines()
    assert len(lines) == 2 and all(len(line) <= 54 for line in lines) and " ".join(lines) == title
    assert wrapped_title("GPT-2", 6.0) == "GPT-2"
