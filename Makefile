# The two commands of the README. Each creates/updates .venv and installs what it needs.
#   make run    — the main job
#   make test   — lint, type-check and the whole test suite (what .ci/run calls)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test bench-index bench-broker

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed-%: setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[$*]"
	touch $@

run: $(VENV)/.installed-broker
	$(BIN)/pulsar-nack demo

test: $(VENV)/.installed-test,dev
	$(BIN)/ruff check pulsar_nack tests bench examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider

# Benchmarks (they write docs/performance.md)
bench-index: $(VENV)/.installed-bench
	$(BIN)/python bench/index_memory.py

bench-broker: $(VENV)/.installed-bench
	$(BIN)/python bench/nack_lateness.py
