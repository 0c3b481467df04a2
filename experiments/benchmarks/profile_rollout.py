"""Where a rollout and an SCRG revision spend their time: wall clock and torch.profiler's top operators.

    python experiments/benchmarks/profile_rollout.py --work runs/bench_vs_trl_pretrain200            # timings only
    python experiments/benchmarks/profile_rollout.py --work runs/bench_vs_trl_pretrain200 --profile  # + operator tables

Uses the models, tokenizer and prompts ``experiments/benchmarks/bench_vs_trl.py`` prepared under ``--work``:
8 prompts, 64 new tokens sampled by the student, one SCRG correction (the library default; and once
more with ``reuse_teacher_cache=False``), and one teacher forward over the rollout for scale. Medians
of 5 calls after a warm-up, torch threads 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from mgsr_lightning.batch import Rollout
from mgsr_lightning.generation.decode import Decoding, sample
from mgsr_lightning.generation.sampling import SamplingConfig
from mgsr_lightning.generation.scoring import response_logits
from mgsr_lightning.scrg.revise import ScrgConfig, revise
from mgsr_lightning.seeding import rollout_seeds


def median_seconds(call, repeats: int = 5):
    result = call()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    examples = json.loads(open(f"{args.work}/data.json").read())[:8]
    prompts = Rollout.from_token_lists([e["prompt"] for e in examples], [e["response"] for e in examples],
                                       pad_token_id=1)
    student = AutoModelForCausalLM.from_pretrained(f"{args.work}/student").eval()
    teacher = AutoModelForCausalLM.from_pretrained(f"{args.work}/teacher").eval()
    decoding = Decoding(SamplingConfig(max_new_tokens=64), eos_token_id=0, pad_token_id=1, vocab_size=4096,
                        max_length=96)
    seeds = rollout_seeds(0, 0, 8)
    sample_seconds, rollout = median_seconds(
        lambda: sample(student, prompts.prompt_ids, prompts.prompt_mask, decoding, seeds=seeds))
    revise_seconds, result = median_seconds(
        lambda: revise(student, teacher, rollout, ScrgConfig(), decoding, seeds=seeds))
    full_rescore_seconds, _ = median_seconds(
        lambda: revise(student, teacher, rollout, ScrgConfig(reuse_teacher_cache=False), decoding, seeds=seeds))
    teacher_seconds, _ = median_seconds(lambda: response_logits(teacher, rollout, 4096))
    print(f"sample {sample_seconds:.3f} s ({float(rollout.response_mask.sum(-1).float().mean()):.1f} tokens per row), "
          f"SCRG revise {revise_seconds:.3f} s (with a full final teacher forward instead of the cached prefix: "
          f"{full_rescore_seconds:.3f} s), one teacher forward {teacher_seconds:.3f} s")
    print("SCRG:", {k: round(v, 3) for k, v in result.stats.items()})
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name, call in (
            ("sample", lambda: sample(student, prompts.prompt_ids, prompts.prompt_mask, decoding, seeds=seeds)),
            ("revise", lambda: revise(student, teacher, rollout, ScrgConfig(), decoding, seeds=seeds)),
        ):
            with profile(activities=[ProfilerActivity.CPU]) as profiler:
                call()
            print(f"\n{name}:")
            print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
