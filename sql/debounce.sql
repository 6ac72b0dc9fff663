-- Rendered from app/db/debounce.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: JOB_DEBOUNCE --
WITH target AS (
  -- The pending job of the key (the newest, should a retried one have come back beside it), through
  -- jobs_debounce_idx. FOR UPDATE: a claim that holds it makes this wait, then find it running: no target.
  -- Its new run time is computed here, not in the UPDATE (on Citus an UPDATE may not apply a STABLE
  -- function, such as timestamptz + interval, to a column).
  SELECT j.id,
         greatest(j.run_at, least(now() + make_interval(secs => %(seconds)s),
                                  j.created_at + make_interval(secs => %(max_wait)s))) AS run_at
  FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.debounce_key = %(key)s AND j.debounce_key IS NOT NULL AND j.status = 'pending'
  ORDER BY j.id DESC
  LIMIT 1
  FOR UPDATE
), replaced AS (
  UPDATE jobq.jobs AS j
  SET payload = %(payload)s::jsonb, priority = %(priority)s, debounce_seconds = %(seconds)s,
      debounce_max_wait_seconds = %(max_wait)s, run_at = t.run_at
  FROM target t WHERE j.queue_name = %(queue)s AND j.id = t.id
  RETURNING j.*
), inserted AS (
  INSERT INTO jobq.jobs AS j (queue_name, payload, priority, run_at, max_attempts, traceparent, group_key,
                         timeout_seconds, debounce_key, debounce_seconds, debounce_max_wait_seconds)
  SELECT %(queue)s, %(payload)s::jsonb, %(priority)s,
         now() + make_interval(secs => %(seconds)s),  -- max_wait is at least seconds (the API checks)
         %(max_attempts)s, %(traceparent)s, %(group)s, %(timeout)s, %(key)s, %(seconds)s, %(max_wait)s
  WHERE NOT EXISTS (SELECT FROM target)
  RETURNING j.*
)
-- The answer's columns computed here, not in RETURNING: Citus allows no STABLE function (json_build_object,
-- timestamptz + interval) in a RETURNING clause.
SELECT 0 AS ord, false AS created, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM replaced j
UNION ALL
SELECT 0, true, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM inserted j

-- name: JOB_DEBOUNCE_INSERT --
-- On Citus: a new pending job for the key, JOB_DEBOUNCE_TARGET having found none.
INSERT INTO jobq.jobs AS j (queue_name, payload, priority, run_at, max_attempts, traceparent, group_key,
                       timeout_seconds, debounce_key, debounce_seconds, debounce_max_wait_seconds)
VALUES (%(queue)s::text, %(payload)s::jsonb, %(priority)s::int,
        now() + make_interval(secs => %(seconds)s::float8),  -- max_wait is at least seconds (the API checks)
        %(max_attempts)s::int, %(traceparent)s::text, %(group)s::text, %(timeout)s::int, %(key)s::text,
        %(seconds)s::float8, %(max_wait)s::float8)
RETURNING j.id

-- name: JOB_DEBOUNCE_LOCK --
-- One advisory lock per (queue, key), in one order (no two enqueues wait on each other in a cycle); held to
-- the end of the transaction. A collision of two keys' hashes only makes them wait for each other.
SELECT count(pg_advisory_xact_lock(k)) FROM (
  SELECT DISTINCT hashtextextended(k.queue_name || '/' || k.debounce_key, 24) AS k
  FROM json_to_recordset(%(keys)s::json) AS k(queue_name text, debounce_key text)
  ORDER BY 1
) l

-- name: JOB_DEBOUNCE_REPLACE --
-- On Citus: the pending job that JOB_DEBOUNCE_TARGET locked, replaced.
UPDATE jobq.jobs AS j
SET payload = %(payload)s::jsonb, priority = %(priority)s, debounce_seconds = %(seconds)s,
    debounce_max_wait_seconds = %(max_wait)s, run_at = %(run_at)s
WHERE j.queue_name = %(queue)s AND j.id = %(id)s

-- name: JOB_DEBOUNCE_TARGET --
-- On Citus: JOB_DEBOUNCE's target, a statement of its own (see there).
SELECT j.id,
       greatest(j.run_at, least(now() + make_interval(secs => %(seconds)s),
                                j.created_at + make_interval(secs => %(max_wait)s))) AS run_at
FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.debounce_key = %(key)s AND j.debounce_key IS NOT NULL AND j.status = 'pending'
ORDER BY j.id DESC
LIMIT 1
FOR UPDATE
