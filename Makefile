# Two commands set everything up on a fresh machine:
#   make demo   # venv + install, then the embedded default end to end (offline, CPU, < 10 min)
#   make test   # venv + install, then the fast test suite (CPU, < 10 min)
# GPU users: install your CUDA torch into .venv first and run with `make ... CONSTRAINTS=`.

PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS ?= constraints.txt
PY := $(VENV)/bin/python
PAIR ?= gpt2
SCALE ?= full
METHODS ?=
SEEDS ?=

export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-slow test-all reproduce clean

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m mgsr_lightning demo

test: install
	$(PY) -m pytest -q

test-slow: install
	$(PY) -m pytest -q -m slow

test-all: install
	$(PY) -m pytest -q -m ""

reproduce: install
	$(PY) -m mgsr_lightning reproduce --pair $(if $(filter tiny,$(SCALE)),tiny,$(PAIR)) \
		$(if $(METHODS),--methods $(METHODS)) $(if $(SEEDS),--train_seeds $(SEEDS))

clean:
	rm -rf runs artifacts/tiny/students
