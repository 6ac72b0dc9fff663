# The commands the README shows. `make run` and `make test` create the environment first if needed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYVER  := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
STAMP  := $(VENV)/.installed-$(PYVER)
BENCH_STAMP := $(VENV)/.installed-bench-$(PYVER)

.PHONY: run test lint typecheck format openapi bench clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev]' -e clients/python
	touch $(STAMP)

# Only `make bench` needs the peer it measures against (PgQueuer), so only it installs the extra.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

run: $(STAMP)           ## run the service (embedded PostgreSQL unless JOBQ_DATABASE_URL is set)
	$(BIN)/jobq serve $(ARGS)

test: $(STAMP)          ## run the test suite against a real PostgreSQL (see tests/conftest.py)
	$(BIN)/python -m pytest $(ARGS)

lint: $(STAMP)          ## ruff (lint + format check) and mypy strict (the service and the Python SDK)
	$(BIN)/ruff check app tests bench clients
	$(BIN)/ruff format --check app tests bench clients
	$(BIN)/mypy
	cd clients/python && $(abspath $(BIN))/mypy

format: $(STAMP)
	$(BIN)/ruff format app tests bench clients
	$(BIN)/ruff check --fix app tests bench clients

openapi: $(STAMP)       ## regenerate the committed contract
	$(BIN)/jobq openapi --output openapi/openapi.json

bench: $(BENCH_STAMP)   ## jobq beside the raw-SQL limit and PgQueuer (see BENCHMARKS.md)
	$(BIN)/python bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
