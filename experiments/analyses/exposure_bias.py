"""Exposure bias of trained students against their teacher: MiniLLM's ExAccErr curve, per student.

    python experiments/analyses/exposure_bias.py --teacher artifacts/reason/teacher \
        --students sft=runs/reproduce-reason/sft/seed0/hf,kd=runs/reproduce-reason/kd/seed0/hf \
        --data artifacts/reason/data/test.jsonl --template plain --max_new_tokens 48 --out experiments/results/reason

For each student, ``mgsr_lightning.evaluation.exposure_bias`` samples ``--samples`` responses per prompt
from the student and from the teacher (T = 1, full distribution), measures the student's per-step
KL(teacher ‖ student) on both, and reports ExAccErr(l) = (R(l) − l·ε(l)) / (l·ε(l)) × 100%: how much
more error the student accumulates on its own prefixes than on the teacher's. Prints a table at a few
lengths, and writes ``exposure_bias.json`` and ``exposure_bias.png`` (the curves) to ``--out``.

Students of several training seeds, one run of the script per seed, are merged afterwards into mean ±
standard error over the seeds (table, JSON and the mean curves with their error bands):

    python experiments/analyses/exposure_bias.py --merge runs/exb/seed0 runs/exb/seed1 runs/exb/seed2 --out <folder>
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from mgsr_lightning.data.collate import InstructionCollator
from mgsr_lightning.data.datamodule import encode_records
from mgsr_lightning.data.records import read_jsonl
from mgsr_lightning.evaluation.exposure_bias import exposure_bias
from mgsr_lightning.evaluation.report import mean_and_standard_error
from mgsr_lightning.generation.decode import Decoding
from mgsr_lightning.generation.sampling import SamplingConfig
from mgsr_lightning.models.tokenizer import load_tokenizer


def prompt_batches(tokenizer, rows, template: str, batch_size: int, max_prompt_length: int):
    """Left-padded (prompt_ids, prompt_mask) batches, tokenised as in training and evaluation
    (``encode_records``: the same template handling and long-prompt policy)."""
    examples, _ = encode_records(rows, tokenizer, template=template, eos_token_id=tokenizer.eos_token_id,
                                 max_length=None, max_prompt_length=max_prompt_length, name="exposure-bias prompts")
    collate = InstructionCollator(tokenizer.pad_token_id)
    for start in range(0, len(examples), batch_size):
        batch = collate(examples[start:start + batch_size])
        yield batch["prompt_ids"], batch["prompt_mask"]


LENGTHS = (5, 10, 20, 30, 40, 48, 64)


def merge_runs(folders: list[Path]) -> dict:
    """Per student: each curve's pointwise mean and standard error over the runs in ``folders`` (one
    ``exposure_bias.json`` each, e.g. one per training seed); only students present in every run."""
    runs = [json.loads((Path(folder) / "exposure_bias.json").read_text()) for folder in folders]
    names = [name for name in runs[0]["curves"] if all(name in run["curves"] for run in runs)]
    merged = {}
    for name in names:
        merged[name] = {}
        for key in ("regret", "forced_error", "ex_acc_err"):
            curves = [run["curves"][name][key] for run in runs]
            width = min(len(curve) for curve in curves)
            points = [mean_and_standard_error([curve[i] for curve in curves]) for i in range(width)]
            merged[name][key] = [mean for mean, _ in points]
            merged[name][key + "_se"] = [error or 0.0 for _, error in points]  # one run: no spread
    return {"runs": [str(folder) for folder in folders], "prompts": runs[0]["prompts"],
            "samples": runs[0]["samples"], "curves": merged}


def print_table(curves: dict, header: str) -> None:
    width = min(len(curve["ex_acc_err"]) for curve in curves.values())
    lengths = [length for length in LENGTHS if length <= width]
    print(header)
    print("| student | " + " | ".join(f"l={length}" for length in lengths) + " | R(L) | L·ε(L) |")
    print("|---|" + "---:|" * (len(lengths) + 2))

    def cell(curve, key, index, digits):
        error = curve.get(key + "_se")
        return f"{curve[key][index]:.{digits}f}" + (f" ± {error[index]:.{digits}f}" if error else "")

    for name, curve in curves.items():
        cells = " | ".join(cell(curve, "ex_acc_err", length - 1, 1) for length in lengths)
        print(f"| {name} | {cells} | {cell(curve, 'regret', -1, 2)} | {cell(curve, 'forced_error', -1, 2)} |")


def plot(curves: dict, path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axis = plt.subplots(figsize=(6, 4))
    for name, curve in curves.items():
        steps = range(1, len(curve["ex_acc_err"]) + 1)
        line, = axis.plot(steps, curve["ex_acc_err"], label=name)
        if "ex_acc_err_se" in curve:
            low = [m - e for m, e in zip(curve["ex_acc_err"], curve["ex_acc_err_se"])]
            high = [m + e for m, e in zip(curve["ex_acc_err"], curve["ex_acc_err_se"])]
            axis.fill_between(steps, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
    axis.axhline(0, color="gray", linewidth=0.5)
    axis.set_xlabel("response length l (tokens)")
    axis.set_ylabel("ExAccErr(l) (%)")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher")
    parser.add_argument("--students", help="name=folder,name=folder,...")
    parser.add_argument("--data", help="JSONL with instruction/input/output rows")
    parser.add_argument("--template", default="plain")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--max_prompt_length", type=int, default=56)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--merge", nargs="+", type=Path, default=None,
                        help="folders written by earlier runs (e.g. one per training seed): mean ± SE over them")
    parser.add_argument("--out", default="runs/exposure_bias")
    args = parser.parse_args()
    out = Path(args.out)

    if args.merge:
        missing = [str(folder) for folder in args.merge if not (folder / "exposure_bias.json").is_file()]
        if missing:
            parser.error(f"--merge: no exposure_bias.json in {', '.join(missing)}")
        merged = merge_runs(args.merge)
        print_table(merged["curves"], f"ExAccErr(l) in %, mean ± SE over {len(args.merge)} runs, "
                                      f"{merged['prompts']} prompts x {merged['samples']} samples "
                                      "per model and run, T = 1")
        out.mkdir(parents=True, exist_ok=True)
        (out / "exposure_bias.json").write_text(json.dumps(merged, indent=1) + "\n")
        plot(merged["curves"], out / "exposure_bias.png",
             f"Excess accumulated error, mean ± SE over {len(args.merge)} training seeds")
        return
    missing = [name for name in ("teacher", "students", "data") if getattr(args, name) is None]
    if missing:
        parser.error("give " + ", ".join(f"--{name}" for name in missing) + " (or --merge earlier runs)")

    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(args.teacher)
    teacher = AutoModelForCausalLM.from_pretrained(args.teacher).eval()
    rows = read_jsonl(args.data)[: args.prompts]
    decoding = Decoding(SamplingConfig(max_new_tokens=args.max_new_tokens), tokenizer.eos_token_id,
                        tokenizer.pad_token_id, vocab_size=len(tokenizer))
    curves = {}
    for entry in args.students.split(","):
        name, folder = entry.split("=", 1)
        student = AutoModelForCausalLM.from_pretrained(folder).eval()
        batches = prompt_batches(tokenizer, rows, args.template, args.batch_size, args.max_prompt_length)
        result = exposure_bias(student, teacher, batches, decoding, samples=args.samples)
        curves[name] = {key: getattr(result, key).tolist() for key in ("regret", "forced_error", "ex_acc_err")}

    print_table(curves, f"ExAccErr(l) in %, {len(rows)} prompts x {args.samples} samples per model, T = 1")
    out.mkdir(parents=True, exist_ok=True)
    (out / "exposure_bias.json").write_text(json.dumps({"prompts": len(rows), "samples": args.samples,
                                                        "curves": curves}, indent=1) + "\n")
    plot(curves, out / "exposure_bias.png", "Excess accumulated error of free-running generation")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
