# The two commands of the README. Each creates/updates .venv and installs what it needs.
#   make run    — the main job
#   make test   — lint, type-check and the whole test suite (what .ci/run calls)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test bench lint

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed-%: setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[$*]"
	touch $@

run: $(VENV)/.installed-bench
	$(BIN)/python bench/index_memory.py

test: $(VENV)/.installed-test,dev
	$(BIN)/ruff check pulsar_nack tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: run
