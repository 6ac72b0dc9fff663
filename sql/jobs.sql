-- Rendered from app/db/jobs.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: JOBS_GET_WAITED --
-- Jobs that requests wait for (app/core/results.py), each as it is now: with payload and result only when
-- it has finished, since only then is it an answer. A job that is gone is not in the result.
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN j.status IN ('completed', 'failed', 'cancelled') THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN j.status IN ('completed', 'failed', 'cancelled') THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, coalesce(j.has_dependants, false) AS has_dependants FROM jobs j WHERE j.id = ANY(%(ids)s)

-- name: JOB_GET --
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, coalesce(j.has_dependants, false) AS has_dependants FROM jobs j
WHERE j.id = %(id)s AND (%(allowed)s::text IS NULL OR j.queue_name ~ %(allowed)s::text)

-- name: JOB_GET_BY_KEYS --
-- The jobs already holding these keys, one lookup each through jobs_idempotency_idx (the restriction
-- `IS NOT NULL` proves its predicate; OFFSET 0 keeps each lookup a lookup).
SELECT j.*
FROM json_to_recordset(%(keys)s::json) AS k(queue_name text, idempotency_key text)
CROSS JOIN LATERAL (
  SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, coalesce(j.has_dependants, false) AS has_dependants FROM jobs j
  WHERE j.queue_name = k.queue_name AND j.idempotency_key = k.idempotency_key AND j.idempotency_key IS NOT NULL
  OFFSET 0
) j

-- name: JOB_INSERT_MANY --
WITH input AS (
  -- Ids are drawn in the input's order (a volatile select-list expression is evaluated after the
  -- ORDER BY): that is how rows without a key are matched back to their input, and ids are the last
  -- tie-break of claim order, so a batch keeps its order.
  SELECT t.*, nextval(pg_get_serial_sequence('jobs', 'id')) AS id
  FROM json_to_recordset(%(batch)s::json)
    AS t(ord int, queue_name text, payload jsonb, priority int, run_at timestamptz, delay float8,
         max_attempts int, idempotency_key text, traceparent text, group_key text, timeout_seconds int)
  ORDER BY ord
)
INSERT INTO jobs AS j (id, queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent,
                       group_key, timeout_seconds)
OVERRIDING SYSTEM VALUE
SELECT id, queue_name, coalesce(payload, 'null'), priority,  -- json_to_recordset reads JSON null as NULL
       coalesce(run_at, now() + make_interval(secs => coalesce(delay, 0))),
       max_attempts, idempotency_key, traceparent, group_key, timeout_seconds
FROM input
-- Rows are inserted in key order, not input order: every statement then takes the keys it waits on
-- (a key inserted by a transaction still in flight) in one global order, so two batches holding the
-- same keys in different orders cannot wait on each other in a cycle (a deadlock: one would fail).
-- The first occurrence of a key twice in the input still wins (ord breaks the tie).
ORDER BY queue_name COLLATE "C", idempotency_key COLLATE "C", ord
-- A key already taken on this queue: insert nothing, the caller fetches the existing job.
ON CONFLICT (queue_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
-- full = false: for a minimal answer (Prefer: return=minimal), the payload does not travel back.
RETURNING j.id, j.queue_name AS queue, j.status, CASE WHEN %(full)s THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN %(full)s THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, coalesce(j.has_dependants, false) AS has_dependants
