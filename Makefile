# The course's commands. `make help` lists them.
#
#   make lab    install everything into .venv and open the course in JupyterLab
#   make test   install everything into .venv-test and run the whole test suite
#               (installs Debian's Chromium for the browser tests where it can)
#   make test-widgets7   the notebook suite again with ipywidgets 7.7.1, Colab's (CI runs it)
#   make instructor      run every chapter here; executed copies + HTML in executed/
#   make gpu-check       notebooks + CUDA unit tests + NCCL in parallel streams, then the headline
#                        benchmarks alone, with $(PYTHON)'s own packages; gpu-check/summary.md
#   make gpu-plan        the GPU check's schedule and expected times on one H100 (runs nothing)
#   make test-torch-newest / test-torch-oldest   every notebook with the newest torch release
#                        and with the oldest one requirements.txt allows (CI runs both)
#   make set-repo REPO=https://github.com/ORG/NAME BRANCH=main   teach from your fork: every
#                        Colab badge, setup cell and link points at it (tools/set_repo.py);
#                        MIRROR=https://gitee.com/ORG/NAME: where the setup cell installs from
#                        when GitHub is out of reach
#   make lab-zh          the course in Simplified Chinese (zh/), in JupyterLab in Chinese
#   make translate       update the Chinese catalogs (i18n/zh_CN/) from the English notebooks
#                        and helpers, then write zh/ and the compiled helpers catalog
#
# Which torch gets installed:
#   make lab                 -> torch from PyPI within requirements.txt's range: a CUDA build on
#                               Linux/Windows, the MPS build on macOS
#   make lab TORCH_INDEX=https://download.pytorch.org/whl/cpu   -> a small CPU-only build
#   make lab TORCH_INDEX=https://download.pytorch.org/whl/rocm6.4 -> AMD ROCm
#   make test                -> torch==$(TEST_TORCH_VERSION), the release CI tests against
#   make test-torch-newest   -> the newest torch release in requirements.txt's range, what a
#                               learner's `make lab` gets (read with no pip config file, so a
#                               machine-wide pip constraint cannot hold it back)
#   make test-torch-oldest   -> torch==$(TORCH_OLDEST_VERSION), requirements.txt's floor

PYTHON ?= python3
VENV ?= .venv
TEST_VENV ?= .venv-test
TORCH ?= torch>=2.5,<3
TEST_TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
PORT ?= 8888
PYTEST_ARGS ?=
# ipywidgets 7.7.1 is what Colab ships. JupyterLab renders 7.x widgets only with the 7.x front
# end (jupyterlab_widgets 1.x; 3.x shows "Failed to load model class"), so that lane pins both.
W7_VENV ?= .venv-widgets7
W7_PINS = "ipywidgets==7.7.1" "jupyterlab_widgets>=1.1,<2" "widgetsnbextension>=3.6,<4"
# The unit tests that touch widgets: files found by grep, then test functions picked by
# tools/widget_tests_only.py, so new chapters' widget tests join by themselves.
W7_UNIT_TESTS = $(filter-out tests/test_colab_compat.py,$(shell grep -lE 'ipywidgets|interactive_plot|run_button' tests/test_*.py))
# The notebooks that use widgets (chapters 1-7 today; no solution or exercise has one):
# the ipywidgets-7 lane runs these, so a notebook that gains a widget joins by itself.
W7_NOTEBOOKS = $(shell grep -lE 'ipywidgets|interactive_plot|run_button|widgets\.' $(addsuffix /*.ipynb,$(NB_DIRS)))
# In the ipywidgets-7 lane the browser runs the widget self-test notebook only.
W7_BROWSER_ARGS ?= -k selftest
RUN_ALL_ARGS ?=
# The torch lanes: every notebook (chapters, solutions, exercises) with the newest torch release
# and with the oldest that requirements.txt allows, each in its own venv. Only notebooks: the
# linter, unit tests and browser tests already run in `make test`.
NEWEST_VENV ?= .venv-torch-newest
OLDEST_VENV ?= .venv-torch-oldest
# requirements.txt's floor. It cannot rise above the oldest torch Colab ships (2.6.0,
# tests/test_colab_compat.py) without Colab reinstalling torch and asking for a restart.
TORCH_OLDEST_VERSION ?= 2.5.0
# Some machines cap torch with a pip constraint in a site-wide pip.conf (this project's CI
# machines: /etc/xdg/pip, torch<=2.14.1). A learner's machine has none, so the newest lane reads
# no pip config file at all. Set NEWEST_PIP_ENV= to use your pip config (a private mirror).
NEWEST_PIP_ENV ?= PIP_CONFIG_FILE=/dev/null
LANE_ARGS ?= --all --no-html --timeout 600
# gpu-check runs with $(PYTHON)'s own environment: no venv, nothing downloaded.
GPU_CHECK_ARGS ?=
# Chinese notebooks `make test` also runs under nbval (none by default: tests/test_zh_output.py
# executes two Chinese chapters and measures how much of their output is still English).
ZH_NBVAL ?=
# JupyterLab's own interface in Chinese for `make lab-zh`: its language pack, and a settings
# folder of its own that selects it, so `make lab` stays in English.
ZH_LAB_PACK ?= jupyterlab-language-pack-zh-CN
ZH_LAB_SETTINGS = .jupyter-zh/user-settings
# set-repo: the fork to point the course at, and its branch (empty: keep the current branch);
# MIRROR=URL (given on the command line, MIRROR= for none): a copy on another git host.
REPO ?=
BRANCH ?=
MIRROR ?=
mirror_given = $(if $(filter command line,$(origin MIRROR)),yes,)

index_flag = $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
# Jupyter refuses to run as root (containers, cloud boxes) unless told it may.
root_flag = $(if $(filter 0,$(shell id -u)),--allow-root,)
NB_DIRS = notebooks solutions exercises
LINT_DIRS = helpers tests tools benchmarks templates $(NB_DIRS)

.PHONY: help lab lab-zh translate test test-widgets7 browser-test instructor lint format notebooks-clean \
	exercises unit notebooks-test clean gpu-check gpu-plan test-torch-newest test-torch-oldest set-repo

help: ## list the commands
	@grep -E '^[a-z0-9-]+:.*## ' Makefile | sed -E 's/:.*## /\t/' | expand -t 20

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet "$(TORCH)" $(index_flag)
	$(VENV)/bin/python -m pip install --quiet -r requirements.txt -e .
	touch $@

$(TEST_VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(TEST_VENV)
	$(TEST_VENV)/bin/python -m pip install --quiet "torch==$(TEST_TORCH_VERSION)" $(index_flag)
	$(TEST_VENV)/bin/python -m pip install --quiet -r requirements.txt -e ".[teach]"
	touch $@

$(W7_VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(W7_VENV)
	$(W7_VENV)/bin/python -m pip install --quiet "torch==$(TEST_TORCH_VERSION)" $(index_flag)
	$(W7_VENV)/bin/python -m pip install --quiet -r requirements.txt -e . $(W7_PINS)
	touch $@

$(NEWEST_VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_PIP_ENV) $(NEWEST_VENV)/bin/python -m pip install --quiet "$(TORCH)" $(index_flag)
	$(NEWEST_PIP_ENV) $(NEWEST_VENV)/bin/python -m pip install --quiet -r requirements.txt -e .
	touch $@

$(OLDEST_VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet "torch==$(TORCH_OLDEST_VERSION)" $(index_flag)
	$(OLDEST_VENV)/bin/python -m pip install --quiet -r requirements.txt -e .
	touch $@

lab: $(VENV)/.installed ## install everything into .venv, then open the course in JupyterLab
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(PORT) --ServerApp.root_dir=$(CURDIR) $(root_flag) notebooks/01_devices.ipynb

lab-zh: $(VENV)/.installed ## the Chinese edition (zh/) in JupyterLab with its interface in Chinese
	$(VENV)/bin/python -m pip install --quiet "$(ZH_LAB_PACK)"
	mkdir -p $(ZH_LAB_SETTINGS)/@jupyterlab/translation-extension
	printf '{\n  "locale": "zh_CN"\n}\n' > $(ZH_LAB_SETTINGS)/@jupyterlab/translation-extension/plugin.jupyterlab-settings
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(PORT) --ServerApp.root_dir=$(CURDIR) \
		--LabApp.user_settings_dir=$(CURDIR)/$(ZH_LAB_SETTINGS) $(root_flag) zh/notebooks/01_devices.ipynb

translate: $(TEST_VENV)/.installed ## update i18n/zh_CN/ from the English notebooks and helpers, write zh/ and the helpers' .mo
	$(TEST_VENV)/bin/python tools/translate.py
	$(TEST_VENV)/bin/python tools/translate.py --stats

test: $(TEST_VENV)/.installed ## install everything into .venv-test, then lint + all tests + all notebooks + browser
	bash tools/ensure_chromium.sh
	$(TEST_VENV)/bin/ruff check $(LINT_DIRS)
	$(TEST_VENV)/bin/ruff format --check helpers tests tools benchmarks
	$(TEST_VENV)/bin/python tools/make_exercises.py --check
	$(TEST_VENV)/bin/python tools/clean_notebooks.py --check
	$(TEST_VENV)/bin/python tools/translate.py --check
	$(TEST_VENV)/bin/python -m pytest tests $(NB_DIRS) $(ZH_NBVAL) --nbval-lax --nbval-current-env \
		--nbval-cell-timeout=600 --timeout=900 -p no:cacheprovider $(PYTEST_ARGS)

test-widgets7: $(W7_VENV)/.installed ## the notebooks with widgets, widget tests and browser self-test with ipywidgets 7.7.1 (Colab's)
	bash tools/ensure_chromium.sh
	$(W7_VENV)/bin/python -c "import ipywidgets as w; assert w.__version__ == '7.7.1', w.__version__; print('ipywidgets', w.__version__)"
	PYTHONPATH=tools $(W7_VENV)/bin/python -m pytest -p widget_tests_only \
		$(W7_NOTEBOOKS) $(W7_UNIT_TESTS) tests/test_colab_compat.py \
		--nbval-lax --nbval-current-env --nbval-cell-timeout=600 --timeout=900 \
		-W "ignore::DeprecationWarning:ipywidgets.widgets.widget" -p no:cacheprovider $(PYTEST_ARGS)
	$(W7_VENV)/bin/python -m pytest tests/browser $(W7_BROWSER_ARGS) -p no:cacheprovider $(PYTEST_ARGS)

browser-test: $(TEST_VENV)/.installed ## only the JupyterLab-in-Chromium tests (screenshots in artifacts/browser/)
	bash tools/ensure_chromium.sh
	$(TEST_VENV)/bin/python -m pytest tests/browser -v -p no:cacheprovider $(PYTEST_ARGS)

# `make coverage`: where the line-coverage data goes (build/ is git-ignored).
COVERAGE_DATA ?= build/.coverage

.PHONY: coverage
coverage: $(TEST_VENV)/.installed ## unit tests under coverage: the lines of helpers/ no CPU test runs, and why
	mkdir -p $(dir $(COVERAGE_DATA))
	COVERAGE_FILE=$(COVERAGE_DATA) $(TEST_VENV)/bin/python -m coverage run \
		--source=helpers --omit='helpers/scripts/*' -m pytest tests --ignore=tests/browser \
		--timeout=900 -q -p no:cacheprovider $(PYTEST_ARGS)
	$(TEST_VENV)/bin/python tools/coverage_map.py --data $(COVERAGE_DATA) --list tests/gpu_only_lines.md

instructor: $(VENV)/.installed ## run every chapter on this machine: executed copies + HTML in executed/
	$(VENV)/bin/python tools/run_all.py $(RUN_ALL_ARGS)

test-torch-newest: $(NEWEST_VENV)/.installed ## every notebook with the newest torch release (what `make lab` gets a learner)
	$(NEWEST_VENV)/bin/python -c "import torch; print('torch', torch.__version__)"
	$(NEWEST_VENV)/bin/python tools/run_all.py $(LANE_ARGS) --out executed/torch-newest

test-torch-oldest: $(OLDEST_VENV)/.installed ## every notebook with the oldest torch requirements.txt allows
	$(OLDEST_VENV)/bin/python -c "import torch; v = torch.__version__.split('+')[0]; assert v == '$(TORCH_OLDEST_VERSION)', v; print('torch', torch.__version__)"
	$(OLDEST_VENV)/bin/python tools/run_all.py $(LANE_ARGS) --out executed/torch-oldest

gpu-check: ## notebooks, CUDA unit tests, NCCL in streams, then headline benchmarks alone (PYTHON=...): gpu-check/summary.md
	$(PYTHON) tools/gpu_check.py $(GPU_CHECK_ARGS)

gpu-plan: ## the GPU check's schedule and expected times, call by call, on one H100 (runs nothing)
	$(PYTHON) tools/gpu_check.py --plan $(GPU_CHECK_ARGS)

set-repo: ## teach from your fork: make set-repo REPO=https://github.com/ORG/NAME BRANCH=main [MIRROR=https://gitee.com/ORG/NAME]
	@test -n "$(REPO)$(BRANCH)$(mirror_given)" || { \
		echo "usage: make set-repo REPO=https://github.com/ORG/NAME [BRANCH=main] [MIRROR=https://gitee.com/ORG/NAME]"; \
		echo "now: $$($(PYTHON) tools/set_repo.py --check | tail -1)"; exit 2; }
	$(PYTHON) tools/set_repo.py $(if $(REPO),"$(REPO)",) $(if $(BRANCH),--branch "$(BRANCH)",) \
		$(if $(mirror_given),--mirror "$(MIRROR)",)

# Teaching a class: nbgrader (the `teach` extra) in .venv, next to the course it grades.
$(VENV)/.teach: $(VENV)/.installed pyproject.toml
	$(VENV)/bin/python -m pip install --quiet -e ".[teach]"
	touch $@

.PHONY: assignments
assignments: $(VENV)/.teach ## the nbgrader course folder classroom/: one assignment per chapter and language
	$(VENV)/bin/python tools/assignments.py --out classroom

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
	rm -rf $(VENV) $(TEST_VENV) $(W7_VENV) $(NEWEST_VENV) $(OLDEST_VENV) .pytest_cache .ruff_cache
