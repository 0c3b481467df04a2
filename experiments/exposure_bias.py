"""Exposure bias of trained students against their teacher: MiniLLM's ExAccErr curve, per student.

    python experiments/exposure_bias.py --teacher artifacts/reason/teacher \
        --students sft=runs/reproduce-reason/sft/seed0/hf,kd=runs/reproduce-reason/kd/seed0/hf \
        --data artifacts/reason/data/test.jsonl --template plain --max_new_tokens 48 --out experiments/results/reason

For each student, ``mgsr_lightning.evaluation.exposure_bias`` samples ``--samples`` responses per prompt
from the student and from the teacher (T = 1, full distribution), measures the student's per-step
KL(teacher ‖ student) on both, and reports ExAccErr(l) = (R(l) − l·ε(l)) / (l·ε(l)) × 100%: how much
more error the student accumulates on its own prefixes than on the teacher's. Prints a table at a few
lengths, and writes ``exposure_bias.json`` and ``exposure_bias.png`` (the curves) to ``--out``.
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
from mgsr_lightning.generation import Decoding, SamplingConfig
from mgsr_lightning.tokenizer import load_tokenizer


def prompt_batches(tokenizer, rows, template: str, batch_size: int, max_prompt_length: int):
    """Left-padded (prompt_ids, prompt_mask) batches, tokenised as in training and evaluation
    (``encode_records``: the same template handling and long-prompt policy)."""
    examples, _ = encode_records(rows, tokenizer, template=template, eos_token_id=tokenizer.eos_token_id,
                                 max_length=None, max_prompt_length=max_prompt_length, name="exposure-bias prompts")
    collate = InstructionCollator(tokenizer.pad_token_id)
    for start in range(0, len(examples), batch_size):
        batch = collate(examples[start:start + batch_size])
        yield batch["prompt_ids"], batch["prompt_mask"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--students", required=True, help="name=folder,name=folder,...")
    parser.add_argument("--data", required=True, help="JSONL with instruction/input/output rows")
    parser.add_argument("--template", default="plain")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--max_prompt_length", type=int, default=56)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--out", default="runs/exposure_bias")
    args = parser.parse_args()

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

    lengths = [l for l in (5, 10, 20, 30, 40, 48, 64) if l <= args.max_new_tokens]
    print(f"ExAccErr(l) in %, {len(rows)} prompts x {args.samples} samples per model, T = 1")
    print("| student | " + " | ".join(f"l={l}" for l in lengths) + " | R(L) | L·ε(L) |")
    print("|---|" + "---:|" * (len(lengths) + 2))
    for name, curve in curves.items():
        cells = " | ".join(f"{curve['ex_acc_err'][l - 1]:.1f}" for l in lengths)
        print(f"| {name} | {cells} | {curve['regret'][-1]:.2f} | {curve['forced_error'][-1]:.2f} |")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "exposure_bias.json").write_text(json.dumps({"prompts": len(rows), "samples": args.samples,
                                                        "curves": curves}, indent=1) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axis = plt.subplots(figsize=(6, 4))
    for name, curve in curves.items():
        axis.plot(range(1, len(curve["ex_acc_err"]) + 1), curve["ex_acc_err"], label=name)
    axis.axhline(0, color="gray", linewidth=0.5)
    axis.set_xlabel("response length l (tokens)")
    axis.set_ylabel("ExAccErr(l) (%)")
    axis.set_title("Excess accumulated error of free-running generation")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "exposure_bias.png", dpi=120)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
