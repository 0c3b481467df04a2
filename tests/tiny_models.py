"""Tiny real architectures and CLI overrides shared by the tests (plain functions; fixtures are in conftest.py)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, OPTConfig


def tiny_config(family: str, vocab_size: int, n_layer: int = 2, hidden: int = 32, max_positions: int = 128):
    """A tiny config of a real architecture family (``gpt2``, ``opt`` or ``llama``)."""
    if family == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size, n_positions=max_positions, n_embd=hidden, n_layer=n_layer, n_head=2,
            bos_token_id=0, eos_token_id=0, pad_token_id=1,
        )
    if family == "opt":
        return OPTConfig(
            vocab_size=vocab_size, max_position_embeddings=max_positions, hidden_size=hidden,
            num_hidden_layers=n_layer, num_attention_heads=2, ffn_dim=2 * hidden, word_embed_proj_dim=hidden,
            bos_token_id=0, eos_token_id=0, pad_token_id=1,
        )
    if family == "llama":
        return LlamaConfig(
            vocab_size=vocab_size, max_position_embeddings=max_positions, hidden_size=hidden,
            intermediate_size=2 * hidden, num_hidden_layers=n_layer, num_attention_heads=2, num_key_value_heads=1,
            bos_token_id=0, eos_token_id=0, pad_token_id=1, tie_word_embeddings=False,
        )
    raise ValueError(f"unknown family {family!r}")


def build_tiny_model(family: str, vocab_size: int, seed: int = 0, **kwargs):
    """A randomly initialised tiny causal LM in eval mode, deterministic for a given seed."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, vocab_size, **kwargs))
    return model.eval()


def last_checkpoint(trainer) -> str:
    """Path of the latest-state checkpoint (the configs' second ModelCheckpoint keeps ``last.ckpt``)."""
    return next(cb.last_model_path for cb in trainer.checkpoint_callbacks if cb.save_last)


def cli_overrides(assets, family: str = "gpt2", run_dir=None, with_teacher: bool = True) -> list[str]:
    """Command-line overrides that point any config at ``tiny_assets`` and a CPU, for 2 quick steps."""
    data = assets["data"]
    models = assets["models"][family]
    args = [f'--model.init_args.student={{"name_or_path": "{models["student"]}", "config": null, "keep_layers": null}}']
    if with_teacher:
        args.append(f'--model.init_args.teacher={{"name_or_path": "{models["teacher"]}", "dtype": "float32"}}')
    args += [
        "--model.init_args.sampling.max_new_tokens=12",
        "--model.init_args.validation.rouge_examples=4",
        "--model.init_args.validation.max_new_tokens=8",
        f"--data.tokenizer={assets['tokenizer']}",
        f"--data.train_data={data / 'train.jsonl'}",
        f"--data.val_data={data / 'validation.jsonl'}",
        f"--data.test_data={data / 'test.jsonl'}",
        "--data.template=plain",
        "--data.max_length=80",
        "--data.max_prompt_length=56",
        "--data.batch_size=4",
        "--data.eval_batch_size=8",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.strategy=auto",
        "--trainer.precision=32-true",
        "--trainer.max_steps=2",
        "--trainer.max_epochs=1",
        "--trainer.val_check_interval=2",
        "--trainer.check_val_every_n_epoch=null",
        "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.log_every_n_steps=1",
        # the configs' two checkpoints (best by validation ROUGE-L; latest, for resuming) at this scale
        '--trainer.callbacks=[{"class_path": "mgsr_lightning.training.resume.CheckpointAfterValidation", "init_args": '
        '{"monitor": "val/rougeL", "mode": "max", "save_top_k": 1, "filename": "best-{step}"}}, '
        '{"class_path": "mgsr_lightning.training.resume.CheckpointAfterValidation", "init_args": '
        '{"every_n_train_steps": 2, "save_top_k": 1, "save_last": true, "filename": "latest-{step}"}}]',
    ]
    if run_dir is not None:
        args += [
            f"--trainer.default_root_dir={run_dir}",
            f"--trainer.logger.init_args.save_dir={run_dir}",
            f"--model.init_args.export_dir={run_dir}/hf",
            f"--model.init_args.regime.cache_path={run_dir}/teacher_responses.pt",
        ]
    return args
