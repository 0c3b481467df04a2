"""A tiny cross-tokenizer pair for trying ``gold.py`` end to end in a minute or two (not a result).

    python experiments/cross_tokenizer/gold_smoke.py --work runs/gold_smoke            # builds, then runs gold.py
    python experiments/cross_tokenizer/gold_smoke.py --work runs/gold_smoke --build-only

Under ``--work``: ``data/`` (facts rows: 300 train, 16 validation, 16 test), a GPT-2 student (1 layer, d=32)
with a byte-level BPE of 300 tokens learnt from the rows as the ``plain`` template renders them, and a LLaMA
teacher (1 layer, d=48) with a byte-level BPE of 420 tokens learnt from their Alpaca rendering (so other merges
and ids, and tokens each side lacks), both from configs, untrained. Then
``gold.py`` trains 4 GOLD steps of 4 rows (1 untimed) and scores 8 test rows with sampling seeds 10 and 20.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(work: Path) -> dict[str, Path]:
    """The pair's folders (built once; an existing ``work`` is reused)."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    from mgsr_lightning.data.records import read_jsonl
    from mgsr_lightning.data.tasks.knowledge import write_facts_dataset
    from mgsr_lightning.data.templates import render_prompt
    from mgsr_lightning.models.tokenizer import train_bpe_tokenizer

    folders = {"data": work / "data", "student": work / "student", "teacher": work / "teacher"}
    if all((folder / "config.json").is_file() for name, folder in folders.items() if name != "data"):
        return folders
    write_facts_dataset(folders["data"], {"train": 300, "validation": 16, "test": 16}, seed=0)
    rows = read_jsonl(folders["data"] / "train.jsonl")
    texts = [render_prompt(row, "plain") + row["output"] for row in rows]
    alpaca = [render_prompt(row, "alpaca") + row["output"] for row in rows]
    sides = {"student": (texts, 300, lambda v: GPT2Config(vocab_size=v, n_positions=160, n_embd=32, n_layer=1,
                                                          n_head=2, bos_token_id=0, eos_token_id=0, pad_token_id=1)),
             "teacher": (alpaca, 420, lambda v: LlamaConfig(
                 vocab_size=v, max_position_embeddings=160, hidden_size=48, intermediate_size=96, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, bos_token_id=0, eos_token_id=0, pad_token_id=1))}
    for seed, (side, (corpus, size, config)) in enumerate(sides.items()):
        tokenizer = train_bpe_tokenizer(corpus, vocab_size=size, save_dir=folders[side])
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(config(len(tokenizer))).save_pretrained(folders[side])
    return folders


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="runs/gold_smoke")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--trl-python", default=None, help="passed to gold.py (default: its own)")
    args = parser.parse_args(argv)
    folders = build(Path(args.work))
    if args.build_only:
        return
    command = [sys.executable, str(HERE / "gold.py"), "--teacher", str(folders["teacher"]),
               "--student", str(folders["student"]), "--data", str(folders["data"]), "--steps", "4",
               "--batch-size", "4", "--warmup", "1", "--out", str(Path(args.work) / "gold"), "--seeds", "10,20",
               "--max-eval-examples", "8", "--eval-batch-size", "8", "--max-new-tokens", "16", "--threads", "1"]
    if args.trl_python:
        command += ["--trl-python", args.trl_python]
    raise SystemExit(subprocess.run(command).returncode)


if __name__ == "__main__":
    main()
