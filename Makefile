# The course's commands. `make help` lists them.
#
#   make lab    install everything into .venv and open the course in JupyterLab
#   make test   install everything into .venv-test and run the whole test suite
#
# Which torch gets installed:
#   make lab                 -> torch from PyPI within requirements.txt's range: a CUDA build on
#                               Linux/Windows, the MPS build on macOS
#   make lab TORCH_INDEX=https://download.pytorch.org/whl/cpu   -> a small CPU-only build
#   make lab TORCH_INDEX=https://download.pytorch.org/whl/rocm6.4 -> AMD ROCm
#   make test                -> torch==$(TEST_TORCH_VERSION), the release CI tests against

PYTHON ?= python3
VENV ?= .venv
TEST_VENV ?= .venv-test
TORCH ?= torch>=2.5,<3
TEST_TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
PORT ?= 8888
PYTEST_ARGS ?=

index_flag = $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
NB_DIRS = notebooks solutions exercises
LINT_DIRS = helpers tests tools benchmarks templates $(NB_DIRS)

.PHONY: help lab test lint format notebooks-clean exercises unit notebooks-test clean

help: ## list the commands
	@grep -E '^[a-z-]+:.*## ' Makefile | sed -E 's/:.*## /\t/' | expand -t 20

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet "$(TORCH)" $(index_flag)
	$(VENV)/bin/python -m pip install --quiet -r requirements.txt -e .
	touch $@

$(TEST_VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(TEST_VENV)
	$(TEST_VENV)/bin/python -m pip install --quiet "torch==$(TEST_TORCH_VERSION)" $(index_flag)
	$(TEST_VENV)/bin/python -m pip install --quiet -r requirements.txt -e .
	touch $@

lab: $(VENV)/.installed ## install everything into .venv, then open the course in JupyterLab
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(PORT) notebooks/01_devices.ipynb

test: $(TEST_VENV)/.installed ## install everything into .venv-test, then lint + all tests + all notebooks
	$(MAKE) --no-print-directory lint VENV=$(TEST_VENV)
	$(TEST_VENV)/bin/python tools/make_exercises.py --check
	$(TEST_VENV)/bin/python tools/clean_notebooks.py --check
	$(TEST_VENV)/bin/python -m pytest tests $(NB_DIRS) --nbval-lax --nbval-current-env \
		--nbval-cell-timeout=600 --timeout=900 -p no:cacheprovider $(PYTEST_ARGS)

lint: ## ruff on helpers, tests, tools, benchmarks and notebooks
	$(VENV)/bin/ruff check $(LINT_DIRS)
	$(VENV)/bin/ruff format --check helpers tests tools benchmarks

format: ## ruff --fix and ruff format
	$(VENV)/bin/ruff check --fix $(LINT_DIRS)
	$(VENV)/bin/ruff format helpers tests tools benchmarks

notebooks-clean: ## strip outputs and execution counts from every notebook
	$(VENV)/bin/python tools/clean_notebooks.py

exercises: ## regenerate exercises/ from solutions/
	$(VENV)/bin/python tools/make_exercises.py

clean: ## remove the virtual environments and caches
	rm -rf $(VENV) $(TEST_VENV) .pytest_cache .ruff_cache
