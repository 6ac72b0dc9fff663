-- A fourth scope, `metrics`: GET /metrics and nothing else, for a Prometheus scraper that should not hold
-- an admin key (which could cancel, redrive and pause). /metrics covers every queue, so a key holding
-- `metrics` is never limited to queue patterns: the CLI refuses such a key, and so does the schema.
--
-- 0005 left its scopes CHECK unnamed; PostgreSQL named it api_keys_scopes_check. DROP without IF EXISTS:
-- should it be missing, this migration fails and rolls back rather than leave the old check in place.
-- One statement, in the runner's transaction and under its advisory lock: api_keys holds a few rows, so
-- the ACCESS EXCLUSIVE lock and the re-check of existing keys are brief, and running processes answer
-- from their cache of verified keys meanwhile. Existing keys all pass both checks (none holds `metrics`).
ALTER TABLE api_keys
  DROP CONSTRAINT api_keys_scopes_check,
  ADD CONSTRAINT api_keys_scopes_check
    CHECK (cardinality(scopes) >= 1 AND scopes <@ ARRAY['produce', 'consume', 'admin', 'metrics']),
  ADD CONSTRAINT api_keys_metrics_every_queue_check
    CHECK (NOT ('metrics' = ANY (scopes)) OR queue_patterns IS NULL);
