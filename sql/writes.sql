-- Rendered from app/db/writes.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: CITUS_FORMS['\nWITH stamp AS (\n  -- The clock, a random draw, and the queue\'s backoff settings (queue_state, one lookup by key) else the\n  -- global ones.\n  SELECT c.now, extract(epoch FROM c.now) AS epoch, random() AS draw,\n         coalesce((SELECT backoff_max_seconds FROM jobq.queue_state WHERE queue_name = %(queue)s),\n                  %(cap)s::float8) AS cap,\n         coalesce((SELECT backoff_base_seconds FROM jobq.queue_state WHERE queue_name = %(queue)s),\n                  %(base)s::float8) AS base\n  FROM (SELECT clock_timestamp() AS now) c\n), failed AS (\n  UPDATE jobq.jobs AS j\n  SET status = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN \'pending\' ELSE \'failed\' END,\n      -- Retry later: the caller\'s delay, else exponential backoff with "equal jitter" (half fixed,\n      -- half random) so that jobs failed together do not come back together.\n      run_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts\n                    THEN to_timestamp(st.epoch + coalesce(%(retry_in)s::float8,\n                         least(st.cap, st.base * power(2, least(j.attempts - 1, 60))) * (0.5 + st.draw / 2)))\n                    ELSE j.run_at END,\n      finished_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN NULL ELSE st.now END,\n      lease_expires_at = NULL,\n      last_error = %(error)s\n  FROM stamp st\n  WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND j.status = (SELECT \'running\'::text) AND j.claim_token = %(token)s\n    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, \'#\', 1) ~ %(allowed)s::text)\n  RETURNING j.*, j.queue_name AS queue\n), counted AS (\n  INSERT INTO jobq.queue_counts AS c (queue_name, status, shard, n)\n  SELECT queue, status, mod(pg_backend_pid(), 64), sum(1)\n  FROM failed\n  WHERE status IN (\'completed\', \'failed\', \'cancelled\')\n  GROUP BY 1, 2\n  ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n\n), recorded AS (\n  INSERT INTO jobq.dependency_releases (queue_name, job_id, status)\n  SELECT queue, id, status FROM failed\n  WHERE has_dependants AND status IN (\'completed\', \'failed\', \'cancelled\')\n)\n\nSELECT 0 AS ord, true AS written, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, \'cancel\') END AS on_dependency_failure, CASE WHEN j.status = \'waiting\' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object(\'key\', j.unique_key, \'for_seconds\', j.unique_for_seconds, \'while\', j.unique_states, \'window_start\', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, \'window_end\', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object(\'key\', j.debounce_key, \'seconds\', j.debounce_seconds, \'max_wait_seconds\', j.debounce_max_wait_seconds, \'run_by\', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM failed j\nUNION ALL\n-- Else the row as found (to tell why not); a job outside the caller\'s queues is not found.\nSELECT 0, false, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, \'cancel\') END AS on_dependency_failure, CASE WHEN j.status = \'waiting\' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object(\'key\', j.unique_key, \'for_seconds\', j.unique_for_seconds, \'while\', j.unique_states, \'window_start\', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, \'window_end\', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object(\'key\', j.debounce_key, \'seconds\', j.debounce_seconds, \'max_wait_seconds\', j.debounce_max_wait_seconds, \'run_by\', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j\nWHERE j.queue_name = %(queue)s AND j.id = %(id)s AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, \'#\', 1) ~ %(allowed)s::text)\n  AND NOT EXISTS (SELECT FROM failed)\n\n'] --
WITH stamp AS (
  -- The clock, a random draw, and the queue's backoff settings (queue_state, one lookup by key) else the
  -- global ones.
  SELECT c.now, extract(epoch FROM c.now) AS epoch, random() AS draw,
         coalesce((SELECT backoff_max_seconds FROM jobq.queue_state WHERE queue_name = %(queue)s),
                  %(cap)s::float8) AS cap,
         coalesce((SELECT backoff_base_seconds FROM jobq.queue_state WHERE queue_name = %(queue)s),
                  %(base)s::float8) AS base
  FROM (SELECT clock_timestamp() AS now) c
), failed AS (
  UPDATE jobq.jobs AS j
  SET status = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
      -- Retry later: the caller's delay, else exponential backoff with "equal jitter" (half fixed,
      -- half random) so that jobs failed together do not come back together.
      run_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts
                    THEN to_timestamp(st.epoch + coalesce(%(retry_in)s::float8,
                         least(st.cap, st.base * power(2, least(j.attempts - 1, 60))) * (0.5 + st.draw / 2)))
                    ELSE j.run_at END,
      finished_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN NULL ELSE st.now END,
      lease_expires_at = NULL,
      last_error = %(error)s
  FROM stamp st
  WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND j.status = (SELECT 'running'::text) AND j.claim_token = %(token)s
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  RETURNING j.*, j.queue_name AS queue
)

SELECT 0 AS ord, true AS written, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM failed j
UNION ALL
-- Else the row as found (to tell why not); a job outside the caller's queues is not found.
SELECT 0, false, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  AND NOT EXISTS (SELECT FROM failed)

-- name: JOB_COMPLETE_MANY --
WITH input AS (
  SELECT * FROM json_to_recordset(%(items)s::json)
    AS t(ord int, id bigint, token text, result jsonb, allowed text)
), stamp AS (SELECT c.now, extract(epoch FROM c.now) AS epoch FROM (SELECT clock_timestamp() AS now) c
), done AS (
  UPDATE jobq.jobs AS j
  SET status = 'completed', finished_at = st.now, lease_expires_at = NULL, result = i.result
  -- The same job and token twice in one statement (a retry coalesced with its original): the first
  -- item's result is kept, as for a retry that comes later.
  FROM (SELECT DISTINCT ON (id, token) * FROM input ORDER BY id, token, ord) i, stamp st
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id
    AND j.status = (SELECT 'running'::text) AND j.claim_token = i.token AND (i.allowed IS NULL OR split_part(j.queue_name, '#', 1) ~ i.allowed)
  RETURNING j.*, j.queue_name AS queue
), counted AS (
  INSERT INTO jobq.queue_counts AS c (queue_name, status, shard, n)
  SELECT queue, 'completed', mod(pg_backend_pid(), 64), sum(1)
  FROM done
  WHERE 'completed' IN ('completed', 'failed', 'cancelled')
  GROUP BY 1, 2
  ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n
), recorded AS (
  INSERT INTO jobq.dependency_releases (queue_name, job_id, status)
  SELECT queue, id, status FROM done
  WHERE has_dependants AND status IN ('completed', 'failed', 'cancelled')
)

SELECT i.ord, true AS written, j.id, j.queue_name AS queue, j.status, CASE WHEN %(full)s THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN %(full)s THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM input i JOIN done j ON j.id = i.id AND j.claim_token = i.token
UNION ALL
SELECT i.ord, false, c.*
FROM input i
LEFT JOIN LATERAL (
  SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN %(full)s THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN %(full)s THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.id = i.id AND (i.allowed IS NULL OR split_part(j.queue_name, '#', 1) ~ i.allowed)
  OFFSET 0
) c ON true
WHERE NOT EXISTS (SELECT FROM done d WHERE d.id = i.id AND d.claim_token = i.token)
ORDER BY 1

-- name: JOB_COMPLETE_MANY_CITUS --
WITH input AS (
  SELECT * FROM json_to_recordset(%(items)s::json)
    AS t(ord int, id bigint, token text, result jsonb, allowed text)
), stamp AS (SELECT c.now, extract(epoch FROM c.now) AS epoch FROM (SELECT clock_timestamp() AS now) c
), done AS (
  UPDATE jobq.jobs AS j
  SET status = 'completed', finished_at = st.now, lease_expires_at = NULL, result = i.result
  -- The same job and token twice in one statement (a retry coalesced with its original): the first
  -- item's result is kept, as for a retry that comes later.
  FROM (SELECT DISTINCT ON (id, token) * FROM input ORDER BY id, token, ord) i, stamp st
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id
    AND j.status = (SELECT 'running'::text) AND j.claim_token = i.token AND (i.allowed IS NULL OR split_part(j.queue_name, '#', 1) ~ i.allowed)
  RETURNING j.*, j.queue_name AS queue
)

SELECT i.ord, true AS written, j.id, j.queue_name AS queue, j.status, CASE WHEN %(full)s THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN %(full)s THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM input i JOIN done j ON j.id = i.id AND j.claim_token = i.token
UNION ALL
SELECT i.ord, false, c.*
FROM input i
LEFT JOIN LATERAL (
  SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN %(full)s THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN %(full)s THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.id = i.id AND (i.allowed IS NULL OR split_part(j.queue_name, '#', 1) ~ i.allowed)
  OFFSET 0
) c ON true
WHERE NOT EXISTS (SELECT FROM done d WHERE d.id = i.id AND d.claim_token = i.token)
ORDER BY 1

-- name: JOB_FAIL --
WITH stamp AS (
  -- The clock, a random draw, and the queue's backoff settings (queue_state, one lookup by key) else the
  -- global ones.
  SELECT c.now, extract(epoch FROM c.now) AS epoch, random() AS draw,
         coalesce((SELECT backoff_max_seconds FROM jobq.queue_state WHERE queue_name = %(queue)s),
                  %(cap)s::float8) AS cap,
         coalesce((SELECT backoff_base_seconds FROM jobq.queue_state WHERE queue_name = %(queue)s),
                  %(base)s::float8) AS base
  FROM (SELECT clock_timestamp() AS now) c
), failed AS (
  UPDATE jobq.jobs AS j
  SET status = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
      -- Retry later: the caller's delay, else exponential backoff with "equal jitter" (half fixed,
      -- half random) so that jobs failed together do not come back together.
      run_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts
                    THEN to_timestamp(st.epoch + coalesce(%(retry_in)s::float8,
                         least(st.cap, st.base * power(2, least(j.attempts - 1, 60))) * (0.5 + st.draw / 2)))
                    ELSE j.run_at END,
      finished_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN NULL ELSE st.now END,
      lease_expires_at = NULL,
      last_error = %(error)s
  FROM stamp st
  WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND j.status = (SELECT 'running'::text) AND j.claim_token = %(token)s
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  RETURNING j.*, j.queue_name AS queue
), counted AS (
  INSERT INTO jobq.queue_counts AS c (queue_name, status, shard, n)
  SELECT queue, status, mod(pg_backend_pid(), 64), sum(1)
  FROM failed
  WHERE status IN ('completed', 'failed', 'cancelled')
  GROUP BY 1, 2
  ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n
), recorded AS (
  INSERT INTO jobq.dependency_releases (queue_name, job_id, status)
  SELECT queue, id, status FROM failed
  WHERE has_dependants AND status IN ('completed', 'failed', 'cancelled')
)

SELECT 0 AS ord, true AS written, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM failed j
UNION ALL
-- Else the row as found (to tell why not); a job outside the caller's queues is not found.
SELECT 0, false, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  AND NOT EXISTS (SELECT FROM failed)

-- name: JOB_FAIL_CITUS --
WITH stamp AS (
  -- The clock, a random draw, and the queue's backoff settings (queue_state, one lookup by key) else the
  -- global ones.
  SELECT c.now, extract(epoch FROM c.now) AS epoch, random() AS draw,
         coalesce((SELECT backoff_max_seconds FROM jobq.queue_state WHERE queue_name = %(queue)s),
                  %(cap)s::float8) AS cap,
         coalesce((SELECT backoff_base_seconds FROM jobq.queue_state WHERE queue_name = %(queue)s),
                  %(base)s::float8) AS base
  FROM (SELECT clock_timestamp() AS now) c
), failed AS (
  UPDATE jobq.jobs AS j
  SET status = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
      -- Retry later: the caller's delay, else exponential backoff with "equal jitter" (half fixed,
      -- half random) so that jobs failed together do not come back together.
      run_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts
                    THEN to_timestamp(st.epoch + coalesce(%(retry_in)s::float8,
                         least(st.cap, st.base * power(2, least(j.attempts - 1, 60))) * (0.5 + st.draw / 2)))
                    ELSE j.run_at END,
      finished_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN NULL ELSE st.now END,
      lease_expires_at = NULL,
      last_error = %(error)s
  FROM stamp st
  WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND j.status = (SELECT 'running'::text) AND j.claim_token = %(token)s
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  RETURNING j.*, j.queue_name AS queue
)

SELECT 0 AS ord, true AS written, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM failed j
UNION ALL
-- Else the row as found (to tell why not); a job outside the caller's queues is not found.
SELECT 0, false, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  AND NOT EXISTS (SELECT FROM failed)

-- name: JOB_HEARTBEAT_MANY --
WITH input AS (
  SELECT * FROM json_to_recordset(%(beats)s::json)
    AS t(ord int, id bigint, token text, lease int, allowed text, progress text, set_progress bool, writes bool)
), stamp AS (SELECT c.now, extract(epoch FROM c.now) AS epoch FROM (SELECT clock_timestamp() AS now) c
), renewed AS (
  -- Guarded by id + token + running (a stale claim renews nothing) + the caller's queues. A beat that
  -- carries progress replaces the job's (JSON null clears it); one without leaves it as it is. Beats of
  -- one claim that share this statement write once, through the one that `writes` (see jobs_heartbeat).
  UPDATE jobq.jobs AS j
  SET lease_expires_at = to_timestamp(st.epoch + coalesce(i.lease, j.lease_seconds)),
      lease_seconds = coalesce(i.lease, j.lease_seconds),
      progress = CASE WHEN i.set_progress THEN i.progress::jsonb ELSE j.progress END
  FROM input i, stamp st
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id AND i.writes
    AND j.status = (SELECT 'running'::text) AND j.claim_token = i.token AND (i.allowed IS NULL OR split_part(j.queue_name, '#', 1) ~ i.allowed)
  RETURNING j.id, j.claim_token, j.lease_expires_at, j.locked_by, j.queue_name
)
-- Per input: the new expiry, else the job's state as this statement found it (to tell why not); a job
-- outside the caller's queues is not found.
-- The worker and queue of a renewed claim go to the worker registry (app/core/workers.py).
SELECT i.ord, r.lease_expires_at, c.status, c.claim_token, r.locked_by AS worker, r.queue_name AS queue
FROM input i
LEFT JOIN renewed r ON r.id = i.id AND r.claim_token = i.token
LEFT JOIN LATERAL (
  SELECT j.status, j.claim_token FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.id = i.id AND (i.allowed IS NULL OR split_part(j.queue_name, '#', 1) ~ i.allowed)
  OFFSET 0
) c ON r.id IS NULL
ORDER BY i.ord

-- name: JOB_QUEUES --
SELECT id, queue_name FROM jobq.jobs WHERE id = ANY(%(ids)s)

-- name: JOB_RELEASE --
-- Claimed for a request that went away before it could be answered (timeout, disconnect, shutdown):
-- hand the job straight back. The attempt is returned too, since no worker ever saw the job. One queue's claims.
WITH r AS (SELECT * FROM json_to_recordset(%(claims)s::json) AS r(id bigint, token text))
UPDATE jobq.jobs AS j
SET status = 'pending', attempts = j.attempts - 1, lease_expires_at = NULL, claim_token = NULL
FROM r
WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM r)) AND j.id = r.id AND j.claim_token = r.token
  AND j.status = (SELECT 'running'::text)

-- name: JOB_RELEASE_CLAIM --
WITH stamp AS (SELECT clock_timestamp() + make_interval(secs => %(delay)s::float8) AS run_at
), released AS (
  -- A worker hands back a job it did not try (shutting down, lacking a resource). Guarded like fail:
  -- id + token + running + the caller's queues. The claim counted an attempt; untried, it is given
  -- back, so the attempt budget and last_error stay as they were. The token, lease and claimed_at go
  -- with the claim: a repeated release finds no claim (409), as would any other write with it.
  UPDATE jobq.jobs AS j
  SET status = 'pending', attempts = j.attempts - 1,
      run_at = st.run_at, claimed_at = NULL, lease_expires_at = NULL, claim_token = NULL
  FROM stamp st
  WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND j.status = (SELECT 'running'::text) AND j.claim_token = %(token)s
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  RETURNING j.*, j.queue_name AS queue
)

SELECT 0 AS ord, true AS written, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM released j
UNION ALL
-- Else the row as found (to tell why not); a job outside the caller's queues is not found.
SELECT 0, false, j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  AND NOT EXISTS (SELECT FROM released)

-- name: STAMP --
SELECT c.now, extract(epoch FROM c.now) AS epoch FROM (SELECT clock_timestamp() AS now) c
