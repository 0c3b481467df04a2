"""TRL's GOLD trainer on a cross-tokenizer pair, scored by our evaluator beside our cross-tokenizer rows.

    python experiments/cross_tokenizer/gold.py --teacher artifacts/facts_xtok/teacher/hf \\
        --student runs/suite/facts/init/seed0/hf --data artifacts/facts/data --steps 600 --batch-size 32 \\
        --seed 0 --out runs/cross_tokenizer/gold/seed0

The teacher folder holds its own tokenizer, the student folder its own (the SFT-initialised student, as every
row of the table starts from). GOLD (``trl.experimental.gold.GOLDTrainer``) runs in TRL's own interpreter
(``--trl-python``, a venv with ``pip install .[bench]``: ``trl==1.16.0``), as ``bench_vs_trl.py`` runs TRL, so
this project's environment is never touched. Its cross-tokenizer settings: ULD with the extended (byte-offset)
alignment and the hybrid loss, i.e. GOLD's JSD over the vocabulary entries whose strings both tokenizers hold
(its exact-match mapping) and ULD over the rest. Everything else is GOLD's default (on-policy share
``lmbda`` 0.5, JSD β 0.5, sampling T 0.9 and top-p 0.95) except the optimiser, which is the facts configs'
(AdamW lr 5e-4, weight decay 0.01, cosine after 10 warm-up steps, gradient clip 1.0), and the lengths, which are
the facts data module's; ``--set KEY=VALUE`` overrides any ``GOLDConfig`` field. CPU, fp32.

The training rows are the data module's: ``student_train.jsonl`` when the data folder has it (facts: the
students' 3,000 rows), else ``train.jsonl``; each prompt rendered by the package's template (``plain``, as the
facts configs), the answer after it; rows the data module drops for length (prompt over
``--max-prompt-length`` or prompt + answer + EOS over ``--max-length`` student tokens) are dropped here too.
GOLD trains ``--steps`` steps; there is no validation or checkpoint selection (our rows keep their best
validation checkpoint), so the last step's student is saved and scored.

Then ``python -m mgsr_lightning evaluate`` (this project's interpreter) scores the saved student on
``test.jsonl`` with sampling seeds 10-50, the template and lengths of training, as every table here does.

Measured in the GOLD process: steps/s (the time from the end of step ``--warmup`` to the end of the last step
over the steps between, data loading and GOLD's generation included: a mean, as GOLD draws each step on-policy
or not), and its peak resident memory (``VmHWM``). ``--out/gold.json`` holds
them, ROUGE-L mean ± std over the sampling seeds, the TRL, transformers and torch versions and every GOLD
setting used. When GOLD cannot run on the pair (an API mismatch, a tokenizer it refuses, a missing
dependency), the script says why in one line, writes that reason into ``gold.json`` (``"status": "failed"``)
and exits with status 2; ``gold_worker.log`` holds GOLD's own output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TRL_PYTHON = REPO / ".venv-bench" / "bin" / "python"  # the Makefile's BENCH_VENV
SEEDS = (10, 20, 30, 40, 50)
# The facts configs' optimiser (configs/facts/base.yaml) for GOLD's run; GOLD's own lr default is 1e-7.
OPTIMISER = {"learning_rate": 5e-4, "weight_decay": 0.01, "lr_scheduler_type": "cosine", "warmup_steps": 10,
             "max_grad_norm": 1.0}
# GOLD's cross-tokenizer settings (GOLDConfig's docstrings): ULD, byte-offset alignment of split tokens, and the
# hybrid loss (JSD over the exact-match vocabulary mapping, ULD over the unmatched rest).
CROSS_TOKENIZER = {"use_uld_loss": True, "use_extended_uld": True, "uld_use_hybrid_loss": True}
# GOLDConfig fields recorded in gold.json (GOLD's own, plus the training arguments that shape its run).
RECORDED = (
    "learning_rate", "weight_decay", "lr_scheduler_type", "warmup_steps", "max_grad_norm", "max_steps",
    "per_device_train_batch_size", "gradient_accumulation_steps", "max_length", "seed", "use_cpu", "bf16", "fp16",
    "temperature", "top_p", "top_k", "lmbda", "beta", "max_completion_length", "teacher_tokenizer_name_or_path",
    "disable_dropout", "seq_kd", "num_generations", "generation_batch_size", "use_uld_loss", "use_extended_uld",
    "uld_token_merge_strategy", "uld_use_hybrid_loss", "uld_hybrid_matched_weight", "uld_hybrid_unmatched_weight",
    "uld_crossentropy_weight", "uld_distillation_weight", "uld_student_temperature", "uld_teacher_temperature",
    "uld_skip_student_eos", "uld_skip_teacher_eos", "use_vllm",
)


class GoldFailed(Exception):
    """GOLD could not run on this pair; the message is the one-line reason."""


class EvaluationFailed(Exception):
    """``evaluate`` did not score the trained student (it printed why)."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="teacher model folder, with its own tokenizer")
    parser.add_argument("--student", required=True, help="the SFT-initialised student folder, with its tokenizer")
    parser.add_argument("--data", required=True, help="folder of train (or student_train), validation, test JSONL")
    parser.add_argument("--steps", type=int, required=True, help="GOLD's training steps")
    parser.add_argument("--batch-size", type=int, required=True, help="rows per step")
    parser.add_argument("--out", required=True, help="folder for gold.json, the trained student and its scores")
    parser.add_argument("--warmup", type=int, default=2, help="steps not timed at the start (they are trained)")
    parser.add_argument("--trl-python", default=str(DEFAULT_TRL_PYTHON),
                        help="python of a venv with trl==1.16.0 (default: the repository's .venv-bench)")
    parser.add_argument("--template", default="plain", choices=("plain", "alpaca"), help="the data module's template")
    parser.add_argument("--max-prompt-length", type=int, default=56, help="student tokens (facts: 56)")
    parser.add_argument("--max-length", type=int, default=136, help="prompt + answer + EOS, student tokens (facts)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="GOLD's completions and evaluation (facts)")
    parser.add_argument("--seed", type=int, default=0, help="GOLD's training seed")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="sampling seeds of the evaluation")
    parser.add_argument("--eval-batch-size", type=int, default=100)
    parser.add_argument("--max-eval-examples", type=int, default=None, help="only the first N test rows")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in GOLD's process")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a GOLDConfig field (VALUE read as JSON, else as a string); repeatable")
    args = parser.parse_args(argv)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Raise ConfigError/MissingFileError (one line each) for what cannot work, before anything runs."""
    from mgsr_lightning.errors import ConfigError, MissingFileError

    for name in ("steps", "batch_size", "max_prompt_length", "max_length", "max_new_tokens", "eval_batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise ConfigError(f"--warmup must be at least 0, got {args.warmup}")
    if args.max_eval_examples is not None and args.max_eval_examples < 1:
        raise ConfigError(f"--max-eval-examples must be at least 1, got {args.max_eval_examples}")
    if args.max_new_tokens >= args.max_length:
        raise ConfigError(f"--max-new-tokens ({args.max_new_tokens}) must be under --max-length ({args.max_length}): "
                          "GOLD keeps room for the prompt")
    try:
        args.seed_list = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    except ValueError:
        raise ConfigError(f"--seeds: comma-separated integers, e.g. 10,20,30,40,50; got {args.seeds!r}") from None
    if not args.seed_list:
        raise ConfigError("--seeds: give at least one sampling seed")
    args.overrides = gold_overrides(args.set)
    for side in ("teacher", "student"):
        folder = Path(getattr(args, side))
        if not (folder / "config.json").is_file():
            raise MissingFileError(f"--{side} {folder}: not a model folder (no config.json)")
        if not (folder / "tokenizer.json").is_file():
            raise MissingFileError(f"--{side} {folder}: no tokenizer.json; GOLD's cross-tokenizer alignment needs each "
                                   "side's own fast tokenizer in its folder")
    args.train_file = train_file(Path(args.data))
    if not (Path(args.data) / "test.jsonl").is_file():
        raise MissingFileError(f"--data {args.data}: no test.jsonl")


def gold_overrides(pairs: list[str]) -> dict:
    """``KEY=VALUE`` strings as a dict, each value read as JSON (``0.5``, ``true``, ``null``), else kept a string."""
    from mgsr_lightning.errors import ConfigError

    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set lmbda=1.0")
        try:
            overrides[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key.strip()] = value
    return overrides


def train_file(data: Path) -> Path:
    """The students' training rows: ``student_train.jsonl`` (facts keeps the teacher's in ``train.jsonl``), else
    ``train.jsonl``."""
    from mgsr_lightning.errors import MissingFileError

    for name in ("student_train.jsonl", "train.jsonl"):
        if (data / name).is_file():
            return data / name
    raise MissingFileError(f"--data {data}: no student_train.jsonl or train.jsonl")


# ---- this project's side: the rows, the evaluation, gold.json -------------------------------------


def training_rows(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """(``{"prompt", "completion"}`` rows for GOLD, the data module's length counts): prompts rendered by the
    package's template, rows the data module drops for length dropped."""
    from mgsr_lightning.data.datamodule import encode_records
    from mgsr_lightning.data.records import load_records
    from mgsr_lightning.data.templates import render_prompt
    from mgsr_lightning.models.tokenizer import load_tokenizer

    records = load_records(str(args.train_file))
    tokenizer = load_tokenizer(args.student)
    kept, stats = encode_records(records, tokenizer, template=args.template, eos_token_id=tokenizer.eos_token_id,
                                 max_length=args.max_length, max_prompt_length=args.max_prompt_length,
                                 name=args.train_file.name)
    rows = []
    for example in kept:
        record = records[example.index]
        output = record["output"] if isinstance(record["output"], str) else record["output"][0]
        rows.append({"prompt": record.get("prompt") or render_prompt(record, args.template, tokenizer),
                     "completion": output})
    return rows, stats


def worker_spec(args: argparse.Namespace, out: Path) -> dict:
    """What GOLD's process needs, all plain JSON (it imports nothing of this project)."""
    return {
        "teacher": str(Path(args.teacher).resolve()), "student": str(Path(args.student).resolve()),
        "rows": str(out / "gold_train.jsonl"), "save_to": str(out / "student"), "trainer_dir": str(out / "trl"),
        "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
        "config": {**OPTIMISER, "warmup_steps": min(OPTIMISER["warmup_steps"], args.steps), **CROSS_TOKENIZER,
                   "max_steps": args.steps, "per_device_train_batch_size": args.batch_size,
                   "max_length": args.max_length, "max_completion_length": args.max_new_tokens, "seed": args.seed,
                   **args.overrides},
    }


def run_gold(args: argparse.Namespace, spec_path: Path, log_path: Path) -> dict:
    """GOLD's result from its own interpreter; GoldFailed with the reason when it did not train."""
    python = Path(args.trl_python)
    if not python.is_file():
        raise GoldFailed(f"no TRL interpreter at {python} (make bench creates .venv-bench with trl==1.16.0)")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)  # TRL's venv, not this project's packages
    # the caller's working directory: the paths given on the command line are relative to it
    done = subprocess.run([str(python), str(Path(__file__).resolve()), "--worker", str(spec_path)],
                          capture_output=True, text=True, env=env)
    log_path.write_text(done.stdout + "\n---- stderr ----\n" + done.stderr)
    return worker_result(done.returncode, done.stdout, done.stderr)


def worker_result(returncode: int, stdout: str, stderr: str) -> dict:
    """The worker's ``RESULT`` line, or GoldFailed with its ``FAILED`` line (or the last error line of a crash)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
        if line.startswith("FAILED "):
            raise GoldFailed(line[len("FAILED "):])
    errors = [line.strip() for line in stderr.splitlines() if re.match(r"^\w+(\.\w+)*(Error|Exception)\b", line)]
    last = errors[-1] if errors else (stderr.strip().splitlines() or ["no output"])[-1]
    raise GoldFailed(f"GOLD's process exited with status {returncode}: {last}")


def evaluate(args: argparse.Namespace, model: Path, out: Path) -> dict:
    """``python -m mgsr_lightning evaluate`` on the test split; its metrics.json."""
    command = [sys.executable, "-m", "mgsr_lightning", "evaluate", "--model", str(model),
               "--sets", json.dumps([str(Path(args.data) / "test.jsonl")]), "--out", str(out),
               "--seeds", json.dumps(args.seed_list), "--template", args.template,
               "--max_new_tokens", str(args.max_new_tokens), "--max_prompt_length", str(args.max_prompt_length),
               "--batch_size", str(args.eval_batch_size), "--label", "TRL GOLD"]
    if args.max_eval_examples is not None:
        command += ["--max_examples", str(args.max_eval_examples)]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(command, env=env)
    if done.returncode != 0:
        raise EvaluationFailed(f"the evaluation of {model} exited with status {done.returncode} (its line above)")
    return json.loads((out / "metrics.json").read_text())


def summary(args: argparse.Namespace, gold: dict | None, metrics: dict | None, stats: dict | None,
            reason: str | None = None) -> dict:
    """gold.json: what ran, its speed and memory, its ROUGE-L over the sampling seeds; or why it did not run."""
    record = {
        "status": "failed" if reason is not None else "ok",
        "trainer": "trl.experimental.gold.GOLDTrainer",
        "teacher": str(args.teacher), "student": str(args.student), "data": str(args.data),
        "train_file": str(args.train_file), "template": args.template, "steps": args.steps,
        "batch_size": args.batch_size, "warmup_steps_untimed": args.warmup, "sampling_seeds": args.seed_list,
        "training_rows": stats,
    }
    if reason is not None:
        return record | {"reason": reason}
    seconds = gold["seconds_per_step"]
    record |= {
        "steps_per_s": 1 / seconds if seconds else None,
        "seconds_per_step": seconds,
        "timed_steps": gold["timed_steps"],
        "on_policy_steps": gold.get("on_policy_steps"),
        "peak_rss_mib": gold["peak_rss_mib"],
        "threads": gold["threads"],
        "versions": gold["versions"],
        "gold_settings": gold["settings"],
        "train_loss": gold.get("train_loss"),
        "train_matched_loss": gold.get("train_matched_loss"),
        "train_unmatched_loss": gold.get("train_unmatched_loss"),
    }
    if metrics is not None:
        test = next(iter(metrics["sets"].values()))
        record |= {"rougeL": test["rougeL"], "rougeL_std": test["rougeL_std"],
                   "rougeL_per_seed": test["rougeL_per_seed"], "exact_match": test.get("exact_match"),
                   "test_rows": test.get("num_examples")}
    return record


def write_json(path: Path, record: dict) -> None:
    path.write_text(json.dumps(record, indent=2) + "\n")


def training_settings(args: argparse.Namespace) -> dict:
    """``mgsr_training.json`` beside the trained student, as ``fit`` writes it: how it was trained to be prompted."""
    return {"template": args.template, "max_prompt_length": args.max_prompt_length, "max_length": args.max_length,
            "eos_token": None, "train_data": str(args.train_file), "val_data": None,
            "test_data": str(Path(args.data) / "test.jsonl"), "max_new_tokens": args.max_new_tokens}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:  # GOLD's process: TRL's interpreter, without this project's package
        worker(Path(argv[1]))
        return
    from mgsr_lightning.errors import ConfigError, debug_requested, exit_with, report

    try:
        args = parse_args([a for a in argv if a != "--debug"])
        out = Path(args.out)
        if (out / "gold.json").is_file():
            raise ConfigError(f"--out {out} already holds a GOLD run (gold.json): give a new folder, or remove it")
        out.mkdir(parents=True, exist_ok=True)
        rows, stats = training_rows(args)
        (out / "gold_train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        spec_path = out / "gold_worker.json"
        write_json(spec_path, worker_spec(args, out))
        try:
            gold = run_gold(args, spec_path, out / "gold_worker.log")
        except GoldFailed as failed:
            write_json(out / "gold.json", summary(args, None, None, stats, reason=str(failed)))
            exit_with(f"GOLD did not run on this pair: {failed} (reason written to {out / 'gold.json'})")
        (out / "student" / "mgsr_training.json").write_text(json.dumps(training_settings(args), indent=2) + "\n")
        write_json(out / "gold.json", summary(args, gold, None, stats))  # kept if the evaluation fails
        try:
            metrics = evaluate(args, out / "student", out / "eval")
        except EvaluationFailed as failed:
            exit_with(f"{failed}; GOLD's speed and memory are in {out / 'gold.json'}, without ROUGE-L")
        record = summary(args, gold, metrics, stats)
        write_json(out / "gold.json", record)
        speed = f"{record['steps_per_s']:.3f} steps/s" if record["steps_per_s"] else "steps/s not timed"
        print(f"GOLD: {speed}, peak RSS {record['peak_rss_mib']:.0f} MiB, test ROUGE-L {record['rougeL']:.2f} "
              f"± {record['rougeL_std']:.2f} over seeds {args.seeds} -> {out / 'gold.json'}")
    except Exception as error:  # noqa: BLE001 - a user's mistake is one line, anything else keeps its traceback
        report(error, debug_requested(argv))
        raise


# ---- GOLD's side: runs in TRL's interpreter, imports nothing of this project -----------------------


def worker(spec_path: Path) -> None:
    """Train with GOLDTrainer as the spec says, save the student, print ``RESULT <json>`` (or ``FAILED <reason>``)."""
    spec = json.loads(spec_path.read_text())
    try:
        result = train_gold(spec)
    except Exception as error:  # noqa: BLE001 - any failure of GOLD on this pair is the reason to report
        print(f"FAILED {type(error).__name__}: {' '.join(str(error).split())}", flush=True)
        import traceback

        traceback.print_exc()
        raise SystemExit(1) from None
    print("RESULT " + json.dumps(result), flush=True)


def train_gold(spec: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.gold import GOLDConfig, GOLDTrainer

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    rows = [json.loads(line) for line in Path(spec["rows"]).read_text().splitlines() if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(spec["student"])
    student = AutoModelForCausalLM.from_pretrained(spec["student"], dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(spec["teacher"], dtype=torch.float32)
    ends: list[float] = []
    losses: dict[str, list[float]] = {"loss": [], "matched_loss": [], "unmatched_loss": []}
    on_policy: list[bool] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, train_args, state, control, **kwargs):
            ends.append(time.perf_counter())

        def on_log(self, train_args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:  # GOLD's hybrid loss logs its exact-match and ULD parts too
                for key, values in losses.items():
                    if key in logs:
                        values.append(float(logs[key]))
                on_policy.append("on_policy_loss" in logs)

    config = GOLDConfig(
        output_dir=spec["trainer_dir"], teacher_tokenizer_name_or_path=spec["teacher"], use_cpu=True, bf16=False,
        fp16=False, logging_steps=1, save_strategy="no", report_to=[], gradient_checkpointing=False,
        dataloader_num_workers=0, **spec["config"],
    )
    trainer = GOLDTrainer(model=student, teacher_model=teacher, args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[StepEnds()])
    trainer.train()
    trainer.save_model(spec["save_to"])
    tokenizer.save_pretrained(spec["save_to"])
    warmup = spec["warmup"]
    timed = ends[warmup - 1:] if warmup > 0 else ends
    return {
        # the mean, not the median: GOLD draws each step on-policy (generating) or not, with chance lmbda
        "seconds_per_step": (timed[-1] - timed[0]) / (len(timed) - 1) if len(timed) > 1 else None,
        "timed_steps": max(len(timed) - 1, 0),
        "steps_trained": len(ends),
        "on_policy_steps": sum(on_policy),
        "peak_rss_mib": peak_rss_mib(),
        "threads": torch.get_num_threads(),
        "versions": versions(),
        "settings": {name: getattr(config, name) for name in RECORDED if hasattr(config, name)},
        "train_loss": losses["loss"],
        "train_matched_loss": losses["matched_loss"],
        "train_unmatched_loss": losses["unmatched_loss"],
    }


def peak_rss_mib() -> float:
    """This process's peak resident memory, MiB (``VmHWM``; see experiments/benchmarks/proc_memory.py)."""
    sys.path.insert(0, str(REPO / "experiments" / "benchmarks"))
    from proc_memory import status_kib

    return status_kib("VmHWM") / 1024


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("trl", "transformers", "torch", "datasets", "accelerate"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


if __name__ == "__main__":
    main()
