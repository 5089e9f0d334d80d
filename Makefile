# The two commands of the README. Each creates/updates .venv and installs what it needs.
#   make run    — the main job
#   make test   — lint, type-check, the API reference site (--strict) and the whole test suite (what .ci/run calls)
#   make docs   — the documentation site (mkdocs.yml: docs/*.md + the API reference) into build/site/
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test docs bench-index bench-broker bench-cost bench-consumer bench-timer

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed-%: setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[$*]"
	touch $@

run: $(VENV)/.installed-broker
	$(BIN)/pulsar-nack demo

test: $(VENV)/.installed-test,dev
	$(BIN)/ruff check pulsar_nack tests bench examples harness spark
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site
	$(BIN)/python -m pytest -q -p no:cacheprovider --ignore=tests/test_chunked.py
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_chunked.py  # own process: docs/chunked.md, Known issues

# The documentation site; --strict: a docstring reference that does not resolve, or a broken link, fails.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

# Benchmarks (they write docs/performance.md)
bench-index: $(VENV)/.installed-bench
	$(BIN)/python bench/index_memory.py

bench-broker: $(VENV)/.installed-bench
	$(BIN)/python bench/nack_lateness.py

bench-cost: $(VENV)/.installed-bench
	$(BIN)/python bench/consumer_cost.py

# Issue 9's figures: memory per pending nack, the batched nack path, a million batched messages; then
# the README's comparison table from every result file.
bench-consumer: $(VENV)/.installed-bench
	$(BIN)/python bench/nack_memory.py
	$(BIN)/python bench/nack_path.py
	$(BIN)/python bench/batch_drain.py
	$(BIN)/python bench/summary.py

# Issue 10's timer figures: CPU per forwarded id and forward lateness at k = 0, 4, 8.
bench-timer: $(VENV)/.installed-bench
	$(BIN)/python bench/timer_cost.py
