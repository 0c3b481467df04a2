"""experiments/suite/suite.py: the protocol's selection rule (best mean validation gain over SFT across the
families, ties within 0.10 to the fewest departures from the paper) and the test table's paired gains."""

import json
import math
import runpy
import statistics
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "suite" / "suite.py"
FAMILIES = ["tiny", "reason", "facts"]


@pytest.fixture
def suite(tmp_path, monkeypatch):
    namespace = runpy.run_path(str(SCRIPT))
    main = namespace["main"]
    monkeypatch.setitem(main.__globals__, "RESULTS", tmp_path)
    return main.__globals__


def write(results: Path, family: str, name: str, seed: int, best: float, test: float | None = None) -> None:
    path = results / "runs" / family / f"{name}-seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {"curve": [[99, best - 1.0], [199, best]]}
    if test is not None:
        result["test"] = {"rougeL": test}
    path.write_text(json.dumps(result))


def small_grid() -> dict:
    candidate = {"config": "x", "overrides": {}, "label": "x"}
    references = {"sft": {**candidate, "label": "SFT"}, "kd": {**candidate, "label": "KD"}}
    return {"families": FAMILIES, "references": references,
            "methods": {"m": {"paper": {**candidate, "departures": 0}, "tuned": {**candidate, "departures": 2},
                              "far": {**candidate, "departures": 1}}}}


def test_the_winner_has_the_best_mean_gain_and_a_tie_goes_to_the_fewest_departures(suite, tmp_path):
    grid = small_grid()
    for family, sft in zip(FAMILIES, (50.0, 30.0, 55.0)):
        write(tmp_path, family, "sft", 0, sft)
        write(tmp_path, family, "kd", 0, sft)
        write(tmp_path, family, "paper", 0, sft + 1.0)  # +1.00 everywhere
        write(tmp_path, family, "tuned", 0, sft + {"tiny": 1.2, "reason": 1.0, "facts": 0.9}[family])  # +1.03: tied
        write(tmp_path, family, "far", 0, sft + {"tiny": 3.0, "reason": -1.0, "facts": 0.0}[family])  # +0.67
    suite["screen"](grid)
    screening = json.loads((tmp_path / "screening.json").read_text())
    assert screening["winners"] == {"m": "paper"}  # tuned is within 0.10 of it and departs more
    gains = {row["name"]: row["mean_gain"] for row in screening["rows"]}
    assert gains["tuned"] == pytest.approx((1.2 + 1.0 + 0.9) / 3)
    write(tmp_path, "reason", "tuned", 0, 30.0 + 1.5)  # now +1.20: ahead by more than the tie
    suite["screen"](grid)
    assert json.loads((tmp_path / "screening.json").read_text())["winners"] == {"m": "tuned"}
    assert (tmp_path / "screening.png").read_bytes()[:4] == b"\x89PNG"


def test_the_table_gives_each_family_and_the_mean_paired_gain_over_sft(suite, tmp_path):
    grid = small_grid()
    grid["methods"] = {name: grid["methods"]["m"] for name in ("distillm", "abkd", "mgsr")}
    winners = {"distillm": "paper", "abkd": "paper", "mgsr": "tuned"}
    (tmp_path / "screening.json").write_text(json.dumps({"winners": winners}))
    sft = {"tiny": [50.0, 51.0, 49.0], "reason": [30.0, 31.0, 32.0], "facts": [55.0, 54.0, 56.0]}
    offsets = {"tiny": [1.0, 2.0, 0.0], "reason": [-1.0, 0.0, -0.5], "facts": [0.5, 0.5, 0.5]}
    for family in FAMILIES:
        for seed in range(3):
            write(tmp_path, family, "sft", seed, 0, sft[family][seed])
            write(tmp_path, family, "tuned", seed, 0, sft[family][seed] + offsets[family][seed])
    suite["table"](grid)
    table = (tmp_path / "table.md").read_text()
    assert table.splitlines()[0] == "| Method | tiny | reason | facts | mean gain over SFT |"
    mgsr = next(line for line in table.splitlines() if line.startswith("| MGSR |"))
    gains = [statistics.fmean(offsets[f]) for f in FAMILIES]
    errors = [statistics.stdev(offsets[f]) / math.sqrt(3) for f in FAMILIES]
    combined = math.sqrt(sum(e * e for e in errors)) / 3
    assert mgsr.endswith(f"| {statistics.fmean(gains):+.2f} ± {combined:.2f} |")
    tiny = [s + o for s, o in zip(sft["tiny"], offsets["tiny"])]
    assert f"| {statistics.fmean(tiny):.2f} ± {statistics.stdev(tiny) / math.sqrt(3):.2f} |" in mgsr
    assert "| KD | – | – | – | – |" in table  # not trained: a dash, never a number


def test_a_part_swaps_test_cell_is_the_difference_with_its_sampling_seed_error(suite):
    ours, theirs = [50.0, 51.0, 49.5, 50.5, 52.0], [49.0, 50.5, 49.0, 51.0, 50.0]
    differences = [a - b for a, b in zip(ours, theirs)]
    error = statistics.stdev(differences) / math.sqrt(len(differences))
    cell = suite["test_difference"]({"rougeL": statistics.mean(ours), "per_seed": ours},
                                    {"rougeL": statistics.mean(theirs), "per_seed": theirs})
    assert cell == f"{statistics.mean(differences):+.2f} ± {error:.2f}"
    # without the per-seed scores of both runs: the difference alone
    assert suite["test_difference"]({"rougeL": 50.0, "per_seed": None}, {"rougeL": 49.0, "per_seed": theirs}) == "+1.00"
