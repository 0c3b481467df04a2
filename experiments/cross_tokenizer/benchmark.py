"""The cross-tokenizer benchmark: distilling across tokenizers on the embedded ``facts`` family.

The teacher side is a second facts teacher, trained with its own tokenizer: a byte-level BPE of 640 tokens
(the package's ``train_bpe_tokenizer``) learnt from the prompts as the configs render them (``plain``), where
the student's facts tokenizer learnt 2,048 asked (1,082 reached: the facts lexicon runs out of merges) from
the Alpaca rendering; so the two vocabularies differ both ways and the teacher cuts rarer names into pieces
("Bulen" -> "B", "ul", "en"). It trains by the facts teacher recipe (configs/facts/teacher.yaml, the same
1,600 steps on all 30,000 rows). The student side is the facts tokenizer and the facts SFT-initialised
student of each training seed, shared with the suite (``runs/suite/facts/init/seed<k>``, trained once if missing).
``--init-as-is`` takes an init student found there as it is, without checking the configuration it was trained
with (one trained by the suite at another commit: the init configs differ there only in the checkpoint callback's
class).

Every row is one ``fit`` of configs/facts/<config>.yaml from that student at facts' step budget, scored on
the test split with facts' five sampling seeds; its compact result (validation curve, training seconds, test
ROUGE-L) is written to ``experiments/results/cross_tokenizer/runs/<name>-seed<k>.json``, which ``table``
reads. A run whose result exists is skipped; a half-trained one resumes from its last checkpoint.

The SFT row and the same-tokenizer rows are, fit for fit, runs of the suite's test phase (the same config, the
same SFT-initialised student and seed, the same scoring): where the benchmark's init student of a seed holds the
very weights of the suite's (compared tensor by tensor; the same folder unless ``init_runs`` is moved) and the
suite has scored the run (``experiments/results/suite/runs/facts/<its name>-seed<k>.json``), the benchmark reads
it instead of training it again, and says so in ``table.md``'s ``from the suite`` column.

    python experiments/cross_tokenizer/benchmark.py prepare
    python experiments/cross_tokenizer/benchmark.py train --jobs 2 [--seeds 0,1,2] [--only kd_uld_cross]
    python experiments/cross_tokenizer/benchmark.py table

``--smoke`` runs the same path at a toy budget (2 steps per training, 8 scored rows) into separate folders
(``artifacts/facts_xtok_smoke``, ``runs/cross_tokenizer_smoke``), never into the benchmark's.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAMILY = "facts"
TRAIN_SEEDS = (0, 1, 2)
TEACHER_VOCAB = 640  # below the 1,082 tokens where BPE on the facts text runs out of merges
TEACHER_TEMPLATE = "plain"  # the student's tokenizer learnt from the Alpaca rendering
# The teacher's answers take up to 59 of its tokens (the student's 34): it generates up to 64 (its validation,
# and both teachers' test scores in pair.json).
TEACHER_NEW_TOKENS = 64

sys.path.insert(0, str(REPO / "experiments" / "suite"))
sys.path.insert(0, str(REPO / "experiments" / "analyses"))
from suite import RUNS as SUITE_RUNS  # noqa: E402
from suite import init_overrides, mean_se, run_in_processes  # noqa: E402
from suite import read_result as read_suite_result  # noqa: E402
from sweep import overrides_of, validation_curve  # noqa: E402

# name: its row in table.md, configs/facts/<config>.yaml, command-line overrides, and the teacher side
# (``cross``: the teacher trained with its own tokenizer; otherwise the facts teacher, when the method has one);
# ``suite``: the suite's run that is the same fit (configs/facts/mgsr.yaml is the suite's mgsr_scrg_on_policy.yaml
# since the suite chose the on-policy regime; the two differ in names and folders only)
ROWS: dict[str, dict] = {
    "sft": {"label": "SFT", "config": "sft", "overrides": {}, "cross": False, "suite": "sft"},
    # ULD as its paper trains it, with the ground-truth cross-entropy: alone (KD's sft_weight 0) it compares
    # probabilities sorted by size, not which token holds them, and a first run fell to 29.7 ROUGE-L (seed 1)
    "kd_uld_cross": {"label": "KD, cross-tokenizer (ULD)", "config": "kd", "cross": True,
                     "overrides": {"model.init_args.distill.cross_tokenizer": "uld",
                                   "model.init_args.sft_weight": 1.0}},
    "kd_exact_cross": {"label": "KD, cross-tokenizer (exact match)", "config": "kd", "cross": True,
                       "overrides": {"model.init_args.distill.cross_tokenizer": "exact_match"}},
    # MGSR's default (DAC-KL's rest variant over alpha-beta, on fresh student outputs at every step, SCRG) with
    # DAC-KL by exact match and SCRG through text; the span term (weight 0.1 by default) does not work across
    # tokenizers
    "mgsr_cross": {"label": "MGSR, cross-tokenizer", "config": "mgsr", "cross": True,
                   "overrides": {"model.init_args.distill.cross_tokenizer": "exact_match",
                                 "model.init_args.span.weight": 0.0,
                                 "model.init_args.scrg.criterion": "first_unlikely"}},
    "kd": {"label": "KD (same tokenizer)", "config": "kd", "overrides": {}, "cross": False, "suite": "kd"},
    "mgsr": {"label": "MGSR (same tokenizer)", "config": "mgsr", "overrides": {}, "cross": False,
             "suite": "mgsr_on_policy"},
}
# each cross-tokenizer row against the same-tokenizer row of its method (the share of its gain kept)
SAME_TOKENIZER = {"kd_uld_cross": "kd", "kd_exact_cross": "kd", "mgsr_cross": "mgsr"}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a benchmark (or its smoke run) keeps things, and the budget overrides of every training."""

    teacher_root: Path  # tokenizer/ and teacher/ (the run; the model in teacher/hf) of the teacher side
    runs: Path  # one run folder per row and seed, the logs, the locks
    init_runs: Path  # <init_runs>/facts/init/seed<k>: the SFT-initialised students
    results: Path  # runs/<name>-seed<k>.json and table.md
    budget: tuple[str, ...] = ()
    max_eval_examples: int | None = None
    shares_suite_runs: bool = True  # the suite's scored runs stand for the rows that are the same fit

    @property
    def tokenizer(self) -> Path:
        return self.teacher_root / "tokenizer"

    @property
    def teacher(self) -> Path:
        return self.teacher_root / "teacher" / "hf"


FULL = Layout(Path("artifacts/facts_xtok"), Path("runs/cross_tokenizer"), SUITE_RUNS,
              REPO / "experiments" / "results" / "cross_tokenizer")
SMOKE = Layout(Path("artifacts/facts_xtok_smoke"), Path("runs/cross_tokenizer_smoke"),
               Path("runs/cross_tokenizer_smoke"), Path("runs/cross_tokenizer_smoke/results"),
               # the adaptive regime on fresh student outputs at every step, so that SCRG through text runs
               budget=("--trainer.max_steps=2", "--trainer.val_check_interval=2",
                       "--model.init_args.validation.rouge_examples=8", "--model.init_args.regime.init_threshold=1.0",
                       "--trainer.log_every_n_steps=1"),
               max_eval_examples=8, shares_suite_runs=False)


def row_overrides(name: str, layout: Layout) -> tuple[str, ...]:
    """The command-line overrides of a row: its own, then the teacher side's when it distils across tokenizers."""
    spec = ROWS[name]
    teacher = ()
    if spec["cross"]:
        teacher = (f"--model.init_args.teacher.name_or_path={layout.teacher.resolve()}",
                   f"--data.teacher_tokenizer={layout.tokenizer.resolve()}")
    return overrides_of(spec) + teacher


def result_path(layout: Layout, name: str, seed: int) -> Path:
    return layout.results / "runs" / f"{name}-seed{seed}.json"


def same_weights(first: Path, second: Path) -> bool:
    """Whether two exported models (``model.safetensors`` folders) hold the same tensors, bit for bit."""
    import torch
    from safetensors.torch import load_file

    if not ((first / "model.safetensors").is_file() and (second / "model.safetensors").is_file()):
        return False
    if first.resolve() == second.resolve():  # one folder (the benchmark's own layout): nothing to load
        return True
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    return a.keys() == b.keys() and all(a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]) for key in a)


def init_is_suites(layout: Layout, seed: int) -> bool:
    """Whether this layout's SFT-initialised student of ``seed`` is the suite's, weight for weight."""
    return same_weights(layout.init_runs / FAMILY / "init" / f"seed{seed}" / "hf",
                        SUITE_RUNS / FAMILY / "init" / f"seed{seed}" / "hf")


def read_result(layout: Layout, name: str, seed: int) -> dict | None:
    """A row's result on one seed: its own, else (when scored, and when both start from the same SFT-initialised
    student) the suite's run that is the same fit, marked ``from_suite``."""
    path = result_path(layout, name, seed)
    if path.is_file():
        return json.loads(path.read_text())
    suite_name = ROWS[name].get("suite") if layout.shares_suite_runs else None
    shared = read_suite_result(FAMILY, suite_name, seed) if suite_name else None
    if not (shared and "test" in shared and init_is_suites(layout, seed)):
        return None
    return {**shared, "from_suite": suite_name}


# --- preparation ----------------------------------------------------------------------------------------


def setup(layout: Layout):
    """The facts family prepared once (data, its tokenizer and teacher): (environment, test sets, evaluation
    config, the family's folder), under a lock as parallel jobs ask for it."""
    from mgsr_lightning.pipeline import steps

    lock_path = layout.runs / "setup.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env, eval_sets, eval_config, teacher = steps.pair_setup(FAMILY, None, None, layout.max_eval_examples)
    return env, eval_sets, eval_config, teacher.parent


def prepare(layout: Layout) -> None:
    """The teacher side: its tokenizer, then the facts teacher recipe trained with it; a step whose output
    exists is skipped. Writes ``pair.json``: both vocabularies, how they tokenise the test answers, and both
    teachers' test ROUGE-L (scored as the students are)."""
    import torch

    from mgsr_lightning.data.records import read_jsonl
    from mgsr_lightning.data.templates import render_prompt
    from mgsr_lightning.models.tokenizer import load_tokenizer, train_bpe_tokenizer
    from mgsr_lightning.pipeline import steps
    from mgsr_lightning.pipeline.tiny import EMBEDDED

    torch.set_num_threads(1)
    env, eval_sets, eval_config, root = setup(layout)
    if not (layout.tokenizer / "tokenizer.json").is_file():
        rows = read_jsonl(root / "data" / "train.jsonl")
        texts = [render_prompt(row, TEACHER_TEMPLATE) + row["output"] for row in rows]
        train_bpe_tokenizer(texts, vocab_size=TEACHER_VOCAB, save_dir=layout.tokenizer,
                            model_max_length=EMBEDDED[FAMILY][3])
    if not (layout.teacher / "config.json").is_file():
        print(f"training the {FAMILY} teacher with its own tokenizer into {layout.teacher}", flush=True)
    steps.fit(FAMILY, "teacher", layout.teacher.parent, 0, env, (
        f"--data.tokenizer={layout.tokenizer.resolve()}",
        f"--model.init_args.sampling.max_new_tokens={TEACHER_NEW_TOKENS}", *layout.budget))
    student, teacher = load_tokenizer(str(root / "tokenizer")), load_tokenizer(str(layout.tokenizer))
    answers = [row["output"] for row in read_jsonl(root / "data" / "test.jsonl")]
    shared = set(student.get_vocab()) & set(teacher.get_vocab())
    config = dataclasses.replace(eval_config, sampling=dataclasses.replace(eval_config.sampling,
                                                                         max_new_tokens=TEACHER_NEW_TOKENS))
    scores = {name: steps.evaluate(model, layout.runs / "teachers" / name, name, eval_sets, config)["avg"]
              for name, model in (("same_tokenizer", root / "teacher"), ("own_tokenizer", layout.teacher))}
    pair = {"student": {"tokenizer": str(root / "tokenizer"), "vocabulary": len(student),
                        "test_answer_tokens": sum(len(student(text)["input_ids"]) for text in answers)},
            "teacher": {"tokenizer": str(layout.tokenizer), "vocabulary": len(teacher), "model": str(layout.teacher),
                        "test_answer_tokens": sum(len(teacher(text)["input_ids"]) for text in answers)},
            "shared_strings": len(shared),
            "teachers_test_rougeL": {name: avg["rougeL"] for name, avg in scores.items()}}
    layout.results.mkdir(parents=True, exist_ok=True)
    (layout.results / "pair.json").write_text(json.dumps(pair, indent=1) + "\n")
    print(json.dumps(pair, indent=1))


# --- training -------------------------------------------------------------------------------------------


def jobs_of(names: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """(name, seed) of every run, seed by seed (a partial benchmark has whole seeds), rows in table order."""
    return [(name, seed) for seed in seeds for name in names]


def pending(layout: Layout, jobs: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The jobs without a scored result: a run whose result has its test scores is done."""
    return [(name, seed) for name, seed in jobs if "test" not in (read_result(layout, name, seed) or {})]


def init_student(layout: Layout, seed: int, env: dict[str, str], as_is: bool = False) -> tuple[str, ...]:
    """The overrides that start a row from the seed's SFT-initialised student: trained (or checked against
    today's configs) by the suite's ``init_overrides``; with ``as_is``, an exported one is taken as it is."""
    exported = layout.init_runs / FAMILY / "init" / f"seed{seed}" / "hf"
    if as_is and (exported / "config.json").is_file():
        return (f"--model.init_args.student={json.dumps({'name_or_path': str(exported.resolve()), 'config': None})}",)
    return init_overrides(FAMILY, seed, env, runs=layout.init_runs, overrides=layout.budget)


def train_one(layout: Layout, name: str, seed: int, init_as_is: bool = False) -> None:
    """Train (or find trained) one row on one seed in this process, score it on the test split, and write its
    compact result."""
    import torch

    from mgsr_lightning.pipeline import steps

    torch.set_num_threads(1)
    spec = ROWS[name]
    env, eval_sets, eval_config, _ = setup(layout)
    init = init_student(layout, seed, env, init_as_is)
    run_dir = layout.runs / name / f"seed{seed}"
    student = steps.fit(FAMILY, spec["config"], run_dir, seed, env, init + row_overrides(name, layout) + layout.budget)
    metrics = steps.evaluate(student, run_dir / "eval", name, eval_sets, eval_config)
    seconds = run_dir / "train_seconds.txt"
    result = {"family": FAMILY, "name": name, "label": spec["label"], "seed": seed, "config": spec["config"],
              "overrides": list(row_overrides(name, layout) + layout.budget), "curve": validation_curve(run_dir),
              "train_seconds": float(seconds.read_text()) if seconds.is_file() else None,
              "test": {"rougeL": metrics["avg"]["rougeL"], "exact_match": metrics["avg"].get("exact_match"),
                       "rougeL_per_sampling_seed": metrics["avg"].get("rougeL_per_seed"),
                       "sampling_seeds": list(eval_config.seeds)}}
    path = result_path(layout, name, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


def train(layout: Layout, args: argparse.Namespace) -> None:
    names = args.only.split(",") if args.only else list(ROWS)
    unknown = [name for name in names if name not in ROWS]
    if unknown:
        sys.exit(f"unknown row {', '.join(unknown)}; the rows: {', '.join(ROWS)}")
    prepare(layout)
    jobs = pending(layout, jobs_of(names, args.seeds))
    flags = ["--smoke"] if layout == SMOKE else []
    flags += ["--init-as-is"] if args.init_as_is else []
    runs = [(f"{name} seed {seed}", f"{name}-seed{seed}", ["one", "--name", name, "--seed", str(seed), *flags])
            for name, seed in jobs]
    run_in_processes(runs, __file__, layout.runs / "logs", args.jobs)


# --- table ----------------------------------------------------------------------------------------------


def scores_of(layout: Layout, name: str) -> dict[int, float]:
    """Test ROUGE-L (mean over the sampling seeds) of a row, per training seed that has it."""
    results = {seed: read_result(layout, name, seed) for seed in TRAIN_SEEDS}
    return {seed: result["test"]["rougeL"] for seed, result in results.items() if result and "test" in result}


def suite_seeds(layout: Layout, name: str) -> list[int]:
    """The training seeds on which a row's result is the suite's run."""
    return [seed for seed in TRAIN_SEEDS if (read_result(layout, name, seed) or {}).get("from_suite")]


def paired_gain(scores: dict[int, float], sft: dict[int, float]) -> tuple[float, float] | None:
    """Mean and standard error of a row's differences against SFT, training seed by training seed (on the seeds
    both have); None without a common seed."""
    differences = [scores[seed] - sft[seed] for seed in sorted(scores) if seed in sft]
    return mean_se(differences) if differences else None


def render_table(layout: Layout) -> str:
    """table.md: each row's test ROUGE-L over training seeds and its paired difference against SFT; a
    cross-tokenizer row also its gain over SFT as a share of its method's same-tokenizer gain (where that gain is
    positive)."""
    scores = {name: scores_of(layout, name) for name in ROWS}
    gains = {name: paired_gain(scores[name], scores["sft"]) for name in ROWS if name != "sft"}
    lines = ["| Row | test ROUGE-L | − SFT (paired) | share of the same-tokenizer gain | training seeds |"
             " from the suite |", "|---|:---:|:---:|:---:|:---:|:---:|"]
    for name, spec in ROWS.items():
        if not scores[name]:
            lines.append(f"| {spec['label']} | – | – | – | – | – |")
            continue
        mean, error = mean_se(list(scores[name].values()))
        gain = gains.get(name)
        difference = f"{gain[0]:+.2f} ± {gain[1]:.2f}" if gain else "–"
        reference = gains.get(SAME_TOKENIZER.get(name, ""))
        share = f"{gain[0] / reference[0]:.2f}" if gain and reference and reference[0] > 0 else "–"
        shared = suite_seeds(layout, name)
        lines.append(f"| {spec['label']} | {mean:.2f} ± {error:.2f} | {difference} | {share} | "
                     f"{', '.join(str(seed) for seed in sorted(scores[name]))} | "
                     f"{', '.join(str(seed) for seed in shared) or '–'} |")
    return "\n".join(lines) + "\n"


# TRL's GOLD on the same pair (gold.py), one file per setting and training seed: gold-<setting>-seed<k>.json
GOLD_SETTINGS = {
    "lmbda0.5": "TRL GOLD, its defaults (on-policy share 0.5)",
    "lmbda0": "TRL GOLD, ground truth only (lmbda 0)",
    "lmbda0-ce": "TRL GOLD, ground truth only, + CE (uld_crossentropy_weight 1)",
}


def render_gold_table(layout: Layout) -> str:
    """GOLD's rows beside the table: test ROUGE-L over training seeds, the paired difference against our SFT
    row, steps/s (a mean over its runs), and the seeds on which GOLD did not run (with the first reason)."""
    sft = scores_of(layout, "sft")
    lines = ["| TRL GOLD setting | test ROUGE-L | − SFT (paired) | steps/s | training seeds | did not run |",
             "|---|:---:|:---:|:---:|:---:|---|"]
    for setting, label in GOLD_SETTINGS.items():
        records = {seed: json.loads(path.read_text()) for seed in TRAIN_SEEDS
                   if (path := layout.results / f"gold-{setting}-seed{seed}.json").is_file()}
        if not records:
            continue
        scores = {seed: r["rougeL"] for seed, r in records.items()
                  if r["status"] == "ok" and r.get("rougeL") is not None}
        failed = {seed: r.get("reason", "") for seed, r in records.items() if r["status"] != "ok"}
        score = "{:.2f} ± {:.2f}".format(*mean_se(list(scores.values()))) if scores else "–"
        gain = paired_gain(scores, sft)
        difference = f"{gain[0]:+.2f} ± {gain[1]:.2f}" if gain else "–"
        speeds = [r["steps_per_s"] for r in records.values() if r.get("steps_per_s")]
        speed = f"{sum(speeds) / len(speeds):.2f}" if speeds else "–"
        reason = f"seeds {', '.join(map(str, failed))}: {next(iter(failed.values()))}" if failed else "–"
        lines.append(f"| {label} | {score} | {difference} | {speed} | "
                     f"{', '.join(map(str, sorted(scores))) or '–'} | {reason} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def keep_suite_results(layout: Layout) -> None:
    """Copy each suite run that stands for a row (its init student checked) into this benchmark's results, marked
    ``from_suite``, so that the table is rebuilt without the run folders (a clone has none)."""
    for name, spec in ROWS.items():
        if not spec.get("suite"):
            continue
        for seed in TRAIN_SEEDS:
            path = result_path(layout, name, seed)
            if path.is_file():  # kept already, or the benchmark's own run
                continue
            result = read_result(layout, name, seed)
            if result and result.get("from_suite"):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(result, indent=1) + "\n")


def table(layout: Layout) -> None:
    keep_suite_results(layout)
    text = render_table(layout)
    gold = render_gold_table(layout)
    text += "\n" + gold if gold else ""
    notes = ["", "Test ROUGE-L: per training seed the mean over facts' five sampling seeds; then mean ± standard "
             "error over training seeds (nan with one seed). − SFT: the mean ± standard error of the seed-by-seed "
             "differences. Share: the row's gain over SFT over the gain of its method's same-tokenizer row "
             "(KD or MGSR). From the suite: the training seeds whose run is the suite's test-phase run of the same fit "
             "(experiments/results/suite/runs/facts/; the same SFT-initialised weights, bit for bit), read rather "
             "than trained again. TRL GOLD (experiments/cross_tokenizer/gold.py, gold-<setting>-seed<k>.json): "
             "from the same SFT-initialised students, its last step scored as our rows are; steps/s on the "
             "shared 2-core machine, beside the other trainings. Rows and commands: README.md."]
    layout.results.mkdir(parents=True, exist_ok=True)
    (layout.results / "table.md").write_text(text + "\n".join(notes) + "\n")
    print(text)


def seed_list(text: str) -> list[int]:
    """``--seeds 0,1,2``; argparse turns the ValueError of anything else into one line."""
    return [int(seed) for seed in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["prepare", "train", "one", "table"])
    parser.add_argument("--jobs", type=int, default=2, help="trainings at once, one torch thread each")
    parser.add_argument("--seeds", type=seed_list, default=list(TRAIN_SEEDS), help="training seeds, comma-separated")
    parser.add_argument("--only", default=None, help=f"comma-separated rows (default: all of {', '.join(ROWS)})")
    parser.add_argument("--smoke", action="store_true", help="the same path at a toy budget, in separate folders")
    parser.add_argument("--init-as-is", action="store_true",
                        help="take an exported SFT-initialised student as it is, without checking its configuration")
    parser.add_argument("--name"), parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    layout = SMOKE if args.smoke else FULL
    if args.action == "prepare":
        prepare(layout)
    elif args.action == "train":
        train(layout, args)
    elif args.action == "one":
        train_one(layout, args.name, args.seed, args.init_as_is)
    else:
        table(layout)


if __name__ == "__main__":
    main()
