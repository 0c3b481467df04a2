"""The suite: DistiLLM, ABKD and MGSR chosen across the three embedded families (protocol: PROTOCOL.md).

Every run lands in ``runs/suite/<family>/<name>/seed<k>`` and starts from that family's seed-``k``
SFT-initialised student; its compact result (validation curve, training seconds, test scores) is copied to
``experiments/results/suite/runs/<family>/<name>-seed<k>.json``, which every table here reads, so that the
study carries across machines.

    python experiments/suite/suite.py train --phase screen --jobs 2
    python experiments/suite/suite.py screen
    python experiments/suite/suite.py train --phase test --jobs 2
    python experiments/suite/suite.py table
    python experiments/suite/suite.py train --phase parts --jobs 2 && python experiments/suite/suite.py parts
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RESULTS = REPO / "experiments" / "results" / "suite"
RUNS = Path("runs") / "suite"
TIE = 0.10  # candidates within this mean gain of the best are tied (PROTOCOL.md)
TEST_SEEDS = (0, 1, 2)

sys.path.insert(0, str(REPO / "experiments" / "analyses"))
from sweep import overrides_of, validation_curve  # noqa: E402


def load_grid(path: Path = HERE / "grid.yaml") -> dict:
    return yaml.safe_load(path.read_text())


def candidates(grid: dict) -> dict[str, dict]:
    """Every named run of the grid: the references, then each method's candidates."""
    named = dict(grid["references"])
    for members in grid["methods"].values():
        named.update(members)
    return named


def result_path(family: str, name: str, seed: int) -> Path:
    return RESULTS / "runs" / family / f"{name}-seed{seed}.json"


def read_result(family: str, name: str, seed: int) -> dict | None:
    path = result_path(family, name, seed)
    return json.loads(path.read_text()) if path.is_file() else None


# --- training -------------------------------------------------------------------------------------------


def init_overrides(family: str, seed: int, env: dict[str, str], runs: Path = RUNS,
                   overrides: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The overrides that start a student from the family's seed-``seed`` SFT-initialised student, trained
    once (under a lock, as parallel jobs ask for it) into ``runs/<family>/init/seed<seed>`` with ``overrides``:
    ``init.yaml`` where the family has one, else ``sft.yaml``, as ``prepare`` does on a user's data."""
    from mgsr_lightning.pipeline import steps
    from mgsr_lightning.pipeline.own_data import init_config_name

    lock_path = runs / family / f"init-seed{seed}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        init_dir = steps.fit(family, init_config_name(family), runs / family / "init" / f"seed{seed}", seed, env,
                             overrides)
    student = json.dumps({"name_or_path": str(init_dir.resolve()), "config": None})
    return (f"--model.init_args.student={student}",)


def train_one(grid: dict, family: str, name: str, seed: int, test: bool, spec: dict | None = None) -> None:
    """Train (or find trained) one run in this process, score it on the test split when asked, and write its
    compact result."""
    import torch

    from mgsr_lightning.pipeline import steps

    torch.set_num_threads(1)
    spec = spec or candidates(grid)[name]
    lock_path = RUNS / family / "setup.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:  # the family's data, tokenizer and teacher, prepared once
        fcntl.flock(lock, fcntl.LOCK_EX)
        env, eval_sets, eval_config, _ = steps.pair_setup(family, None, None, None)
    init = init_overrides(family, seed, env)
    run_dir = RUNS / family / name / f"seed{seed}"
    student = steps.fit(family, spec["config"], run_dir, seed, env, init + overrides_of(spec))
    result = {"family": family, "name": name, "seed": seed, "config": spec["config"],
              "overrides": spec.get("overrides", {}), "curve": validation_curve(run_dir)}
    seconds = run_dir / "train_seconds.txt"
    result["train_seconds"] = float(seconds.read_text()) if seconds.is_file() else None
    if test:
        metrics = steps.evaluate(student, run_dir / "eval", name, eval_sets, eval_config)
        result["test"] = {"rougeL": metrics["avg"]["rougeL"], "exact_match": metrics["avg"].get("exact_match"),
                          "per_seed": metrics["avg"].get("rougeL_per_seed")}  # ROUGE-L per sampling seed
    previous = read_result(family, name, seed) or {}
    if "test" in previous and "test" not in result:
        result["test"] = previous["test"]
    path = result_path(family, name, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


def jobs_of(grid: dict, phase: str, families: list[str]) -> list[tuple[str, str, int, bool]]:
    """(family, name, seed, test) of every run of a phase, in the protocol's order (family by family)."""
    if phase == "screen":
        names = list(candidates(grid))
        return [(family, name, 0, False) for family in families for name in names]
    winners = read_screening()["winners"]
    if phase == "test":
        names = ["sft", "kd", *winners.values(), "mgsr_paper"]
        return [(family, name, seed, True) for seed in TEST_SEEDS for family in families
                for name in dict.fromkeys(names)]
    if phase == "parts":
        return [(family, name, 0, True) for family in families for name in part_specs(grid, winners["mgsr"])]
    raise ValueError(phase)


def train(grid: dict, args: argparse.Namespace) -> None:
    families = args.families.split(",") if args.families else grid["families"]
    jobs = jobs_of(grid, args.phase, families)
    if args.only:
        jobs = [job for job in jobs if job[1] in args.only.split(",")]
    pending = [(family, name, seed, test) for family, name, seed, test in jobs
               if (done := read_result(family, name, seed)) is None or (test and "test" not in done)]
    run_in_processes([(f"{family}/{name} seed {seed}", f"{family}-{name}-seed{seed}",
                       ["one", "--family", family, "--name", name, "--seed", str(seed), "--phase", args.phase]
                       + (["--test"] if test else [])) for family, name, seed, test in pending],
                     __file__, RUNS / "logs", args.jobs)


def run_in_processes(runs: list[tuple[str, str, list[str]]], script: str, logs: Path, jobs: int) -> None:
    """Each run ``(label, log name, arguments)`` as ``python <script> <arguments>`` in its own process with one torch
    thread, ``jobs`` at a time, its output appended to ``logs/<log name>.log``; a line per run as it ends, and exit
    with a message when any failed."""
    logs.mkdir(parents=True, exist_ok=True)

    def launch(run: tuple[str, str, list[str]]) -> int:
        label, log_name, arguments = run
        with (logs / f"{log_name}.log").open("a") as out:
            code = subprocess.run([sys.executable, script, *arguments], stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}).returncode
        print(f"{label}: {'done' if code == 0 else f'failed ({code})'}", flush=True)
        return code

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        failed = sum(code != 0 for code in pool.map(launch, runs))
    if failed:
        sys.exit(f"{failed} of {len(runs)} runs failed; logs in {logs}")


# --- screening ------------------------------------------------------------------------------------------


def best(curve: list) -> float:
    return max(value for _, value in curve) if curve else math.nan


def read_screening() -> dict:
    path = RESULTS / "screening.json"
    if not path.is_file():
        sys.exit(f"{path} not found: run `suite.py screen` after the screening runs")
    return json.loads(path.read_text())


def screen(grid: dict) -> None:
    """Validation gains over SFT of every candidate in every family (seed 0), the winners by the protocol's rule,
    written to screening.md / screening.json / screening.png."""
    families = grid["families"]
    sft = {family: best((read_result(family, "sft", 0) or {}).get("curve", [])) for family in families}
    rows, winners = [], {}
    for method, members in grid["methods"].items():
        gains = {}
        for name, spec in members.items():
            values = {family: best((read_result(family, name, 0) or {}).get("curve", [])) for family in families}
            gain = {family: values[family] - sft[family] for family in families}
            gains[name] = sum(gain.values()) / len(families)
            rows.append({"method": method, "name": name, "label": spec["label"], "departures": spec["departures"],
                         "validation": values, "gain": gain, "mean_gain": gains[name]})
        if all(not math.isnan(value) for value in gains.values()):
            top = max(gains.values())
            tied = [name for name in members if gains[name] >= top - TIE]
            winners[method] = min(tied, key=lambda name: (members[name]["departures"], -gains[name]))
    references = {name: {family: best((read_result(family, name, 0) or {}).get("curve", [])) for family in families}
                  for name in grid["references"]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "screening.json").write_text(json.dumps(
        {"sft": sft, "references": references, "rows": rows, "winners": winners}, indent=1) + "\n")
    lines = ["Validation ROUGE-L, training seed 0 (the best of each run's validations), and the gain over SFT's",
             "", "| method | candidate | departures | " + " | ".join(families) + " | mean gain over SFT |",
             "|---|---|:---:|" + ":---:|" * len(families) + ":---:|"]
    for name, values in references.items():
        lines.append(f"| reference | {grid['references'][name]['label']} | | "
                     + " | ".join(f"{values[f]:.2f}" for f in families) + " | |")
    for row in rows:
        win = row["name"] == winners.get(row["method"])
        cells = [f"{row['validation'][f]:.2f} ({row['gain'][f]:+.2f})" for f in families]
        mean = f"{row['mean_gain']:+.2f}"
        lines.append(f"| {row['method']} | {'**' + row['label'] + '**' if win else row['label']} | "
                     f"{row['departures']} | " + " | ".join(cells) + f" | {'**' + mean + '**' if win else mean} |")
    lines += ["", "Winners (best mean gain; within 0.10 of it, the fewest departures from the method's paper):", ""]
    lines += [f"- {method}: **{name}**" for method, name in winners.items()]
    (RESULTS / "screening.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot_family_gains({row["label"]: {family: (row["gain"][family], math.nan) for family in families} for row in rows},
                      families, "validation ROUGE-L gain over SFT (training seed 0)", RESULTS / "screening.png")


def plot_family_gains(gains: dict[str, dict[str, tuple[float, float]]], families: list[str], xlabel: str,
                      out: Path) -> None:
    """A bar per row and family: ``gains[label][family]`` is (gain over SFT, its error; nan draws no error bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(gains)
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(labels) + 1.5))
    height = 0.8 / len(families)
    for k, family in enumerate(families):
        values = [gains[label].get(family, (math.nan, math.nan)) for label in labels]
        errors = [0.0 if math.isnan(v[1]) else v[1] for v in values]
        ax.barh([i + k * height for i in range(len(labels))], [v[0] for v in values], height,
                xerr=errors if any(errors) else None, label=family, capsize=2)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(labels))], labels, fontsize=8)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


# --- test table -----------------------------------------------------------------------------------------


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error over training seeds; the error is nan for one seed."""
    from mgsr_lightning.evaluation.report import mean_and_standard_error

    mean, error = mean_and_standard_error(values)
    return mean, math.nan if error is None else error


def test_scores(family: str, name: str) -> dict[int, float]:
    scores = {}
    for seed in TEST_SEEDS:
        result = read_result(family, name, seed)
        if result and "test" in result:
            scores[seed] = result["test"]["rougeL"]
    return scores


def table(grid: dict) -> None:
    """table.md: the test ROUGE-L of each row in each family and its mean paired gain over SFT."""
    families, winners = grid["families"], read_screening()["winners"]
    named = candidates(grid)
    rows = [("SFT", "sft"), ("KD", "kd"), ("DistiLLM", winners["distillm"]), ("ABKD", winners["abkd"]),
            ("MGSR", winners["mgsr"])]
    if winners["mgsr"] != "mgsr_paper":
        rows.append(("MGSR (paper's reading)", "mgsr_paper"))
    sft = {family: test_scores(family, "sft") for family in families}
    lines = ["| Method | " + " | ".join(families) + " | mean gain over SFT |", "|---|" + ":---:|" * (len(families) + 1)]
    paired_lines, paired = [], {}  # paired: label -> {family: (mean, se)}, for the chart
    for label, name in rows:
        cells, gains, errors = [], [], []
        for family in families:
            scores = test_scores(family, name)
            if not scores:
                cells.append("–")
                continue
            mean, se = mean_se(list(scores.values()))
            cells.append(f"{mean:.2f} ± {se:.2f}")
            diffs = [scores[s] - sft[family][s] for s in scores if s in sft[family]]
            if diffs and name != "sft":
                d_mean, d_se = mean_se(diffs)
                gains.append(d_mean)
                errors.append(d_se)
                paired.setdefault(label, {})[family] = (d_mean, d_se)
                paired_lines.append(f"- {label} − SFT, {family}: {d_mean:+.2f} ± {d_se:.2f} (paired over "
                                    f"{len(diffs)} training seeds)")
        if name == "sft":
            gain = "0"
        elif len(gains) == len(families):
            gain = f"{sum(gains) / len(gains):+.2f} ± {math.sqrt(sum(e * e for e in errors)) / len(errors):.2f}"
        else:
            gain = "–"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {gain} |")
    configs = [f"- {label}: `{name}` ({named.get(name, {}).get('label', name)})" for label, name in rows]
    text = "\n".join(lines) + "\n\nRows:\n\n" + "\n".join(configs) + "\n\nPaired differences against SFT:\n\n" \
        + "\n".join(paired_lines) + "\n"
    (RESULTS / "table.md").write_text(text)
    if paired:
        plot_family_gains(paired, families, "test ROUGE-L gain over SFT (paired over training seeds, ± standard error)",
                          RESULTS / "chart.png")
    print(text)


# --- part by part ---------------------------------------------------------------------------------------


PAPER = {"variant": "paper", "base": ("forward_kl", None), "band": [0.02, 0.9], "span": ("product", 1.0),
         "criterion": "max_difference"}
LIBRARY = {"variant": "rest", "base": ("alpha_beta", {"alpha": 0.2, "beta": 0.7}), "band": [0.005, 0.98],
           "span": ("normalized", 0.1), "criterion": "first_unlikely"}


def effective_init_args(family: str, spec: dict) -> dict:
    """The module's init args of a candidate: its composed config with the grid's overrides applied."""
    from mgsr_lightning.cli.config_files import composed_file

    config = composed_file(REPO / "configs" / family / f"{spec['config']}.yaml")
    args = config["model"]["init_args"]
    for key, value in spec.get("overrides", {}).items():
        node, parts = args, key.split(".")[2:]  # model.init_args.<...>
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return args


def part_specs(grid: dict, winner: str, family: str = "facts") -> dict[str, dict]:
    """The winner with one part set back to the paper's reading (or, where it reads as the paper, to the
    library's departure): DAC-KL's variant, its base, the band's start, the span relation, SCRG's criterion."""
    spec = candidates(grid)[winner]
    args = effective_init_args(family, spec)
    params = dict(args["distill"]["params"])
    bounds = list(args["distill"].get("clip_net", {}).get("init_bounds", [0.005, 0.98]))
    span = (args["span"].get("relation", "normalized"), args["span"].get("weight", 0.0))
    criterion = args["scrg"].get("criterion", "first_unlikely")
    parts = {}

    def swapped(name: str, key: str, value) -> None:
        overrides = dict(spec.get("overrides", {}))
        overrides[key] = value
        parts[f"{winner}__{name}"] = {"config": spec["config"], "overrides": overrides, "departures": None,
                                      "label": f"{spec['label']}, {name} swapped"}

    target = PAPER if params.get("variant", "rest") != PAPER["variant"] else LIBRARY
    swapped("variant", "model.init_args.distill.params", {**params, "variant": target["variant"]})
    target = PAPER if params.get("base") != PAPER["base"][0] else LIBRARY
    # no base_params key for a base without parameters (forward KL): the command line would make a null the
    # string 'None' (mgsr_fkl's amendment); the command-line mapping replaces the config's whole mapping
    base = {key: value for key, value in params.items() if key != "base_params"} | {"base": target["base"][0]}
    if target["base"][1] is not None:
        base["base_params"] = target["base"][1]
    swapped("base", "model.init_args.distill.params", base)
    target = PAPER if bounds != PAPER["band"] else LIBRARY
    swapped("band", "model.init_args.distill.clip_net", {**args["distill"].get("clip_net", {}),
                                                         "init_bounds": target["band"]})
    target = PAPER if span != PAPER["span"] else LIBRARY
    swapped("span", "model.init_args.span", {**args["span"], "relation": target["span"][0],
                                             "weight": target["span"][1]})
    target = PAPER if criterion != PAPER["criterion"] else LIBRARY
    swapped("criterion", "model.init_args.scrg.criterion", target["criterion"])
    return parts


def test_difference(result: dict, reference: dict) -> str:
    """A part swap's test cell: its ROUGE-L minus the winner's, ± the standard error over sampling seeds of the
    seed-by-seed differences (where both runs recorded their per-seed scores)."""
    difference = f"{result['rougeL'] - reference['rougeL']:+.2f}"
    ours, theirs = result.get("per_seed"), reference.get("per_seed")
    if not ours or not theirs or len(ours) != len(theirs):
        return difference
    _, error = mean_se([a - b for a, b in zip(ours, theirs)])
    return f"{difference} ± {error:.2f}"


def parts_table(grid: dict) -> None:
    families, winner = grid["families"], read_screening()["winners"]["mgsr"]
    base = {family: read_result(family, winner, 0) for family in families}
    lines = ["Each row: the MGSR winner with one part swapped, training seed 0 (one training seed); difference "
             "against the winner's seed-0 run (validation: best of the curve; test: the mean over sampling seeds "
             "10-50 ± the standard error of the five sampling-seed differences, paired seed by seed)", "",
             "| part swapped | " + " | ".join(f"{f} val | {f} test" for f in families) + " |",
             "|---|" + ":---:|:---:|" * len(families)]
    for name, spec in part_specs(grid, winner).items():
        cells = []
        for family in families:
            result, reference = read_result(family, name, 0), base[family]
            if not result or not reference or "test" not in result or "test" not in reference:
                cells += ["–", "–"]
                continue
            cells.append(f"{best(result['curve']) - best(reference['curve']):+.2f}")
            cells.append(test_difference(result["test"], reference["test"]))
        lines.append(f"| {name.split('__')[1]} | " + " | ".join(cells) + " |")
    (RESULTS / "parts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["train", "one", "screen", "table", "parts"])
    parser.add_argument("--phase", choices=["screen", "test", "parts"], default="screen")
    parser.add_argument("--families", default=None, help="comma-separated families (default: the grid's)")
    parser.add_argument("--only", default=None, help="comma-separated run names of the phase (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="trainings at once, one torch thread each")
    parser.add_argument("--family"), parser.add_argument("--name"), parser.add_argument("--seed", type=int)
    parser.add_argument("--test", action="store_true")
    args = parser.parse_args(argv)
    grid = load_grid()
    if args.action == "train":
        train(grid, args)
    elif args.action == "one":
        spec = None
        if args.phase == "parts":
            spec = part_specs(grid, read_screening()["winners"]["mgsr"])[args.name]
        train_one(grid, args.family, args.name, args.seed, args.test, spec)
    elif args.action == "screen":
        screen(grid)
    elif args.action == "table":
        table(grid)
    else:
        parts_table(grid)


if __name__ == "__main__":
    main()
