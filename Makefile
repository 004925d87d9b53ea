# webloop — the two commands: `make demo` (set up + run the main job), `make test` (set up + run the tests).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.webloop-installed

.PHONY: setup system demo test test-fast lint format bench clean

setup: $(STAMP) system

# Re-installs only when pyproject.toml changed. torch is pinned in the same pip command as the
# rest, otherwise the resolver pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet 'torch==2.13.0' -e '.[dev]'
	@touch $(STAMP)

# Chromium for the rollout browsers, PostgreSQL server binaries for the catalog tests.
system:
	@bash scripts/setup-system.sh

demo: setup
	$(VENV)/bin/webloop demo

test: setup lint
	$(PY) -m pytest

# The fast tier: no browser, no Prefect server, no PostgreSQL, nothing marked slow.
test-fast: setup lint
	$(PY) -m pytest -m "not browser and not slow and not postgres and not prefect"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: setup
	$(PY) bench/warehouse.py
	$(PY) bench/sites.py
	$(PY) bench/rollouts.py
	$(PY) bench/judging.py
	$(PY) bench/curation.py
	$(PY) bench/learning.py

clean:
	rm -rf $(VENV) .webloop .pytest_cache .ruff_cache *.egg-info
