"""Where a model puts its probability on the ground truth: mean NLL and top-1 accuracy of the
reference token, split into content tokens (a digit in the token) and the rest (words, punctuation,
EOS), on the responses of a JSONL split.

    python experiments/probes/token_classes.py --data artifacts/reason/data/validation.jsonl \
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

from mgsr_lightning.data.datamodule import encode_records
from mgsr_lightning.data.records import normalize_row, read_jsonl
from mgsr_lightning.models.tokenizer import load_tokenizer


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="JSONL with instruction/input/output rows")
    parser.add_argument("--models", nargs="+", required=True, help="folders written by save_pretrained")
    parser.add_argument("--template", default="plain")
    parser.add_argument("--rows", type=int, default=200, help="the first N rows")
    parser.add_argument("--by-family", action="store_true",
                        help="one line per task family (the rows' 'family' field) besides the total")
    return parser.parse_args(argv)


@torch.no_grad()
def token_classes(model, tokenizer, records, template: str) -> dict[str, tuple[float, float, int]]:
    """{"content"|"rest": (mean NLL, top-1 accuracy, tokens)} over the reference responses, tokenised
    as in training (``encode_records``: the template, special tokens and the EOS that ends a response)."""
    examples, _ = encode_records(records, tokenizer, template=template, eos_token_id=tokenizer.eos_token_id,
                                 max_length=None, max_prompt_length=10**9, name="token-class rows")
    totals = {"content": [0.0, 0, 0], "rest": [0.0, 0, 0]}
    for example in examples:
        prompt, response = example.prompt_ids, example.response_ids
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
        log_probs = torch.log_softmax(logits.float(), -1)
        target = torch.tensor(response)  # [R]; log_probs [R, V]
        nll = -log_probs.gather(-1, target[:, None]).squeeze(-1)
        correct = log_probs.argmax(-1) == target
        for token, token_nll, token_correct in zip(response, nll.tolist(), correct.tolist()):
            kind = "content" if any(c.isdigit() for c in tokenizer.decode([token])) else "rest"
            totals[kind][0] += token_nll
            totals[kind][1] += int(token_correct)
            totals[kind][2] += 1
    return {kind: (s / max(n, 1), c / max(n, 1), n) for kind, (s, c, n) in totals.items()}


def _with_family(row, where: str) -> dict:
    """A record as training reads it, plus the row's task family where the file names one."""
    return {**normalize_row(row, where), "family": row.get("family", "?") if isinstance(row, dict) else "?"}


def main(argv=None) -> None:
    args = parse_args(argv)
    records = read_jsonl(args.data, to_record=_with_family)[: args.rows]
    print(f"{args.data}: first {len(records)} rows; NLL in nats per reference token")
    print(f"{'model':<48}{'content NLL':>12}{'top-1':>8}{'rest NLL':>10}{'top-1':>8}{'tokens':>14}")
    for folder in args.models:
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        tokenizer = load_tokenizer(folder)
        groups = {folder[-48:]: records}
        if args.by_family:
            for record in records:
                groups.setdefault(f"  {record['family']}", []).append(record)
        for name, rows in groups.items():
            result = token_classes(model, tokenizer, rows, args.template)
            (c_nll, c_acc, c_n), (r_nll, r_acc, r_n) = result["content"], result["rest"]
            print(f"{name:<48}{c_nll:>12.3f}{c_acc:>8.3f}{r_nll:>10.3f}{r_acc:>8.3f}{f'{c_n}+{r_n}':>14}")


if __name__ == "__main__":
    main()
