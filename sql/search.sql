-- Rendered from app/db/search.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: SEARCH_BY_ID --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.id AS k1, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.id = %(id)s AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC) AS n,
         json_build_array(s.k1) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id) ON true
ORDER BY h.n

-- name: SEARCH_BY_ID_DESC --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.id AS k1, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE (%(after)s::boolean IS NOT TRUE OR j.id < %(k1)s::bigint) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC) AS n,
         json_build_array(s.k1) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id) ON true
ORDER BY h.n

-- name: SEARCH_BY_ID_DESC_IN_QUEUE --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.id AS k1, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND (%(after)s::boolean IS NOT TRUE OR j.id < %(k1)s::bigint) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC) AS n,
         json_build_array(s.k1) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id AND j.queue_name = %(queue)s) ON true
ORDER BY h.n

-- name: SEARCH_BY_ID_IN_QUEUE --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.id AS k1, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC) AS n,
         json_build_array(s.k1) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id AND j.queue_name = %(queue)s) ON true
ORDER BY h.n

-- name: SEARCH_BY_KEY --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.id AS k1, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.idempotency_key = %(key)s AND j.idempotency_key IS NOT NULL AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC) AS n,
         json_build_array(s.k1) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id AND j.queue_name = %(queue)s) ON true
ORDER BY h.n

-- name: SEARCH_BY_KEY_ANY_QUEUE --
WITH 
RECURSIVE pending_queues(name) AS (
  (SELECT queue_name FROM jobq.jobs WHERE status = 'pending' ORDER BY queue_name LIMIT 1)
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = 'pending' AND queue_name > p.name ORDER BY queue_name LIMIT 1)
  FROM pending_queues p WHERE p.name IS NOT NULL
), waiting_queues(name) AS (
  (SELECT queue_name FROM jobq.jobs WHERE status = 'waiting' ORDER BY queue_name LIMIT 1)
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = 'waiting' AND queue_name > w.name ORDER BY queue_name LIMIT 1)
  FROM waiting_queues w WHERE w.name IS NOT NULL
), queues AS (
  SELECT name FROM pending_queues WHERE name IS NOT NULL
  UNION SELECT name FROM waiting_queues WHERE name IS NOT NULL
  UNION SELECT queue_name FROM jobq.jobs WHERE status = 'running'
  UNION SELECT queue_name FROM jobq.queue_counts
), examined AS MATERIALIZED (
  SELECT j.id, j.id AS k1, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM queues q CROSS JOIN LATERAL (
    -- OFFSET 0: one lookup per queue through jobs_idempotency_idx, never flattened into a join
    SELECT * FROM jobq.jobs j
    WHERE j.queue_name = q.name AND j.idempotency_key = %(key)s AND j.idempotency_key IS NOT NULL
    OFFSET 0
  ) j
  WHERE (%(allowed)s::text IS NULL OR split_part(q.name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC) AS n,
         json_build_array(s.k1) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id) ON true
ORDER BY h.n

-- name: SEARCH_BY_KEY_EVERY_SHARD --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.id AS k1, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.idempotency_key = %(key)s AND j.idempotency_key IS NOT NULL AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC) AS n,
         json_build_array(s.k1) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id) ON true
ORDER BY h.n

-- name: SEARCH_BY_PAYLOAD --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.id AS k1, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.payload @> %(payload)s::jsonb AND j.status IN ('failed', 'cancelled') AND j.status = ANY(%(statuses)s) AND ((%(after)s::boolean IS NOT TRUE OR j.id < %(k1)s::bigint)) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC) AS n,
         json_build_array(s.k1) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id) ON true
ORDER BY h.n

-- name: SEARCH_BY_PAYLOAD_IN_QUEUE --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.id AS k1, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.payload @> %(payload)s::jsonb AND j.status IN ('failed', 'cancelled') AND j.status = ANY(%(statuses)s) AND ((%(after)s::boolean IS NOT TRUE OR j.id < %(k1)s::bigint)) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC) AS n,
         json_build_array(s.k1) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id AND j.queue_name = %(queue)s) ON true
ORDER BY h.n

-- name: SEARCH_LISTING[<Status.cancelled: 'cancelled'>] --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.finished_at AS k1, j.id AS k2, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.status = %(status)s AND j.finished_at IS NOT NULL
  AND (%(after)s::boolean IS NOT TRUE OR (j.finished_at, j.id) < (%(k1)s::timestamptz, %(k2)s::bigint)) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.finished_at DESC, j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC, s.k2 DESC) AS n,
         json_build_array(s.k1, s.k2) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id AND j.queue_name = %(queue)s) ON true
ORDER BY h.n

-- name: SEARCH_LISTING[<Status.completed: 'completed'>] --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.finished_at AS k1, j.id AS k2, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.status = %(status)s AND j.finished_at IS NOT NULL
  AND (%(after)s::boolean IS NOT TRUE OR (j.finished_at, j.id) < (%(k1)s::timestamptz, %(k2)s::bigint)) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.finished_at DESC, j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC, s.k2 DESC) AS n,
         json_build_array(s.k1, s.k2) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id AND j.queue_name = %(queue)s) ON true
ORDER BY h.n

-- name: SEARCH_LISTING[<Status.failed: 'failed'>] --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.finished_at AS k1, j.id AS k2, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.status = %(status)s AND j.finished_at IS NOT NULL
  AND (%(after)s::boolean IS NOT TRUE OR (j.finished_at, j.id) < (%(k1)s::timestamptz, %(k2)s::bigint)) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.finished_at DESC, j.id DESC
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC, s.k2 DESC) AS n,
         json_build_array(s.k1, s.k2) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id AND j.queue_name = %(queue)s) ON true
ORDER BY h.n

-- name: SEARCH_LISTING[<Status.pending: 'pending'>] --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.priority AS k1, j.run_at AS k2, j.id AS k3, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.status = 'pending'
  AND (%(after)s::boolean IS NOT TRUE
       OR j.priority < %(k1)s::int
       OR (j.priority = %(k1)s::int AND (j.run_at, j.id) > (%(k2)s::timestamptz, %(k3)s::bigint))) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.priority DESC, j.run_at, j.id
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1 DESC, s.k2, s.k3) AS n,
         json_build_array(s.k1, s.k2, s.k3) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id AND j.queue_name = %(queue)s) ON true
ORDER BY h.n

-- name: SEARCH_LISTING[<Status.running: 'running'>] --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.lease_expires_at AS k1, j.id AS k2, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.status = 'running'
  AND (%(after)s::boolean IS NOT TRUE OR (j.lease_expires_at, j.id) > (%(k1)s::timestamptz, %(k2)s::bigint)) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.lease_expires_at, j.id
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1, s.k2) AS n,
         json_build_array(s.k1, s.k2) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id AND j.queue_name = %(queue)s) ON true
ORDER BY h.n

-- name: SEARCH_LISTING[<Status.waiting: 'waiting'>] --
WITH  examined AS MATERIALIZED (
  SELECT j.id, j.id AS k1, ((%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)) AS hit
  FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.status = 'waiting'
  AND (%(after)s::boolean IS NOT TRUE OR j.id > %(k1)s::bigint) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.id
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY s.k1) AS n,
         json_build_array(s.k1) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON j.id = h.id AND j.queue_name = %(queue)s) ON true
ORDER BY h.n
