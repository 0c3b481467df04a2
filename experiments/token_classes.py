"""Where a model puts its probability on the ground truth: mean NLL and top-1 accuracy of the
reference token, split into content tokens (a digit in the token) and the rest (words, punctuation,
EOS), on the responses of a JSONL split.

    python experiments/token_classes.py --data artifacts/reason/data/validation.jsonl \
        --models artifacts/reason/teacher <sft student>/hf <kd student>/hf

On the reason benchmark the content tokens are the numbers each step computes (one right value), and
the rest is mostly the phrasing (several right choices, drawn at random in the references). A
teacher that is less sure of the numbers than the reference passes that doubt on to a student
trained on its distribution; a one-hot reference does not.
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM

from mgsr_lightning.data.records import read_jsonl
from mgsr_lightning.data.templates import render_prompt
from mgsr_lightning.tokenizer import load_tokenizer


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="JSONL with instruction/input/output rows")
    parser.add_argument("--models", nargs="+", required=True, help="folders written by save_pretrained")
    parser.add_argument("--template", default="plain")
    parser.add_argument("--rows", type=int, default=200, help="the first N rows")
    return parser.parse_args(argv)


@torch.no_grad()
def token_classes(model, tokenizer, records, template: str) -> dict[str, tuple[float, float, int]]:
    """{"content"|"rest": (mean NLL, top-1 accuracy, tokens)} over the reference responses."""
    totals = {"content": [0.0, 0, 0], "rest": [0.0, 0, 0]}
    for record in records:
        prompt = tokenizer(render_prompt(record, template, tokenizer))["input_ids"]
        response = tokenizer(record["output"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor([prompt + response])
        log_probs = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1)  # [R, V]
        target = torch.tensor(response)
        nll = -log_probs.gather(-1, target[:, None]).squeeze(-1)
        correct = log_probs.argmax(-1) == target
        for position, token in enumerate(response):
            kind = "content" if any(c.isdigit() for c in tokenizer.decode([token])) else "rest"
            totals[kind][0] += nll[position].item()
            totals[kind][1] += int(correct[position])
            totals[kind][2] += 1
    return {kind: (s / max(n, 1), c / max(n, 1), n) for kind, (s, c, n) in totals.items()}


def main(argv=None) -> None:
    args = parse_args(argv)
    records = read_jsonl(args.data)[: args.rows]
    print(f"{args.data}: first {len(records)} rows; NLL in nats per reference token")
    print(f"{'model':<48}{'content NLL':>12}{'top-1':>8}{'rest NLL':>10}{'top-1':>8}{'tokens':>14}")
    for folder in args.models:
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        result = token_classes(model, load_tokenizer(folder), records, args.template)
        (c_nll, c_acc, c_n), (r_nll, r_acc, r_n) = result["content"], result["rest"]
        print(f"{folder[-48:]:<48}{c_nll:>12.3f}{c_acc:>8.3f}{r_nll:>10.3f}{r_acc:>8.3f}{f'{c_n}+{r_n}':>14}")


if __name__ == "__main__":
    main()
