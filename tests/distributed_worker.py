"""One rank of the 2-process CPU (gloo) checks in test_distributed.py: sample and revise with
``synced=True`` on this rank's own prompts, then save what came out."""

from pathlib import Path

import torch
import torch.distributed as dist
from tiny_models import build_tiny_model

from mgsr_lightning.batch import Rollout
from mgsr_lightning.generation.decode import Decoding, sample
from mgsr_lightning.generation.sampling import SamplingConfig
from mgsr_lightning.scrg.revise import ScrgConfig, revise

VOCAB, EOS, PAD = 40, 0, 1
# Rank 0 has short prompts and a tight length cap, rank 1 long ones: they finish at different steps.
PROMPTS = {0: [[5, 6], [7]], 1: [[8, 9, 10, 11], [12, 13, 14], [15]]}
MAX_LENGTH = {0: 6, 1: 20}
SAMPLING = SamplingConfig(max_new_tokens=12)


def models():
    student = build_tiny_model("gpt2", VOCAB, seed=3, n_layer=1, hidden=16)
    teacher = build_tiny_model("gpt2", VOCAB, seed=4, n_layer=1, hidden=16)
    with torch.no_grad():  # sharper distributions, so rollouts and corrections vary
        for model in (student, teacher):
            model.lm_head.weight.mul_(8)
    return student, teacher


def run(rank: int, synced: bool) -> dict:
    student, teacher = models()
    prompts = Rollout.from_token_lists(PROMPTS[rank], [[] for _ in PROMPTS[rank]], pad_token_id=PAD)
    seeds = torch.arange(len(PROMPTS[rank])) + 100 * rank
    decoding = Decoding(SAMPLING, eos_token_id=EOS, pad_token_id=PAD, max_length=MAX_LENGTH[rank], synced=synced)
    rollout = sample(student, prompts.prompt_ids, prompts.prompt_mask, decoding, seeds=seeds)
    revised = revise(student, teacher, rollout, ScrgConfig(n_corrections=2), decoding, seeds=seeds)
    return {"rollout": rollout.to_token_lists()[1], "revised": revised.rollout.to_token_lists()[1]}


def run_rank(rank: int, world_size: int, port: int, output_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        torch.save(run(rank, synced=True), Path(output_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
