-- Rendered from app/db/migrate.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: INVALID_INDEX --
SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)

-- name: LOCK_HOLDERS --
SELECT pid, extract(epoch FROM now() - xact_start)::int AS seconds, state, left(query, 80) AS query
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
ORDER BY xact_start
LIMIT 3

-- name: MIGRATIONS_TABLE --
CREATE TABLE IF NOT EXISTS jobq.jobq_migrations (
  version    integer PRIMARY KEY,
  name       text        NOT NULL,
  checksum   text        NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: OTHERS_WHO_CREATE --
SELECT coalesce(string_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END, ', '), '')
FROM pg_namespace n, aclexplode(n.nspacl) a
WHERE n.oid = to_regnamespace(%s) AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner

-- name: RECORD_MIGRATION --
INSERT INTO jobq.jobq_migrations (version, name, checksum) VALUES (%s, %s, %s)
