# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?=
HOST ?= 127.0.0.1
PORT ?= 8780

.PHONY: run test lint typecheck pytest clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

## run: install and start the gateway (embedded default config, or CONFIG=file)
run: $(VENV)/.runtime
	$(BIN)/boundedcode-gateway serve $(if $(CONFIG),--config $(CONFIG)) --host $(HOST) --port $(PORT)

## test: install the test extras, then lint, type-check and run the whole suite
test: $(VENV)/.test lint typecheck pytest

lint: $(VENV)/.test
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck: $(VENV)/.test
	$(BIN)/mypy

pytest: $(VENV)/.test
	$(BIN)/pytest

clean:
	rm -rf $(VENV) .gateway .pytest_cache .mypy_cache .ruff_cache
