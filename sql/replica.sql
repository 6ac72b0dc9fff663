-- Rendered from app/db/replica.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: PRIMARY_WAL --
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint

-- name: REPLICA_WAL --
SELECT pg_is_in_recovery(), pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::bigint
