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
.PHONY: sql check test-citus

# `make check`, the fast lane: a test or two of each part a change most often breaks (enqueue, claim and
# long-poll, the worker's writes and the sweeper, release, results, dependencies, keys and scopes, limits
# and flow control), the contract checks (OpenAPI, docs, rendered SQL, versions) and the unit tests.
# `make test` is still what must pass.
CHECK_TESTS := tests/unit tests/test_openapi.py tests/test_docs.py tests/test_release_version.py \
	tests/test_enqueue.py::test_enqueue_returns_the_stored_job \
	tests/test_enqueue.py::test_idempotency_key_returns_the_existing_job \
	tests/test_enqueue.py::test_batch_is_ordered_and_all_or_nothing \
	tests/test_enqueue.py::test_bad_enqueue_bodies_are_422_and_write_nothing \
	tests/test_enqueue.py::test_malformed_json_is_400 \
	tests/test_claim.py::test_claim_order_is_priority_then_run_at_then_id \
	tests/test_claim.py::test_claim_shape_and_lease \
	tests/test_claim.py::test_long_poll_is_woken_by_an_enqueue \
	tests/test_claim.py::test_long_poll_across_processes \
	tests/test_handoff.py::test_claim_order_holds_an_older_ready_job_goes_first \
	tests/test_handoff.py::test_a_claim_arriving_while_others_wait_on_an_empty_queue_waits_with_them_without_a_statement \
	tests/test_claim.py::test_a_claim_completes_the_jobs_it_hands_in_first \
	tests/test_lifecycle.py::test_heartbeat_extends_the_lease \
	tests/test_lifecycle.py::test_retried_complete_with_the_same_token_is_200 \
	tests/test_lifecycle.py::test_fail_schedules_a_retry_with_backoff \
	tests/test_lifecycle.py::test_a_stale_token_gets_409_and_changes_nothing \
	tests/test_lifecycle.py::test_a_worker_that_always_dies_ends_in_failed \
	tests/test_lifecycle.py::test_batch_complete_reports_each_item \
	tests/test_release.py::test_release_gives_the_attempt_back \
	tests/test_results.py::test_a_wait_answers_when_the_job_completes \
	tests/test_dependencies.py::test_a_failed_parent_cancels_its_dependants_transitively \
	tests/test_cascades.py::test_a_queue_whose_sweep_runs_past_its_budget_stops_no_other_queue \
	tests/test_cascades.py::test_what_a_previous_releases_process_left_is_released_by_the_reconciliation \
	tests/test_security.py::test_no_key_or_a_bad_key_is_401 \
	tests/test_security.py::test_scopes_decide_what_a_key_may_do \
	tests/test_security.py::test_a_key_cannot_touch_or_see_jobs_of_other_queues \
	tests/test_exposure.py::test_an_open_service_refuses_proxied_requests \
	tests/test_limits.py::test_server_owned_fields_are_refused_not_stored \
	tests/test_flow.py::test_concurrency_caps_running_jobs_and_a_complete_wakes_a_waiting_claim \
	tests/test_flow.py::test_group_concurrency_holds_a_group_back_not_the_others \
	tests/test_operations.py::test_cancel_a_running_job_cooperatively \
	tests/test_schedules.py::test_a_due_tick_makes_one_job_that_names_its_schedule_and_tick \
	tests/test_sql_enqueue.py::test_a_rollback_leaves_no_trace_and_a_savepoint_undoes_only_its_part \
	tests/test_schema.py::test_another_schema_name_and_no_search_path

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

# The suite on a Citus cluster (docs/scale-out.md#testing-on-citus): JOBQ_TEST_CITUS_URL names a database on
# its coordinator, whose workers are registered there. CI has no Citus: this runs where a cluster is.
test-citus: $(STAMP) $(NODE_STAMPS)
	@test -n "$$JOBQ_TEST_CITUS_URL" || { echo "set JOBQ_TEST_CITUS_URL (docs/scale-out.md#testing-on-citus)"; exit 2; }
	$(BIN)/python -m pytest $(ARGS)

check: lint            ## the fast lane (lint, the unit tests and a test or two of each part; under 2 minutes): see CHECK_TESTS
	$(BIN)/python -m pytest -q $(CHECK_TESTS) $(ARGS)

lint: $(STAMP) $(NODE_STAMPS)  ## ruff (lint + format check), mypy strict (the service and the Python SDK), the layer contracts (lint-imports), tsc strict (the TypeScript SDK)
	$(BIN)/ruff check app tests bench clients
	$(BIN)/ruff format --check app tests bench clients
	$(BIN)/mypy
	$(BIN)/lint-imports
	cd clients/python && $(abspath $(BIN))/mypy
	$(if $(NPM),cd $(SDK_TS) && npm run --silent typecheck)

format: $(STAMP)
	$(BIN)/ruff format app tests bench clients
	$(BIN)/ruff check --fix app tests bench clients

openapi: $(STAMP) $(NODE_STAMPS)  ## regenerate the committed contract, and the TypeScript SDK's types from it
	$(BIN)/jobq openapi --output openapi/openapi.json
	$(if $(NPM),cd $(SDK_TS) && npm run --silent generate)

sql: $(STAMP)           ## write every SQL statement of app/db, composed as it runs, to sql/<module>.sql (a test compares)
	$(BIN)/python -m app.db.render --output sql

bench: $(BENCH_STAMP)   ## jobq beside the raw-SQL limit and PgQueuer (see BENCHMARKS.md)
	$(BIN)/python bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
