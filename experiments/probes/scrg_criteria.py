"""Which SCRG correction criterion lowers the teacher's NLL of the revised rollouts most, on the tiny pair.

    python experiments/probes/scrg_criteria.py --root artifacts/tiny --student artifacts/tiny/students/sft --seed 0

For a student and a teacher sharing the tiny tokenizer, samples one rollout per validation prompt
(the first 200, seeded per row, so every criterion revises the very same rollouts), revises it with each criterion
× n_corrections and reports the teacher's mean NLL per response token before and after revision
(the quantity SCRG should lower: how far the revised sequences are from what the teacher would
write), the student's NLL before, the corrected fraction, the mean error position, the student
tokens re-generated per corrected row, and seconds. Ground-truth responses give the floor.
Results and the setup they came from: ``experiments/results/scrg/criteria.txt``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from mgsr_lightning.batch import Rollout
from mgsr_lightning.data.datamodule import InstructionDataModule
from mgsr_lightning.generation.decode import Decoding, sample
from mgsr_lightning.generation.sampling import SamplingConfig
from mgsr_lightning.generation.scoring import response_logits
from mgsr_lightning.losses import response_cross_entropy
from mgsr_lightning.scrg.revise import ScrgConfig, revise

CRITERIA = [
    ("max_difference", {}),  # the paper's reading
    ("max_teacher_nll", {}),
    ("first_unlikely", {"unlikely_below": 0.1}),
    ("first_unlikely", {"unlikely_below": 0.02}),
    ("first_unlikely", {"unlikely_below": 0.005}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="artifacts/tiny", help="folder with teacher/, tokenizer/ and data/")
    parser.add_argument("--student", required=True, help="a Hugging Face folder of a student on the same tokenizer")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--max_new_tokens", type=int, default=24)
    parser.add_argument("--corrections", type=int, nargs="+", default=[1, 3, 5])
    parser.add_argument("--seed", type=int, default=0, help="row i samples with seed i + seed × prompts")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    root = Path(args.root)

    data = InstructionDataModule(
        tokenizer=str(root / "tokenizer"), train_data=str(root / "data" / "validation.jsonl"),
        val_data=str(root / "data" / "validation.jsonl"), template="plain", max_length=72, max_prompt_length=48,
        batch_size=args.prompts, eval_batch_size=args.prompts,
    )
    data.setup("validate")
    ground_truth = Rollout.from_batch(next(iter(data.val_dataloader())))
    tokenizer = data.tokenizer
    teacher = AutoModelForCausalLM.from_pretrained(root / "teacher").eval()
    student = AutoModelForCausalLM.from_pretrained(args.student).eval()
    decoding = Decoding(SamplingConfig(max_new_tokens=args.max_new_tokens), data.eos_token_id,
                        tokenizer.pad_token_id, vocab_size=len(tokenizer), max_length=72)

    seeds = torch.arange(ground_truth.batch_size) + args.seed * ground_truth.batch_size
    with torch.no_grad():
        rollout = sample(student, ground_truth.prompt_ids, ground_truth.prompt_mask, decoding, seeds=seeds)
        gt_nll = float(response_cross_entropy(response_logits(teacher, ground_truth, len(tokenizer)), ground_truth))
    print(f"student {args.student}, teacher {root / 'teacher'}, {ground_truth.batch_size} validation prompts, "
          f"max_new_tokens {args.max_new_tokens}, seed {args.seed}, "
          f"mean rollout length {rollout.response_lengths().float().mean():.1f}")
    print(f"teacher NLL per token on the ground-truth responses: {gt_nll:.3f}\n")
    header = (f"{'criterion':<28} {'n':>2} {'T-NLL before':>12} {'T-NLL after':>11} {'S-NLL before':>12} "
              f"{'corrected':>9} {'error pos':>9} {'regen tok':>9} {'length':>6} {'seconds':>7}")
    print(header)
    print("-" * len(header))
    for criterion, options in CRITERIA:
        label = criterion + (f" (p < {options['unlikely_below']})" if options else "")
        for n_corrections in args.corrections:
            config = ScrgConfig(n_corrections=n_corrections, criterion=criterion, **options)
            started = time.perf_counter()
            result = revise(student, teacher, rollout, config, decoding, seeds=seeds)
            seconds = time.perf_counter() - started
            s = result.stats
            print(f"{label:<28} {n_corrections:>2} {s['teacher_nll_before']:>12.3f} {s['teacher_nll_after']:>11.3f} "
                  f"{s['student_nll_before']:>12.3f} {s['corrected_fraction']:>9.2f} {s['mean_error_position']:>9.2f} "
                  f"{s['mean_regenerated_tokens']:>9.2f} {result.rollout.response_lengths().float().mean():>6.1f} "
                  f"{seconds:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
