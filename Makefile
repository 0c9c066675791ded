# A fresh machine needs Python 3.11+, make and git; these targets do the rest (see README.md).
#   make run        set up .venv, then execute every notebook headless (ARGS="--only 00 --smoke" to narrow)
#   make test       set up .venv, then the lint gate (ruff), then the whole test suite
#   make test-fast  the same without executing any notebook: the inner loop while editing helpers/
#   make e2e        a real browser: JupyterLab + Debian's headless Chromium run notebooks 00 and 03
#   make lint       ruff check and ruff format --check; `make format` rewrites the files
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Installed only when the venv has no torch: Colab and Kaggle bring their own, and this pin is
# the CPU build the tests run against.
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed
E2E_STAMP := $(VENV)/.e2e-installed
# leaves out the tests that read the shared notebook run, and nbval (it collects notebooks/, not tests/)
FAST_ARGS := -m "not notebooks" tests

.PHONY: setup run test test-fast e2e lint format notebooks clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else f"Python 3.11 or newer is needed (transformers 5 needs it), $(PYTHON) is {v[0]}.{v[1]}: run make PYTHON=python3.11 (or any 3.11+)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c 'import torch' 2>/dev/null || { echo "installing $(TORCH_PIN) (CPU build)"; $(PY) -m pip install -q $(TORCH_PIN); }
	$(PY) -m pip install -q -r requirements-dev.txt -e .
	@touch $@

run: setup
	$(PY) -m helpers run $(ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: setup
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

# JupyterLab and selenium (requirements-e2e.txt), and Debian's chromium (scripts/install_browser.sh:
# the tests skip, saying why, where it cannot be installed). Screenshots land in build/e2e/.
$(E2E_STAMP): $(STAMP) requirements-e2e.txt
	$(PY) -m pip install -q -r requirements-e2e.txt
	@touch $@

e2e: $(E2E_STAMP)
	@sh scripts/install_browser.sh
	$(PY) -m pytest e2e -rs $(PYTEST_ARGS)

test-fast: lint
	$(PY) -m pytest $(FAST_ARGS) $(PYTEST_ARGS)

notebooks: setup
	$(PY) -m helpers notebooks

clean:
	rm -rf build
