"""models/loading.py: students cut from a teacher's layers (keep_layers) and LoRA students (merged on export)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_model, cli_overrides, last_checkpoint

from mgsr_lightning.errors import ConfigError
from mgsr_lightning.models.loading import LoraSettings, ModelSource, kept_layer_indices, load_causal_lm

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_kept_layers_are_evenly_spaced_from_first_to_last():
    assert kept_layer_indices(30, 6) == [0, 6, 12, 17, 23, 29]
    assert kept_layer_indices(30, 4) == [0, 10, 19, 29]
    assert kept_layer_indices(12, 6) == [0, 2, 4, 7, 9, 11]
    assert kept_layer_indices(5, 1) == [0]
    assert kept_layer_indices(5, 5) == [0, 1, 2, 3, 4]
    assert kept_layer_indices(5, [1, 3]) == [1, 3]
    for bad in (0, 6, [3, 1], [], [0, 5], [2, 2]):
        with pytest.raises(ConfigError, match="keep_layers"):
            kept_layer_indices(5, bad)


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt"])
def test_cut_student_keeps_the_chosen_layers_and_saves_as_a_smaller_model(family, tmp_path):
    from transformers import AutoModelForCausalLM

    build_tiny_model(family, 300, seed=1, n_layer=5, hidden=32).save_pretrained(tmp_path / "teacher")
    teacher = AutoModelForCausalLM.from_pretrained(tmp_path / "teacher")
    student = load_causal_lm(ModelSource(name_or_path=str(tmp_path / "teacher"), keep_layers=[0, 2, 4])).eval()
    assert student.config.num_hidden_layers == 3
    source_state, kept_state = teacher.state_dict(), student.state_dict()
    assert len(kept_state) < len(source_state)
    for new, old in enumerate([0, 2, 4]):  # every parameter of kept layer `old` is now layer `new`'s
        names = [name for name in source_state
                 if f".{old}." in name and name.split(f".{old}.")[0].endswith(("layers", "h"))]
        assert names
        for name in names:
            torch.testing.assert_close(kept_state[name.replace(f".{old}.", f".{new}.", 1)], source_state[name])
    for name in kept_state:
        if ".layers." not in name and ".h." not in name:  # embeddings, final norm, head: whole
            torch.testing.assert_close(kept_state[name], source_state[name])
    # the cut model generates with a KV cache (layer indices renumbered) and reloads as a 3-layer model
    ids = torch.randint(2, 300, (1, 6))
    cached = student.generate(ids, max_new_tokens=5, do_sample=False, use_cache=True, pad_token_id=1)
    uncached = student.generate(ids, max_new_tokens=5, do_sample=False, use_cache=False, pad_token_id=1)
    assert torch.equal(cached, uncached)
    student.save_pretrained(tmp_path / "student")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "student").eval()
    assert reloaded.config.num_hidden_layers == 3
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, student(ids).logits)


def test_lora_student_trains_only_its_adapters():
    pytest.importorskip("peft", reason="LoRA students need the `lora` extra (pip install '.[lora]')")
    model = load_causal_lm(ModelSource(config={"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                               "num_hidden_layers": 2, "num_attention_heads": 2,
                                               "num_key_value_heads": 1},
                                       lora=LoraSettings(r=4, alpha=8, targets=["q_proj", "v_proj"])), vocab_size=300)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert {name.split(".")[-4] for name in trainable} == {"q_proj", "v_proj"}
    with pytest.raises(ConfigError, match="lora.r"):
        LoraSettings(r=0)


def test_lora_student_fits_and_exports_merged(tiny_assets, tmp_path):
    """A LoRA student of the tiny pair: 2 steps of KD change only the adapters; the export is a plain
    model (no peft needed to load it) whose logits equal the trained adapted model's."""
    pytest.importorskip("peft", reason="LoRA students need the `lora` extra (pip install '.[lora]')")
    from transformers import AutoModelForCausalLM, pipeline

    from mgsr_lightning.cli.lightning_cli import run_cli

    overrides = cli_overrides(tiny_assets, "llama", tmp_path / "run")
    cli = run_cli(["fit", "--config", str(CONFIGS / "tiny" / "kd.yaml"), *overrides,
                   "--model.init_args.optimizer.lr=0.05",
                   '--model.init_args.student.lora={"r": 4, "alpha": 8, "dropout": 0.0}'])
    student = cli.model.student.eval()
    assert hasattr(student, "merge_and_unload")
    base = AutoModelForCausalLM.from_pretrained(tiny_assets["models"]["llama"]["student"]).eval()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf").eval()
    assert not any("lora" in name for name in exported.state_dict())
    ids = torch.randint(2, cli.model.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, student(ids).logits, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(exported(ids).logits, base(ids).logits, atol=1e-4)  # the adapters trained
    frozen = {name.removeprefix("base_model.model.").replace(".base_layer.", "."): value
              for name, value in student.named_parameters() if not value.requires_grad}
    assert frozen.keys() == dict(base.named_parameters()).keys()
    for name, value in base.named_parameters():  # the base weights did not move
        torch.testing.assert_close(frozen[name], value, rtol=0, atol=0)
    from mgsr_lightning.pipeline.commands import export

    export(last_checkpoint(cli.trainer), str(tmp_path / "from_checkpoint"))  # the student rebuilt with its adapters
    from_checkpoint = AutoModelForCausalLM.from_pretrained(tmp_path / "from_checkpoint").eval()
    with torch.no_grad():
        torch.testing.assert_close(from_checkpoint(ids).logits, student(ids).logits, rtol=1e-4, atol=1e-5)
    generator = pipeline("text-generation", model=str(tmp_path / "run" / "hf"), device="cpu")
    generated = generator("Add 3 and 4.\n", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert generated.startswith("Add 3 and 4.\n")
