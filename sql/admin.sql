-- Rendered from app/db/admin.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: COUNT_ADD --
INSERT INTO jobq.queue_counts AS c (queue_name, status, shard, n)
VALUES (%(queue)s, %(status)s, mod(pg_backend_pid(), 64), %(n)s)
ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n

-- name: JOBS_GET_BRIEF --
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN false THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN false THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[]) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
ORDER BY j.id

-- name: JOBS_QUEUES --
SELECT id, queue_name FROM jobq.jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: JOB_RETRY_MANY_SKIP_HELD --
WITH locked AS (
  SELECT j.id, j.queue_name AS queue, j.status, j.unique_key, j.unique_from, j.unique_for_seconds FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[]) AND j.status IN ('failed', 'cancelled', 'completed')
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)  -- the caller's queues
    AND (j.unique_key IS NULL OR NOT EXISTS (
      SELECT FROM jobq.jobs h
      WHERE h.queue_name = %(queue)s AND h.queue_name = j.queue_name
        AND h.unique_key = j.unique_key AND h.unique_from = j.unique_from
        AND coalesce(h.unique_for_seconds, 0) = coalesce(j.unique_for_seconds, 0)
        AND h.unique_key IS NOT NULL AND h.status = ANY(h.unique_states) AND h.id <> j.id))
  ORDER BY j.id
  FOR UPDATE
), target AS (
  SELECT id, queue, status FROM (
    SELECT l.*, row_number() OVER (PARTITION BY l.unique_key, l.unique_from, coalesce(l.unique_for_seconds, 0)
                                   ORDER BY l.id) AS nth
    FROM locked l
  ) x
  WHERE x.unique_key IS NULL OR x.nth = 1
), retried AS (
  -- Back to pending with a fresh set of attempts; result and token of the old run are dropped. A job
  -- cancelled because a dependency failed runs now, whatever its dependencies (docs/workflows.md). A
  -- completed job runs again (a replay): the same job, with its id, payload, creation time and what its
  -- last run left (last_error, worker, claimed_at, progress) until its next claim.
  UPDATE jobq.jobs AS j
  SET status = 'pending', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL,
      lease_expires_at = NULL, result = NULL
  FROM target t WHERE j.queue_name = %(queue)s AND j.id = t.id
  RETURNING t.status AS was, j.*  -- its columns computed below, as in _job_cancel; counted by the caller
)
SELECT 0 AS ord, true AS written, j.was, j.id, j.queue_name AS queue, j.status, CASE WHEN false THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN false THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM retried j
UNION ALL
SELECT 0, false, NULL, j.id, j.queue_name AS queue, j.status, CASE WHEN false THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN false THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[]) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  AND j.id NOT IN (SELECT id FROM retried)

-- name: QUEUE_SET_PAUSED --
-- The time in VALUES, taken over by EXCLUDED: Citus refuses a function that is not IMMUTABLE in DO UPDATE SET.
INSERT INTO jobq.queue_state (queue_name, paused, changed_at) VALUES (%(queue)s, %(paused)s, now())
ON CONFLICT (queue_name) DO UPDATE SET paused = EXCLUDED.paused, changed_at = EXCLUDED.changed_at
RETURNING paused

-- name: REDRIVE_BATCH --
WITH selected AS (
  -- Failed jobs of one queue, oldest first, a batch at a time; SKIP LOCKED lets a concurrent redrive
  -- or retry proceed without waiting. A job whose unique key another job holds is not selected.
  SELECT j.id, j.queue_name AS queue, j.status, j.unique_key, j.unique_from, j.unique_for_seconds,
         j.finished_at
  FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.status = 'failed' AND j.finished_at IS NOT NULL
    AND (%(contains)s::text IS NULL OR strpos(j.last_error, %(contains)s) > 0)
    AND (j.unique_key IS NULL OR NOT EXISTS (
      SELECT FROM jobq.jobs h
      WHERE h.queue_name = %(queue)s AND h.queue_name = j.queue_name
        AND h.unique_key = j.unique_key AND h.unique_from = j.unique_from
        AND coalesce(h.unique_for_seconds, 0) = coalesce(j.unique_for_seconds, 0)
        AND h.unique_key IS NOT NULL AND h.status = ANY(h.unique_states) AND h.id <> j.id))
  ORDER BY j.finished_at, j.id
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), target AS (
  -- Of selected jobs sharing a unique key, the oldest only: the others stay failed (the next batch finds
  -- their key held by it, and selects them no more).
  SELECT id, queue, status FROM (
    SELECT s.*, row_number() OVER (PARTITION BY s.unique_key, s.unique_from, coalesce(s.unique_for_seconds, 0)
                                   ORDER BY s.finished_at, s.id) AS nth
    FROM selected s
  ) x
  WHERE x.unique_key IS NULL OR x.nth = 1
), redriven AS (
  UPDATE jobq.jobs AS j
  SET status = 'pending', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL,
      lease_expires_at = NULL
  FROM target t WHERE j.queue_name = %(queue)s AND j.id = t.id
  RETURNING j.id  -- counted by the caller, in the same transaction (all were failed)
)
SELECT (SELECT count(*) FROM redriven) AS moved, (SELECT count(*) FROM selected) AS selected

-- name: REDRIVE_COUNT --
-- What a redrive would move: jobs whose unique key is held are left out, and of failed jobs sharing a key
-- one only.
SELECT count(*) FILTER (WHERE j.unique_key IS NULL)
       + count(DISTINCT (j.unique_key, j.unique_from, coalesce(j.unique_for_seconds, 0)))
           FILTER (WHERE j.unique_key IS NOT NULL)
FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.status = 'failed' AND j.finished_at IS NOT NULL
  AND (%(contains)s::text IS NULL OR strpos(j.last_error, %(contains)s) > 0)
  AND (j.unique_key IS NULL OR NOT EXISTS (
      SELECT FROM jobq.jobs h
      WHERE h.queue_name = %(queue)s AND h.queue_name = j.queue_name
        AND h.unique_key = j.unique_key AND h.unique_from = j.unique_from
        AND coalesce(h.unique_for_seconds, 0) = coalesce(j.unique_for_seconds, 0)
        AND h.unique_key IS NOT NULL AND h.status = ANY(h.unique_states) AND h.id <> j.id))

-- name: RELEASE_RECORD --
INSERT INTO jobq.dependency_releases (queue_name, job_id, status) VALUES (%(queue)s, %(id)s, %(status)s)
