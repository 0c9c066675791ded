# A fresh machine needs Python 3.11+, make and git; these targets do the rest (see README.md).
#   make run        set up .venv, then execute every notebook headless (ARGS="--only 00 --smoke" to narrow)
#   make test       set up .venv, then the lint gate (ruff), then the whole test suite
#   make test-fast  the same without the notebook runs and the slow tier (under 90 s): the inner loop
#   make e2e        a real browser: JupyterLab + Debian's headless Chromium run notebooks 00, 01 and 03
#   make lint       ruff check and ruff format --check; `make format` rewrites the files
#   make test-runtimes  the unit tests and every notebook on Colab's Python 3.13 and Kaggle's 3.12, each
#                   with that runtime's torch and libraries (noxfile.py; venvs cached outside the clone)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Installed only when the venv has no torch: Colab and Kaggle bring their own, and this pin is
# the CPU build the tests run against.
TORCH_PIN := torch==2.13.0
# uv installs the pinned libraries: the same versions pip resolves (the freezes match), in 4 s
# where pip took 30 (unpacking and resolving on one core). torch stays with pip, which finds the
# CPU build on disk where a machine has one (uv would download a CUDA build of several GB).
UV_PIN := uv==0.13.9
# Nothing is byte-compiled at install (pip's pass took 41 s on one core, for 16,000 files of which the suite
# imports a fraction): a process compiles a module the first time it imports it and writes the bytecode for
# the next. So the recipes write bytecode even where the caller's environment says not to
# (PYTHONDONTWRITEBYTECODE, set on this CI's machines): every process would compile torch again (importing
# torch, transformers and peft: 13.7 s without bytecode, 5.3 s with). pytest run by hand does the same (the
# repository's conftest.py). Importing them once at setup instead took 15 s, mostly on one core, and saved
# about as much in pytest: fresh clones' `make test` took 6 min 6 s twice with it, 5 min 47 s and 6 min 9 s
# without.
unexport PYTHONDONTWRITEBYTECODE
STAMP := $(VENV)/.installed
E2E_STAMP := $(VENV)/.e2e-installed
# leaves out the tests that read the shared notebook runs (tests/conftest.py) and the slow tier (pytest.mark.slow)
FAST_ARGS := -m "not notebooks and not slow" tests

.PHONY: setup run test test-fast test-runtimes e2e lint format notebooks clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else f"Python 3.11 or newer is needed (transformers 5 needs it), $(PYTHON) is {v[0]}.{v[1]}: run make PYTHON=python3.11 (or any 3.11+)")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c 'import torch' 2>/dev/null || { echo "installing $(TORCH_PIN) (CPU build)"; $(PY) -m pip install -q --no-compile $(TORCH_PIN); }
	@$(PY) -m pip install -q --no-compile $(UV_PIN)
	$(PY) -m uv pip install --python $(PY) -q -r requirements-dev.txt -e .
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
	$(PY) -m uv pip install --python $(PY) -q -r requirements-e2e.txt
	@touch $@

e2e: $(E2E_STAMP)
	@sh scripts/install_browser.sh
	$(PY) -m pytest e2e -rs $(PYTEST_ARGS)

test-fast: lint
	$(PY) -m pytest $(FAST_ARGS) $(PYTEST_ARGS)

# The Pythons come from PATH or pyenv's builds (nox finds both); say how to get a missing one first.
test-runtimes: setup
	@for v in 3.12 3.13; do \
	  { command -v python$$v >/dev/null && python$$v -c pass 2>/dev/null; } || ls $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v >/dev/null 2>&1 || \
	  { echo "Python $$v is missing: install it (pyenv install $$v, or your system's python$$v package), then run make test-runtimes again"; exit 1; }; \
	done
	$(PY) -m nox $(NOX_ARGS)

notebooks: setup
	$(PY) -m helpers notebooks

clean:
	rm -rf build
