# A fresh machine needs Python 3.10+, make and git; these targets do the rest (see README.md).
#   make run    set up .venv, then execute every notebook headless (ARGS="--only 00 --smoke" to narrow)
#   make test   set up .venv, then run the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Installed only when the venv has no torch: Colab and Kaggle bring their own, and this pin is
# the CPU build the tests run against.
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: setup run test notebooks clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 10) else f"Python 3.10 or newer is needed, $(PYTHON) is {v[0]}.{v[1]}: run make PYTHON=python3.11 (or any 3.10+)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c 'import torch' 2>/dev/null || { echo "installing $(TORCH_PIN) (CPU build)"; $(PY) -m pip install -q $(TORCH_PIN); }
	$(PY) -m pip install -q -r requirements.txt -e .
	@touch $@

run: setup
	$(PY) -m helpers run $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

notebooks: setup
	$(PY) -m helpers notebooks

clean:
	rm -rf build
