"""Our decode loop against transformers' ``generate``: tokens/s of the same sampling on the same models.

    python experiments/benchmarks/bench_decode.py --work runs/bench_vs_trl_pretrain200  # bench_vs_trl.py prepared it
    python experiments/benchmarks/bench_decode.py --work ... --compile                   # + the compiled one-token step
    python experiments/benchmarks/bench_decode.py --skip_tiny    # only SmolLM2 (no bench_vs_trl.py folder needed)

For each model of the pair ``bench_vs_trl.py`` trains (student: GPT-2 2 layers d=128; teacher: 4
layers d=256; V = 4,096; prompts: its first training rows) and, when prepared, SmolLM2-135M-Instruct
(prompts: the first test rows of ``prepare-smollm2``'s task in its chat template, padded with
``<|im_end|>``): left-padded prompts (batch ``--batch_size``), T = 1 with no top-k/top-p, exactly
``--new_tokens`` tokens per row (no EOS stop on either side, so both do the same work), seed 0. Rows:
ours with the preallocated (static) cache and with a growing (dynamic) one, ``--compile`` ours compiled;
``generate`` with its default dynamic cache and with ``cache_implementation="static"``. Each is timed
``--repeats`` times after one warm-up call, alternating, in this process; cells are the median tokens/s
(batch × new tokens / seconds) and [min-max]. Our rows draw from per-row counter streams, ``generate``
from the global RNG: same distribution, other tokens.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mgsr_lightning.batch import Rollout  # noqa: E402
from mgsr_lightning.generation.decode import Decoding, sample  # noqa: E402
from mgsr_lightning.generation.sampling import DecodingConfig, SamplingConfig  # noqa: E402


def prompts(work: Path, batch_size: int) -> Rollout:
    examples = json.loads((work / "data.json").read_text())[:batch_size]
    return Rollout.from_token_lists([e["prompt"] for e in examples], [[] for _ in examples], pad_token_id=1)


def smollm2_prompts(root: Path, batch_size: int) -> tuple[Rollout, int]:
    """The first test rows of the SmolLM2 task rendered in the chat template, as the pair's configs encode
    them (no extra special tokens), and the pad id (``<|im_end|>``)."""
    from transformers import AutoTokenizer

    from mgsr_lightning.data.templates import render_prompt

    tokenizer = AutoTokenizer.from_pretrained(str(root / "teacher"))
    with open(root / "data" / "test.jsonl") as rows:
        records = [json.loads(line) for line, _ in zip(rows, range(batch_size))]
    texts = [render_prompt(record, "chat", tokenizer) for record in records]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return Rollout.from_token_lists(ids, [[] for _ in ids], pad_token_id=tokenizer.pad_token_id), tokenizer.pad_token_id


def runners(model, batch: Rollout, new_tokens: int, vocab_size: int, pad_id: int, compiled: bool) -> dict:
    """name -> a call that samples ``new_tokens`` per row of ``batch`` with ``model``."""
    sampling = SamplingConfig(max_new_tokens=new_tokens)
    seeds = torch.arange(batch.batch_size)
    # an EOS id past the vocabulary cut: never sampled, so every row decodes new_tokens tokens
    loops = {"ours, static cache": DecodingConfig(static_cache=True), "ours, dynamic cache": DecodingConfig()}
    if compiled:
        loops["ours, static cache, compiled"] = DecodingConfig(static_cache=True, compile=True)
    calls = {name: (lambda loop=loop: sample(model, batch.prompt_ids, batch.prompt_mask,
                                             Decoding(sampling, vocab_size, pad_id, vocab_size, loop=loop),
                                             seeds=seeds))
             for name, loop in loops.items()}
    common = dict(input_ids=batch.prompt_ids, attention_mask=batch.prompt_mask.long(), do_sample=True, temperature=1.0,
                  top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None,
                  pad_token_id=pad_id)

    def generate(**extra):
        torch.manual_seed(0)
        with torch.no_grad():
            return model.generate(**common, **extra)

    calls["generate, dynamic cache"] = generate
    calls["generate, static cache"] = lambda: generate(cache_implementation="static")
    return calls


def bench_model(label: str, model, batch: Rollout, args, vocab_size: int, pad_id: int) -> list[str]:
    model.eval()
    calls = runners(model, batch, args.new_tokens, vocab_size, pad_id, args.compile)
    for call in calls.values():
        call()  # warm-up (and compilation)
    seconds = {name: [] for name in calls}
    for repeat in range(args.repeats):
        for name in (list(calls) if repeat % 2 == 0 else list(calls)[::-1]):
            started = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - started)
    tokens = batch.batch_size * args.new_tokens
    rates = {name: [tokens / s for s in values] for name, values in seconds.items()}
    reference = statistics.median(rates["generate, static cache"])
    lines = []
    for name, values in rates.items():
        median = statistics.median(values)
        lines.append(f"| {label} | {name} | {median:,.0f} [{min(values):,.0f}–{max(values):,.0f}] "
                     f"| {median / reference:.2f}× |")
    return lines


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="runs/bench_vs_trl_pretrain200", help="bench_vs_trl.py's prepared folder")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="also time our loop with the compiled one-token step")
    parser.add_argument("--smollm2", default="artifacts/smollm2", help="prepare-smollm2's folder (teacher/, data/)")
    parser.add_argument("--skip_tiny", action="store_true", help="only the SmolLM2 rows: no --work folder needed")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    lines = [f"Decode speed, batch {args.batch_size}, {args.new_tokens} new tokens per row, T = 1, fp32 CPU, "
             f"torch threads {torch.get_num_threads()}; median [min–max] tokens/s over {args.repeats} alternating "
             "repeats; last column: against generate with its static cache.", "",
             "| Model | Decoder | tokens/s | vs generate (static) |", "|---|---|---|---|"]
    if not args.skip_tiny:
        work = Path(args.work)
        batch = prompts(work, args.batch_size)
        for role in ("student", "teacher"):
            model = AutoModelForCausalLM.from_pretrained(str(work / role))
            lines += bench_model(f"tiny {role}", model, batch, args, vocab_size=4096, pad_id=1)
    notes = []
    smollm2 = Path(args.smollm2) / "teacher"
    missing = ("the gguf package is not installed (make install-smollm2)" if importlib.util.find_spec("gguf") is None
               else None if (smollm2 / "config.json").is_file() else f"{smollm2} is not prepared")
    if missing:
        notes.append(f"SmolLM2 pair skipped: {missing} (python -m mgsr_lightning prepare-smollm2 prepares it).")
    else:
        model = AutoModelForCausalLM.from_pretrained(str(smollm2))
        batch, pad_id = smollm2_prompts(Path(args.smollm2), args.batch_size)
        lines += bench_model("SmolLM2 teacher", model, batch, args, model.config.vocab_size, pad_id)
    text = lines + ([""] + notes if notes else [])
    print("\n".join(text))
    return text


if __name__ == "__main__":
    main()
