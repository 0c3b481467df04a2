"""Every YAML under configs/ parses, and runs `fit` for 2 steps on tiny models of its pair's family."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml
from tiny_models import cli_overrides

from mgsr_lightning.cli.lightning_cli import load_config_text, run_cli
from mgsr_lightning.scrg.revise import ScrgConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PAIRS = {"tiny": "gpt2", "reason": "gpt2", "facts": "gpt2", "gpt2": "gpt2", "opt": "opt", "openllama2": "llama",
         "llama2": "llama", "smollm2": "llama"}
RUNNABLE = sorted(p for pair in PAIRS for p in (CONFIGS / pair).glob("*.yaml") if p.stem != "base")
EXPECTED_METHODS = {
    "sft", "kd", "seqkd", "rkl", "jsd", "tvd", "imitkd", "gkd", "distillm", "abkd", "minillm", "mgsr", "mgsr_paper",
    "mgsr_base", "mgsr_scrg", "mgsr_scrg_dac", "mgsr_scrg3", "mgsr_scrg5",
    "mgsr_scrg_on_policy", "mgsr_scrg_adaptive", "mgsr_scrg_mixed", "mgsr_noscrg_on_policy", "mgsr_noscrg_mixed",
    "mgsr_noscrg_adaptive",
    "teacher",
}


def config_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def test_every_pair_has_every_method():
    assert RUNNABLE, "no configs found"
    for pair in PAIRS:
        # the reason and facts benchmarks also have the SFT-initialised student every method starts from
        extra = {"base", "init"} if pair in ("reason", "facts") else {"base"}
        assert {p.stem for p in (CONFIGS / pair).glob("*.yaml")} == EXPECTED_METHODS | extra, pair


def resolved_config(path: Path) -> dict:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(buffer.getvalue())


# method -> (sft_weight, sft_on, distill loss, span weight, regime, SCRG on): what each method is
EXPECTED = {
    "teacher": (1.0, "ground_truth", None, 0.0, "ground_truth", False),
    "sft": (1.0, "ground_truth", None, 0.0, "ground_truth", False),
    "init": (1.0, "ground_truth", None, 0.0, "ground_truth", False),
    "kd": (0.0, "ground_truth", "forward_kl", 0.0, "ground_truth", False),
    "rkl": (0.0, "ground_truth", "reverse_kl", 0.0, "ground_truth", False),
    "jsd": (0.0, "ground_truth", "generalized_jsd", 0.0, "ground_truth", False),
    "tvd": (0.0, "ground_truth", "total_variation", 0.0, "ground_truth", False),
    "seqkd": (1.0, "training_sequence", None, 0.0, "teacher_generated", False),
    "imitkd": (0.0, "ground_truth", "forward_kl", 0.0, "mixed", False),
    "gkd": (0.0, "ground_truth", "generalized_jsd", 0.0, "mixed", False),
    "distillm": (0.0, "ground_truth", "skew_forward_kl", 0.0, "adaptive_off_policy", False),
    "mgsr_base": (1.0, "ground_truth", "forward_kl", 0.0, "adaptive_off_policy", False),
    "mgsr_scrg": (1.0, "ground_truth", "forward_kl", 0.0, "adaptive_off_policy", True),
    "mgsr_scrg_dac": (1.0, "ground_truth", "dac_kl", 0.0, "adaptive_off_policy", True),
    "abkd": (1.0, "ground_truth", "abkd", 0.0, "adaptive_off_policy", False),
    "minillm": (1.0, "ground_truth", None, 0.0, "on_policy", False),  # its policy-gradient term: init["minillm"]
    "mgsr": (1.0, "ground_truth", "dac_kl", 0.1, "on_policy", True),
    "mgsr_paper": (1.0, "ground_truth", "dac_kl", 1.0, "adaptive_off_policy", True),
    "mgsr_scrg3": (1.0, "ground_truth", "dac_kl", 0.1, "on_policy", True),
    "mgsr_scrg5": (1.0, "ground_truth", "dac_kl", 0.1, "on_policy", True),
    "mgsr_scrg_adaptive": (1.0, "ground_truth", "dac_kl", 0.1, "adaptive_off_policy", True),
    "mgsr_scrg_on_policy": (1.0, "ground_truth", "dac_kl", 0.1, "on_policy", True),
    "mgsr_scrg_mixed": (1.0, "ground_truth", "dac_kl", 0.1, "mixed", True),
    "mgsr_noscrg_on_policy": (1.0, "ground_truth", "dac_kl", 0.1, "on_policy", False),
    "mgsr_noscrg_mixed": (1.0, "ground_truth", "dac_kl", 0.1, "mixed", False),
    "mgsr_noscrg_adaptive": (1.0, "ground_truth", "dac_kl", 0.1, "adaptive_off_policy", False),
}
PARAMS = {"jsd": {"beta": 0.1}, "gkd": {"beta": 0.1}, "distillm": {"alpha": 0.1}, "abkd": {"alpha": 0.2, "beta": 0.7}}
PAIR_PARAMS = {
    ("openllama2", "abkd"): {"alpha": 0.1, "beta": 0.8},  # ABKD's OpenLLaMA2 setting
}
PAIR_DISTILL: dict[tuple[str, str], str] = {}  # every pair runs each method's own distillation loss
LMBDA = {"imitkd": 1.0, "gkd": 0.5, "mgsr_scrg_mixed": 0.5, "mgsr_noscrg_mixed": 0.5}
N_CORRECTIONS = {"mgsr_scrg3": 3, "mgsr_scrg5": 5}  # every other method with SCRG: 1


@pytest.mark.parametrize("path", RUNNABLE, ids=config_id)
def test_config_parses_to_its_method(path):
    config = resolved_config(path)
    init = config["model"]["init_args"]
    assert config["model"]["class_path"] == "mgsr_lightning.DistillLightningModule"
    sft_weight, sft_on, distill, span_weight, regime, scrg = EXPECTED[path.stem]
    assert init["sft_weight"] == sft_weight and init["sft_on"] == sft_on
    assert (init["distill"] or {}).get("name") == PAIR_DISTILL.get((path.parent.name, path.stem), distill)
    if distill == "dac_kl":  # the paper's forward-KL base in mgsr_paper and the ablation's row; alpha-beta in MGSR's
        paper_base = path.stem in ("mgsr_paper", "mgsr_scrg_dac")
        assert init["distill"]["params"].get("base", "forward_kl") == ("forward_kl" if paper_base else "alpha_beta")
    assert init["span"]["weight"] == span_weight
    assert init["regime"]["name"] == regime
    assert (init["scrg"] is not None) == scrg
    assert (init["teacher"] is None) == (path.stem in ("sft", "teacher", "init"))
    if path.stem in PARAMS:
        assert init["distill"]["params"] == PAIR_PARAMS.get((path.parent.name, path.stem), PARAMS[path.stem])
    if path.stem in LMBDA:
        assert init["regime"]["lmbda"] == LMBDA[path.stem]
    if scrg:
        assert init["scrg"]["n_corrections"] == N_CORRECTIONS.get(path.stem, 1)
        paper_criterion = path.stem == "mgsr_paper"
        assert init["scrg"]["criterion"] == ("max_difference" if paper_criterion else ScrgConfig.criterion)
    if distill == "dac_kl":
        assert init["distill"]["params"]["mode"] == "learned"
        assert init["distill"]["params"]["variant"] == ("paper" if path.stem == "mgsr_paper" else "rest")
        assert init["span"]["relation"] == ("product" if path.stem == "mgsr_paper" else "normalized")
    if path.parent.name not in ("tiny", "reason", "facts") and distill is not None:
        assert init["distill"]["chunk_size"] == 1024  # real vocabularies: bounded loss memory


def test_base_composition_and_interpolation(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "base.yaml").write_text("_x_: 3\na: {b: 1, c: '${_x_}'}\nd: [1, 2]\n")
    (tmp_path / "sub" / "child.yaml").write_text("_base_: ../base.yaml\n_x_: 7\na: {b: 2}\n")
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path / "sub")
    try:
        loaded = load_config_text((tmp_path / "sub" / "child.yaml").read_text())
        assert loaded == {"a": {"b": 2, "c": 7}, "d": [1, 2]}
        assert load_config_text("0.5") == 0.5
        with pytest.raises(FileNotFoundError, match="relative to the including file"):
            load_config_text("_base_: missing.yaml\n")
    finally:
        os.chdir(cwd)


# the tiny pair, each pair's MGSR, and the reason benchmark's acceptance methods
QUICK = [
    p for p in RUNNABLE
    if p.parent.name == "tiny" or p.stem == "mgsr"
    or (p.parent.name == "reason" and p.stem in ("sft", "kd", "distillm"))
]


SCRG_METRICS = {
    "scrg/corrected_fraction", "scrg/mean_error_position", "scrg/mean_regenerated_tokens", "scrg/seconds",
    "scrg/teacher_nll_before", "scrg/teacher_nll_after", "scrg/student_nll_before",
}


def run_fit(path: Path, assets, tmp_path):
    family = PAIRS[path.parent.name]
    overrides = cli_overrides(assets, family, tmp_path / "run",
                              with_teacher=path.stem not in ("sft", "teacher", "init"))
    _, _, _, _, regime, scrg = EXPECTED[path.stem]
    if regime == "adaptive_off_policy":
        # a threshold of 1 makes both steps sample (the buffer is far from full), so the student
        # rollout, SCRG and the buffer run here rather than being skipped by the regime's draw
        overrides.append("--model.init_args.regime.init_threshold=1.0")
    if regime == "mixed":
        overrides.append("--model.init_args.regime.lmbda=1.0")
    cli = run_cli(["fit", "--config", str(path), *overrides])
    assert cli.trainer.global_step == 2
    assert (tmp_path / "run" / "hf" / "config.json").is_file()
    logged = set(cli.trainer.logged_metrics)
    generates = regime in ("on_policy", "mixed", "adaptive_off_policy")
    assert ("rollout/seconds" in logged) == generates, sorted(logged)
    assert SCRG_METRICS <= logged if scrg else not (SCRG_METRICS & logged), sorted(logged)
    assert ("span/grad_ratio" in logged) == (EXPECTED[path.stem][3] > 0), sorted(logged)
    if regime == "adaptive_off_policy":
        assert cli.model.regime.metrics()["buffer_size"] == 2 * cli.datamodule.hparams.batch_size
    return cli


@pytest.mark.parametrize("path", QUICK, ids=config_id)
def test_config_fits_two_steps(path, tiny_assets, tmp_path):
    run_fit(path, tiny_assets, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in RUNNABLE if p not in QUICK], ids=config_id)
def test_config_fits_two_steps_all_pairs(path, tiny_assets, tmp_path):
    run_fit(path, tiny_assets, tmp_path)


def resolved_with(*paths: Path) -> dict:
    buffer = io.StringIO()
    args = ["fit"] + [arg for path in paths for arg in ("--config", str(path))] + ["--print_config"]
    with contextlib.redirect_stdout(buffer), pytest.raises(SystemExit):
        run_cli(args)
    return yaml.safe_load(buffer.getvalue())


@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("method", ["sft", "mgsr"])
def test_cpu_preset_turns_any_pair_into_a_cpu_run(pair, method):
    plain = resolved_with(CONFIGS / pair / f"{method}.yaml")
    config = resolved_with(CONFIGS / pair / f"{method}.yaml", CONFIGS / "common" / "cpu.yaml")
    trainer, init = config["trainer"], config["model"]["init_args"]
    placement = (trainer["accelerator"], trainer["devices"], trainer["strategy"], trainer["precision"])
    assert placement == ("cpu", 1, "auto", "32-true")
    assert config["data"]["batch_size"] == 4
    if method == "sft":
        assert init["teacher"] is None or init["teacher"]["name_or_path"] is None  # dtype only: no teacher
    else:
        assert init["teacher"]["dtype"] == "float32"
        assert init["teacher"]["name_or_path"] == plain["model"]["init_args"]["teacher"]["name_or_path"]
    assert init["regime"] == plain["model"]["init_args"]["regime"]
    assert init["distill"] == plain["model"]["init_args"]["distill"]


def test_smollm2_student_is_cut_from_the_teacher():
    init = resolved_config(CONFIGS / "smollm2" / "mgsr.yaml")["model"]["init_args"]
    assert init["student"]["name_or_path"] == init["teacher"]["name_or_path"]
    assert init["student"]["keep_layers"] == 6 and init["teacher"]["keep_layers"] is None
    adaptive = resolved_config(CONFIGS / "smollm2" / "mgsr_scrg_adaptive.yaml")["model"]["init_args"]
    assert adaptive["regime"]["init_threshold"] == 0.2  # the pair's `_adaptive_`


def test_reason_students_start_from_the_sft_initialised_student(monkeypatch, tmp_path):
    from mgsr_lightning.pipeline import steps

    trained = []
    def fake_fit(pair, method, run_dir, seed, env):
        trained.append((method, run_dir, seed))
        return run_dir / "hf"

    monkeypatch.setattr(steps, "fit", fake_fit)
    overrides = steps.initialised_student("reason", tmp_path, 1, {})
    assert trained == [("init", tmp_path / "init" / "seed1", 1)]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), pytest.raises(SystemExit):
        run_cli(["fit", "--config", str(CONFIGS / "reason" / "kd.yaml"), *overrides, "--print_config"])
    student = yaml.safe_load(buffer.getvalue())["model"]["init_args"]["student"]
    assert student["name_or_path"] == str((tmp_path / "init" / "seed1" / "hf").resolve())
    assert student["config"] is None  # the init student's weights, not a fresh model from the base config
    assert steps.initialised_student("tiny", tmp_path, 1, {}) == ()  # no init stage: from scratch


@pytest.mark.parametrize("pair", ["reason", "facts"])
def test_benchmark_students_see_a_subset_of_the_teachers_data(pair):
    teacher = resolved_config(CONFIGS / pair / "teacher.yaml")["data"]["train_data"]
    for method in ("init", "sft", "kd", "mgsr"):
        student = resolved_config(CONFIGS / pair / f"{method}.yaml")["data"]["train_data"]
        assert student.endswith("data/student_train.jsonl") and teacher.endswith("data/train.jsonl"), method
