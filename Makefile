# The commands the README shows. `make run` and `make test` create the environment first if needed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYVER  := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
STAMP  := $(VENV)/.installed-$(PYVER)
BENCH_STAMP := $(VENV)/.installed-bench-$(PYVER)

# npm packages the tests pin (tests/node.py), installed from their lock files when npm is on PATH.
NPM         := $(shell command -v npm 2>/dev/null)
SDK_TS      := clients/typescript
NODE_STAMPS := $(if $(NPM),tests/generated_clients/node_modules/.package-lock.json $(SDK_TS)/node_modules/.package-lock.json \
                          tests/sqs_js/node_modules/.package-lock.json)

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

%/node_modules/.package-lock.json: %/package.json %/package-lock.json
	cd $* && npm ci --no-audit --no-fund
	touch $@

run: $(STAMP)           ## run the service (embedded PostgreSQL unless JOBQ_DATABASE_URL is set)
	$(BIN)/jobq serve $(ARGS)

test: $(STAMP) $(NODE_STAMPS)  ## run the test suite against a real PostgreSQL (see tests/conftest.py)
	$(BIN)/python -m pytest $(ARGS)

lint: $(STAMP) $(NODE_STAMPS)  ## ruff (lint + format check), mypy strict (the service and the Python SDK), tsc strict (the TypeScript SDK)
	$(BIN)/ruff check app tests bench clients
	$(BIN)/ruff format --check app tests bench clients
	$(BIN)/mypy
	cd clients/python && $(abspath $(BIN))/mypy
	$(if $(NPM),cd $(SDK_TS) && npm run --silent typecheck)

format: $(STAMP)
	$(BIN)/ruff format app tests bench clients
	$(BIN)/ruff check --fix app tests bench clients

openapi: $(STAMP) $(NODE_STAMPS)  ## regenerate the committed contract, and the TypeScript SDK's types from it
	$(BIN)/jobq openapi --output openapi/openapi.json
	$(if $(NPM),cd $(SDK_TS) && npm run --silent generate)

bench: $(BENCH_STAMP)   ## jobq beside the raw-SQL limit and PgQueuer (see BENCHMARKS.md)
	$(BIN)/python bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
