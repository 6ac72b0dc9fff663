-- Rendered from app/db/pool.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: READ_ONLY --
SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool

-- name: SESSION_SETTINGS --
SELECT set_config('timezone', 'UTC', false), set_config('statement_timeout', %s, false), set_config('idle_in_transaction_session_timeout', '60s', false), set_config('synchronous_commit', 'on', false), set_config('enable_bitmapscan', 'off', false), set_config('jit', 'off', false), EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') AS citus
