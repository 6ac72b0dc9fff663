-- Rendered from app/db/operations.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: JOBS_LIST[<Status.cancelled: 'cancelled'>] --
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.status = %(status)s AND j.finished_at IS NOT NULL
  AND (%(after)s::boolean IS NOT TRUE OR (j.finished_at, j.id) < (%(k1)s::timestamptz, %(k2)s::bigint))
ORDER BY j.finished_at DESC, j.id DESC
LIMIT %(limit)s

-- name: JOBS_LIST[<Status.completed: 'completed'>] --
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.status = %(status)s AND j.finished_at IS NOT NULL
  AND (%(after)s::boolean IS NOT TRUE OR (j.finished_at, j.id) < (%(k1)s::timestamptz, %(k2)s::bigint))
ORDER BY j.finished_at DESC, j.id DESC
LIMIT %(limit)s

-- name: JOBS_LIST[<Status.failed: 'failed'>] --
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.status = %(status)s AND j.finished_at IS NOT NULL
  AND (%(after)s::boolean IS NOT TRUE OR (j.finished_at, j.id) < (%(k1)s::timestamptz, %(k2)s::bigint))
ORDER BY j.finished_at DESC, j.id DESC
LIMIT %(limit)s

-- name: JOBS_LIST[<Status.pending: 'pending'>] --
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.status = 'pending'
  AND (%(after)s::boolean IS NOT TRUE
       OR j.priority < %(k1)s::int
       OR (j.priority = %(k1)s::int AND (j.run_at, j.id) > (%(k2)s::timestamptz, %(k3)s::bigint)))
ORDER BY j.priority DESC, j.run_at, j.id
LIMIT %(limit)s

-- name: JOBS_LIST[<Status.running: 'running'>] --
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.status = 'running'
  AND (%(after)s::boolean IS NOT TRUE OR (j.lease_expires_at, j.id) > (%(k1)s::timestamptz, %(k2)s::bigint))
ORDER BY j.lease_expires_at, j.id
LIMIT %(limit)s

-- name: JOBS_LIST[<Status.waiting: 'waiting'>] --
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.status = 'waiting'
  AND (%(after)s::boolean IS NOT TRUE OR j.id > %(k1)s::bigint)
ORDER BY j.id
LIMIT %(limit)s

-- name: JOBS_LIST[None] --
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND (%(after)s::boolean IS NOT TRUE OR j.id < %(k1)s::bigint)
ORDER BY j.id DESC
LIMIT %(limit)s

-- name: NO_SEQSCAN --
SET LOCAL enable_seqscan = off

-- name: QUEUES_NAMED --
WITH names AS (SELECT unnest(%(names)s::text[]) AS name)

SELECT n.name AS queue,
       CASE WHEN p.big THEN e.ready WHEN p.n < x.over THEN p.ready ELSE greatest(e.ready, p.ready) END AS ready,
       CASE WHEN p.big THEN e.scheduled WHEN p.n < x.over THEN p.scheduled ELSE greatest(e.scheduled, p.scheduled)
       END AS scheduled,
       CASE WHEN r.big THEN e.running WHEN r.n < x.over THEN r.n ELSE greatest(e.running, r.n) END AS running,
       coalesce(f.completed, 0)::bigint AS completed, coalesce(f.failed, 0)::bigint AS failed,
       coalesce(f.cancelled, 0)::bigint AS cancelled,
       extract(epoch FROM now() - CASE WHEN p.big OR p.n >= x.over THEN least(e.oldest_ready, p.oldest_ready)
                                       ELSE p.oldest_ready END)::float8 AS oldest_ready_age,
       coalesce((SELECT s.paused FROM jobq.queue_state s WHERE s.queue_name = n.name), false) AS paused,
       CASE WHEN w.big THEN e.waiting WHEN w.n < x.over THEN w.n ELSE greatest(e.waiting, w.n) END AS waiting,
       p.big OR r.big OR w.big OR greatest(p.n, r.n, w.n) >= x.over AS estimated,
       CASE WHEN p.big OR r.big OR w.big OR greatest(p.n, r.n, w.n) >= x.over THEN e.counted_at END AS counted_at,
       coalesce((SELECT s.keys_used FROM jobq.queue_state s WHERE s.queue_name = n.name), 1)::int AS keys_used
FROM names n
-- The background's count of the queue (app/db/live_counts.py): a kind it found past the exact maximum is not
-- read again here (each such read would stop at the maximum anyway); the others are counted up to it.
LEFT JOIN jobq.queue_live_counts e ON e.queue_name = n.name
-- A queue the background has not counted (new, or empty at its last count) is read up to the whole maximum: such
-- queues are few, and a small share of it could take a few high-priority jobs due later for all there is.
CROSS JOIN LATERAL (SELECT CASE WHEN e.queue_name IS NULL THEN %(over_new)s::int ELSE %(over)s::int END AS over,
                           -- recent enough to stand for a kind without a read (live_counts.trusted_seconds)
                           coalesce(e.counted_at > now() - make_interval(secs => %(trust)s::float8), false) AS fresh) x
CROSS JOIN LATERAL (
  -- Index-only over jobs_claim_idx, in its order: ready vs scheduled among the first x.over pending jobs.
  SELECT count(*) AS n, count(*) FILTER (WHERE j.run_at <= now()) AS ready,
         count(*) FILTER (WHERE j.run_at > now()) AS scheduled,
         min(j.run_at) FILTER (WHERE j.run_at <= now()) AS oldest_ready,
         coalesce(x.fresh AND e.ready + e.scheduled > x.over - 1, false) AS big
  FROM (SELECT j.run_at FROM jobq.jobs j WHERE j.queue_name = n.name AND j.status = 'pending'
          AND coalesce(NOT x.fresh OR e.ready + e.scheduled <= x.over - 1, true)
        ORDER BY j.priority DESC, j.run_at, j.id LIMIT x.over) j
) p
CROSS JOIN LATERAL (
  SELECT count(*) AS n, coalesce(x.fresh AND e.running > x.over - 1, false) AS big
  FROM (SELECT 1 FROM jobq.jobs j WHERE j.queue_name = n.name AND j.status = 'running' COLLATE "C"
          AND coalesce(NOT x.fresh OR e.running <= x.over - 1, true) LIMIT x.over) j
) r
CROSS JOIN LATERAL (
  SELECT count(*) AS n, coalesce(x.fresh AND e.waiting > x.over - 1, false) AS big
  FROM (SELECT 1 FROM jobq.jobs j WHERE j.queue_name = n.name AND j.status = 'waiting'
          AND coalesce(NOT x.fresh OR e.waiting <= x.over - 1, true) ORDER BY j.id LIMIT x.over) j
) w
LEFT JOIN LATERAL (
  SELECT sum(c.n) FILTER (WHERE c.status = 'completed') AS completed,
         sum(c.n) FILTER (WHERE c.status = 'failed') AS failed,
         sum(c.n) FILTER (WHERE c.status = 'cancelled') AS cancelled
  FROM jobq.queue_counts c WHERE c.queue_name = n.name
) f ON true
ORDER BY n.name

-- name: QUEUES_NAMED_FANOUT --
WITH names AS (SELECT unnest(%(names)s::text[]) AS name), pending AS (
  SELECT queue_name, count(*) FILTER (WHERE run_at <= now()) AS ready,
         count(*) FILTER (WHERE run_at > now()) AS scheduled,
         min(run_at) FILTER (WHERE run_at <= now()) AS oldest_ready
  FROM jobq.jobs WHERE status = 'pending' AND queue_name IN (SELECT name FROM names) GROUP BY queue_name
), running AS (
  SELECT queue_name, count(*) AS running FROM jobq.jobs
  WHERE status = 'running' COLLATE "C" AND queue_name IN (SELECT name FROM names) GROUP BY queue_name
), waiting AS (
  SELECT queue_name, count(*) AS waiting FROM jobq.jobs
  WHERE status = 'waiting' AND queue_name IN (SELECT name FROM names) GROUP BY queue_name
), finished AS (
  SELECT queue_name, sum(n) FILTER (WHERE status = 'completed') AS completed,
         sum(n) FILTER (WHERE status = 'failed') AS failed,
         sum(n) FILTER (WHERE status = 'cancelled') AS cancelled
  FROM jobq.queue_counts WHERE queue_name IN (SELECT name FROM names) GROUP BY queue_name
)
SELECT n.name AS queue, coalesce(p.ready, 0) AS ready, coalesce(p.scheduled, 0) AS scheduled,
       coalesce(r.running, 0) AS running, coalesce(f.completed, 0)::bigint AS completed,
       coalesce(f.failed, 0)::bigint AS failed, coalesce(f.cancelled, 0)::bigint AS cancelled,
       extract(epoch FROM now() - p.oldest_ready)::float8 AS oldest_ready_age,
       coalesce(s.paused, false) AS paused, coalesce(w.waiting, 0) AS waiting,
       false AS estimated, NULL::timestamptz AS counted_at, coalesce(s.keys_used, 1)::int AS keys_used
FROM names n
LEFT JOIN pending p ON p.queue_name = n.name
LEFT JOIN running r ON r.queue_name = n.name
LEFT JOIN waiting w ON w.queue_name = n.name
LEFT JOIN finished f ON f.queue_name = n.name
LEFT JOIN jobq.queue_state s ON s.queue_name = n.name
ORDER BY n.name

-- name: QUEUES_PAGE --
WITH RECURSIVE
  pending_walk(name, seen) AS (
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = 'pending' AND queue_name > %(after)s::text ORDER BY queue_name LIMIT 1), 0
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = 'pending' AND queue_name > w.name ORDER BY queue_name LIMIT 1),
         w.seen + (CASE WHEN strpos(w.name, '#') = 0 AND (%(allowed)s::text IS NULL OR w.name ~ %(allowed)s::text)
                        THEN 1 ELSE 0 END)
  FROM pending_walk w WHERE w.name IS NOT NULL AND w.seen < %(n)s
),
  waiting_walk(name, seen) AS (
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = 'waiting' AND queue_name > %(after)s::text ORDER BY queue_name LIMIT 1), 0
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = 'waiting' AND queue_name > w.name ORDER BY queue_name LIMIT 1),
         w.seen + (CASE WHEN strpos(w.name, '#') = 0 AND (%(allowed)s::text IS NULL OR w.name ~ %(allowed)s::text)
                        THEN 1 ELSE 0 END)
  FROM waiting_walk w WHERE w.name IS NOT NULL AND w.seen < %(n)s
),
  running_walk(name, seen) AS (
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = 'running' COLLATE "C" AND queue_name > %(after)s::text ORDER BY queue_name LIMIT 1), 0
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = 'running' COLLATE "C" AND queue_name > w.name ORDER BY queue_name LIMIT 1),
         w.seen + (CASE WHEN strpos(w.name, '#') = 0 AND (%(allowed)s::text IS NULL OR w.name ~ %(allowed)s::text)
                        THEN 1 ELSE 0 END)
  FROM running_walk w WHERE w.name IS NOT NULL AND w.seen < %(n)s
),
  finished_walk(name, seen) AS (
  SELECT (SELECT queue_name FROM jobq.queue_counts WHERE true AND queue_name > %(after)s::text ORDER BY queue_name LIMIT 1), 0
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.queue_counts WHERE true AND queue_name > w.name ORDER BY queue_name LIMIT 1),
         w.seen + (CASE WHEN strpos(w.name, '#') = 0 AND (%(allowed)s::text IS NULL OR w.name ~ %(allowed)s::text)
                        THEN 1 ELSE 0 END)
  FROM finished_walk w WHERE w.name IS NOT NULL AND w.seen < %(n)s
),
  names AS (
    SELECT name FROM (
      SELECT name FROM pending_walk UNION SELECT name FROM waiting_walk UNION SELECT name FROM running_walk
      UNION SELECT name FROM finished_walk
      UNION (SELECT queue_name FROM jobq.queue_state
             WHERE queue_name > %(after)s::text AND (%(allowed)s::text IS NULL OR queue_name ~ %(allowed)s::text)
               AND strpos(queue_name, '#') = 0
             ORDER BY queue_name LIMIT %(n)s)
    ) u
    WHERE name IS NOT NULL AND (%(allowed)s::text IS NULL OR name ~ %(allowed)s::text) AND strpos(name, '#') = 0
    ORDER BY name
    LIMIT %(n)s
  )

SELECT n.name AS queue,
       CASE WHEN p.big THEN e.ready WHEN p.n < x.over THEN p.ready ELSE greatest(e.ready, p.ready) END AS ready,
       CASE WHEN p.big THEN e.scheduled WHEN p.n < x.over THEN p.scheduled ELSE greatest(e.scheduled, p.scheduled)
       END AS scheduled,
       CASE WHEN r.big THEN e.running WHEN r.n < x.over THEN r.n ELSE greatest(e.running, r.n) END AS running,
       coalesce(f.completed, 0)::bigint AS completed, coalesce(f.failed, 0)::bigint AS failed,
       coalesce(f.cancelled, 0)::bigint AS cancelled,
       extract(epoch FROM now() - CASE WHEN p.big OR p.n >= x.over THEN least(e.oldest_ready, p.oldest_ready)
                                       ELSE p.oldest_ready END)::float8 AS oldest_ready_age,
       coalesce((SELECT s.paused FROM jobq.queue_state s WHERE s.queue_name = n.name), false) AS paused,
       CASE WHEN w.big THEN e.waiting WHEN w.n < x.over THEN w.n ELSE greatest(e.waiting, w.n) END AS waiting,
       p.big OR r.big OR w.big OR greatest(p.n, r.n, w.n) >= x.over AS estimated,
       CASE WHEN p.big OR r.big OR w.big OR greatest(p.n, r.n, w.n) >= x.over THEN e.counted_at END AS counted_at,
       coalesce((SELECT s.keys_used FROM jobq.queue_state s WHERE s.queue_name = n.name), 1)::int AS keys_used
FROM names n
-- The background's count of the queue (app/db/live_counts.py): a kind it found past the exact maximum is not
-- read again here (each such read would stop at the maximum anyway); the others are counted up to it.
LEFT JOIN jobq.queue_live_counts e ON e.queue_name = n.name
-- A queue the background has not counted (new, or empty at its last count) is read up to the whole maximum: such
-- queues are few, and a small share of it could take a few high-priority jobs due later for all there is.
CROSS JOIN LATERAL (SELECT CASE WHEN e.queue_name IS NULL THEN %(over_new)s::int ELSE %(over)s::int END AS over,
                           -- recent enough to stand for a kind without a read (live_counts.trusted_seconds)
                           coalesce(e.counted_at > now() - make_interval(secs => %(trust)s::float8), false) AS fresh) x
CROSS JOIN LATERAL (
  -- Index-only over jobs_claim_idx, in its order: ready vs scheduled among the first x.over pending jobs.
  SELECT count(*) AS n, count(*) FILTER (WHERE j.run_at <= now()) AS ready,
         count(*) FILTER (WHERE j.run_at > now()) AS scheduled,
         min(j.run_at) FILTER (WHERE j.run_at <= now()) AS oldest_ready,
         coalesce(x.fresh AND e.ready + e.scheduled > x.over - 1, false) AS big
  FROM (SELECT j.run_at FROM jobq.jobs j WHERE j.queue_name = n.name AND j.status = 'pending'
          AND coalesce(NOT x.fresh OR e.ready + e.scheduled <= x.over - 1, true)
        ORDER BY j.priority DESC, j.run_at, j.id LIMIT x.over) j
) p
CROSS JOIN LATERAL (
  SELECT count(*) AS n, coalesce(x.fresh AND e.running > x.over - 1, false) AS big
  FROM (SELECT 1 FROM jobq.jobs j WHERE j.queue_name = n.name AND j.status = 'running' COLLATE "C"
          AND coalesce(NOT x.fresh OR e.running <= x.over - 1, true) LIMIT x.over) j
) r
CROSS JOIN LATERAL (
  SELECT count(*) AS n, coalesce(x.fresh AND e.waiting > x.over - 1, false) AS big
  FROM (SELECT 1 FROM jobq.jobs j WHERE j.queue_name = n.name AND j.status = 'waiting'
          AND coalesce(NOT x.fresh OR e.waiting <= x.over - 1, true) ORDER BY j.id LIMIT x.over) j
) w
LEFT JOIN LATERAL (
  SELECT sum(c.n) FILTER (WHERE c.status = 'completed') AS completed,
         sum(c.n) FILTER (WHERE c.status = 'failed') AS failed,
         sum(c.n) FILTER (WHERE c.status = 'cancelled') AS cancelled
  FROM jobq.queue_counts c WHERE c.queue_name = n.name
) f ON true
ORDER BY n.name

-- name: QUEUES_PAGE_FANOUT --
WITH names AS (
  SELECT name FROM (
    SELECT queue_name AS name FROM jobq.jobs
    WHERE status IN ('pending', 'waiting', 'running') AND queue_name > %(after)s::text GROUP BY queue_name
    UNION SELECT queue_name FROM jobq.queue_counts WHERE queue_name > %(after)s::text GROUP BY queue_name
    UNION SELECT queue_name FROM jobq.queue_state WHERE queue_name > %(after)s::text
  ) u
  WHERE (%(allowed)s::text IS NULL OR name ~ %(allowed)s::text) AND strpos(name, '#') = 0
  ORDER BY name
  LIMIT %(n)s
), pending AS (
  SELECT queue_name, count(*) FILTER (WHERE run_at <= now()) AS ready,
         count(*) FILTER (WHERE run_at > now()) AS scheduled,
         min(run_at) FILTER (WHERE run_at <= now()) AS oldest_ready
  FROM jobq.jobs WHERE status = 'pending' AND queue_name IN (SELECT name FROM names) GROUP BY queue_name
), running AS (
  SELECT queue_name, count(*) AS running FROM jobq.jobs
  WHERE status = 'running' COLLATE "C" AND queue_name IN (SELECT name FROM names) GROUP BY queue_name
), waiting AS (
  SELECT queue_name, count(*) AS waiting FROM jobq.jobs
  WHERE status = 'waiting' AND queue_name IN (SELECT name FROM names) GROUP BY queue_name
), finished AS (
  SELECT queue_name, sum(n) FILTER (WHERE status = 'completed') AS completed,
         sum(n) FILTER (WHERE status = 'failed') AS failed,
         sum(n) FILTER (WHERE status = 'cancelled') AS cancelled
  FROM jobq.queue_counts WHERE queue_name IN (SELECT name FROM names) GROUP BY queue_name
)
SELECT n.name AS queue, coalesce(p.ready, 0) AS ready, coalesce(p.scheduled, 0) AS scheduled,
       coalesce(r.running, 0) AS running, coalesce(f.completed, 0)::bigint AS completed,
       coalesce(f.failed, 0)::bigint AS failed, coalesce(f.cancelled, 0)::bigint AS cancelled,
       extract(epoch FROM now() - p.oldest_ready)::float8 AS oldest_ready_age,
       coalesce(s.paused, false) AS paused, coalesce(w.waiting, 0) AS waiting,
       false AS estimated, NULL::timestamptz AS counted_at, coalesce(s.keys_used, 1)::int AS keys_used
FROM names n
LEFT JOIN pending p ON p.queue_name = n.name
LEFT JOIN running r ON r.queue_name = n.name
LEFT JOIN waiting w ON w.queue_name = n.name
LEFT JOIN finished f ON f.queue_name = n.name
LEFT JOIN jobq.queue_state s ON s.queue_name = n.name
ORDER BY n.name

-- name: QUEUE_GROUPS --
-- The queue's %(top)s groups with the most ready jobs and their running jobs, each kind read up to %(over)s jobs.
WITH seen AS (
  -- Index-only over jobs_group_idx, in its order: the first %(over)s pending jobs that have a group.
  SELECT group_key, run_at FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = 'pending' AND group_key IS NOT NULL
  ORDER BY group_key
  LIMIT %(over)s
), span AS (
  -- whole: every such job was read; else the groups before `last` were.
  SELECT count(*) < %(over)s AS whole, max(group_key) AS last FROM seen
), counted AS (
  SELECT group_key, count(*) FILTER (WHERE run_at <= now()) AS ready FROM seen GROUP BY group_key
), estimate AS (
  -- The background's top groups of the queue, from its last count.
  SELECT group_key, ready, running, counted_at FROM jobq.queue_live_groups WHERE queue_name = %(queue)s
), top AS (
  SELECT m.group_key, m.ready, m.estimated_running FROM (
    SELECT coalesce(c.group_key, e.group_key) AS group_key, e.running AS estimated_running,
           CASE WHEN s.whole OR coalesce(c.group_key, e.group_key) < s.last THEN coalesce(c.ready, 0)
                ELSE greatest(c.ready, e.ready) END AS ready
    FROM counted c FULL JOIN estimate e ON e.group_key = c.group_key CROSS JOIN span s
  ) m
  WHERE m.ready > 0
  ORDER BY m.ready DESC, m.group_key
  LIMIT %(top)s
), running AS (
  -- Index-only over jobs_running_idx: the running jobs of those groups, up to %(over)s in all.
  SELECT group_key FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = 'running' COLLATE "C"
    AND group_key = ANY (ARRAY(SELECT group_key FROM top))
  LIMIT %(over)s
), listed AS (
  SELECT t.group_key, t.ready,
         CASE WHEN (SELECT count(*) FROM running) < %(over)s THEN coalesce(r.n, 0)
              ELSE greatest(coalesce(r.n, 0), t.estimated_running) END AS running
  FROM top t LEFT JOIN (SELECT group_key, count(*) AS n FROM running GROUP BY group_key) r
    ON r.group_key = t.group_key
)
SELECT coalesce((SELECT json_agg(json_build_object('group', group_key, 'ready', ready, 'running', running)
                                 ORDER BY ready DESC, group_key) FROM listed), '[]') AS groups,
       NOT s.whole OR (SELECT count(*) FROM running) >= %(over)s AS estimated,
       -- The background's count that wrote the estimate: queue_live_counts is written in the same transaction, and
       -- tells when a queue without a ready group was counted; the older one if they differ (the groups' part of
       -- a count failed, leaving the groups as they were).
       least((SELECT min(counted_at) FROM estimate),
             (SELECT counted_at FROM jobq.queue_live_counts WHERE queue_name = %(queue)s)) AS counted_at
FROM span s

-- name: QUEUE_STATS --
WITH RECURSIVE 
estimate AS (
  -- The background's count (one row or none: max() makes it one row of nulls). A kind it found past the exact
  -- maximum is not read again here (the read would stop at the maximum anyway: GET /queues does the same); the
  -- others are counted up to it.
  SELECT max(ready) AS ready, max(scheduled) AS scheduled, max(running) AS running, max(waiting) AS waiting,
         max(on_last) AS on_last, max(one_left) AS one_left, max(oldest_ready) AS oldest_ready,
         max(counted_at) AS counted_at
  FROM jobq.queue_live_counts WHERE queue_name = %(queue)s
), trusted AS (
  -- The count when it is recent enough to stand for a kind without a read (live_counts.trusted_seconds); none
  -- otherwise.
  SELECT * FROM estimate WHERE counted_at > now() - make_interval(secs => %(trust)s::float8)
), pending AS (
  -- Index-only over jobs_claim_idx, in its order: ready vs scheduled among the first %(over)s pending jobs.
  SELECT count(*) AS n, count(*) FILTER (WHERE run_at <= now()) AS ready,
         count(*) FILTER (WHERE run_at > now()) AS scheduled,
         coalesce((SELECT ready + scheduled FROM trusted) > %(over)s - 1, false) AS big
  FROM (SELECT run_at FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending'
          AND coalesce((SELECT ready + scheduled FROM trusted) <= %(over)s - 1, true)
        ORDER BY priority DESC, run_at, id LIMIT %(over)s) s
), levels(p, first_run, k) AS (
  SELECT f.priority, f.run_at, 1 FROM (
    SELECT priority, run_at FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending'
    ORDER BY priority DESC, run_at, id LIMIT 1) f
  UNION ALL
  SELECT x.priority, x.run_at, l.k + 1 FROM levels l CROSS JOIN LATERAL (
    SELECT priority, run_at FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending' AND priority < l.p
    ORDER BY priority DESC, run_at, id LIMIT 1) x
  WHERE l.k <= 100
), oldest AS (
  -- Past 100 levels (the walk looks at one more to know), the background's figure may be older still.
  SELECT min(first_run) FILTER (WHERE first_run <= now()) AS ready_at, count(*) > 100 AS partial FROM levels
), running AS (
  SELECT count(*) AS n, coalesce((SELECT running FROM trusted) > %(over)s - 1, false) AS big
  FROM (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'running' COLLATE "C"
          AND coalesce((SELECT running FROM trusted) <= %(over)s - 1, true)
        LIMIT %(over)s) s
), waiting AS (
  -- Index-only over jobs_waiting_idx: jobs waiting for their dependencies.
  SELECT count(*) AS n, coalesce((SELECT waiting FROM trusted) > %(over)s - 1, false) AS big
  FROM (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'waiting'
          AND coalesce((SELECT waiting FROM trusted) <= %(over)s - 1, true)
        ORDER BY id LIMIT %(over)s) s
), last_attempts AS (
  -- jobs_last_attempts_idx holds exactly these rows.
  SELECT count(*) AS n, count(*) FILTER (WHERE attempts >= max_attempts) AS on_last,
         count(*) FILTER (WHERE attempts = max_attempts - 1) AS one_left,
         coalesce((SELECT on_last + one_left FROM trusted) > %(over)s - 1, false) AS big
  FROM (SELECT attempts, max_attempts FROM jobq.jobs
        WHERE queue_name = %(queue)s AND status IN ('pending', 'running') AND attempts >= max_attempts - 1
          AND coalesce((SELECT on_last + one_left FROM trusted) <= %(over)s - 1, true)
        LIMIT %(over)s) s
), live AS (
  SELECT CASE WHEN p.big THEN e.ready WHEN p.n < %(over)s THEN p.ready ELSE greatest(e.ready, p.ready) END AS ready,
         CASE WHEN p.big THEN e.scheduled WHEN p.n < %(over)s THEN p.scheduled
              ELSE greatest(e.scheduled, p.scheduled) END AS scheduled,
         CASE WHEN o.partial THEN least(o.ready_at, e.oldest_ready) ELSE o.ready_at END AS oldest_ready,
         CASE WHEN r.big THEN e.running WHEN r.n < %(over)s THEN r.n ELSE greatest(e.running, r.n) END AS running,
         CASE WHEN w.big THEN e.waiting WHEN w.n < %(over)s THEN w.n ELSE greatest(e.waiting, w.n) END AS waiting,
         CASE WHEN l.big THEN e.on_last WHEN l.n < %(over)s THEN l.on_last ELSE greatest(e.on_last, l.on_last)
         END AS on_last,
         CASE WHEN l.big THEN e.one_left WHEN l.n < %(over)s THEN l.one_left ELSE greatest(e.one_left, l.one_left)
         END AS one_left,
         p.big OR r.big OR w.big OR l.big OR greatest(p.n, r.n, w.n, l.n) >= %(over)s OR o.partial AS estimated,
         e.counted_at
  FROM estimate e, pending p, oldest o, running r, waiting w, last_attempts l
), finished AS (
  -- Kept exact by the statements that finish jobs (see app/db/jobs.py count_finished): no scan of history.
  SELECT coalesce(sum(n) FILTER (WHERE status = 'completed'), 0) AS completed,
         coalesce(sum(n) FILTER (WHERE status = 'failed'), 0) AS failed,
         coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0) AS cancelled
  FROM jobq.queue_counts WHERE queue_name = %(queue)s
), window_ AS (
  SELECT coalesce(sum(enqueued), 0) AS enqueued, coalesce(sum(claimed), 0) AS claimed,
         coalesce(sum(completed), 0) AS completed, coalesce(sum(failed), 0) AS failed,
         coalesce(sum(retried), 0) AS retried, coalesce(sum(lease_expired), 0) AS lease_expired,
         coalesce(sum(cancelled), 0) AS cancelled, coalesce(sum(released), 0) AS released,
         coalesce(sum(empty_claims), 0) AS empty_claims,
         coalesce(sum(held_concurrency), 0) AS held_concurrency, coalesce(sum(held_rate), 0) AS held_rate,
         coalesce(sum(held_group_concurrency), 0) AS held_group_concurrency,
         coalesce(sum(held_group_rate), 0) AS held_group_rate, coalesce(sum(held_ordered), 0) AS held_ordered,
         max(duration_max_ms) AS duration_max_ms,
         (SELECT array_agg(total ORDER BY i) FROM (
            SELECT i, sum(v)::bigint AS total
            FROM jobq.queue_stats q2, unnest(q2.durations_ms) WITH ORDINALITY AS u(v, i)
            WHERE q2.queue_name = %(queue)s AND q2.minute > now() - make_interval(secs => %(window)s)
            GROUP BY i) h) AS durations_ms
  FROM jobq.queue_stats
  WHERE queue_name = %(queue)s AND minute > now() - make_interval(secs => %(window)s)
)
SELECT v.ready, v.scheduled, extract(epoch FROM now() - v.oldest_ready)::float8 AS oldest_ready_age,
       v.running, f.completed::bigint, f.failed::bigint, f.cancelled::bigint, v.on_last, v.one_left,
       w.enqueued::bigint AS w_enqueued, w.claimed::bigint AS w_claimed, w.completed::bigint AS w_completed,
       w.failed::bigint AS w_failed, w.retried::bigint AS w_retried, w.lease_expired::bigint AS w_lease_expired,
       w.cancelled::bigint AS w_cancelled, w.released::bigint AS w_released,
       w.empty_claims::bigint AS w_empty_claims, w.duration_max_ms AS w_duration_max_ms,
       w.durations_ms AS w_durations_ms,
       coalesce((SELECT paused FROM jobq.queue_state WHERE queue_name = %(queue)s), false) AS paused,
       now() AS as_of,
       w.held_concurrency::bigint AS w_held_concurrency, w.held_rate::bigint AS w_held_rate,
       w.held_group_concurrency::bigint AS w_held_group_concurrency,
       w.held_group_rate::bigint AS w_held_group_rate, w.held_ordered::bigint AS w_held_ordered,
       v.waiting, v.estimated, v.counted_at
FROM live v, finished f, window_ w

-- name: STATS_ADD --
-- Add one process's counts since its last flush (a second ago) to the current minute; concurrent flushes
-- from replicas add up. The minute is the database's: an API host whose clock is off files nothing under
-- a minute that the windows of /stats, which read now(), would never look at.
INSERT INTO jobq.queue_stats AS s (queue_name, minute, enqueued, claimed, completed, failed, retried, lease_expired,
                              cancelled, released, empty_claims, duration_max_ms, durations_ms, held_concurrency,
                              held_rate, held_group_concurrency, held_group_rate, held_ordered)
SELECT queue_name, date_trunc('minute', now()), enqueued, claimed, completed, failed, retried, lease_expired,
       cancelled, released, empty_claims, duration_max_ms, durations_ms, held_concurrency, held_rate,
       held_group_concurrency, held_group_rate, held_ordered
FROM json_to_recordset(%(rows)s::json) AS t(queue_name text, enqueued bigint, claimed bigint,
     completed bigint, failed bigint, retried bigint, lease_expired bigint, cancelled bigint, released bigint,
     empty_claims bigint, duration_max_ms float8, durations_ms bigint[], held_concurrency bigint,
     held_rate bigint, held_group_concurrency bigint, held_group_rate bigint, held_ordered bigint)
-- Rows in one global order, as the backlog sample (app/db/history.py) takes them: flushes of several
-- replicas, and a flush beside a sample, update the same rows without waiting on each other in a cycle.
-- (One flush files every row under the same minute: the queue name is the whole order.)
ORDER BY queue_name COLLATE "C"
ON CONFLICT (queue_name, minute) DO UPDATE SET
  held_concurrency = s.held_concurrency + EXCLUDED.held_concurrency,
  held_rate = s.held_rate + EXCLUDED.held_rate,
  held_group_concurrency = s.held_group_concurrency + EXCLUDED.held_group_concurrency,
  held_group_rate = s.held_group_rate + EXCLUDED.held_group_rate,
  held_ordered = s.held_ordered + EXCLUDED.held_ordered,
  enqueued = s.enqueued + EXCLUDED.enqueued,
  claimed = s.claimed + EXCLUDED.claimed,
  completed = s.completed + EXCLUDED.completed,
  failed = s.failed + EXCLUDED.failed,
  retried = s.retried + EXCLUDED.retried,
  lease_expired = s.lease_expired + EXCLUDED.lease_expired,
  cancelled = s.cancelled + EXCLUDED.cancelled,
  released = s.released + EXCLUDED.released,
  empty_claims = s.empty_claims + EXCLUDED.empty_claims,
  duration_max_ms = greatest(s.duration_max_ms, EXCLUDED.duration_max_ms),
  durations_ms = (SELECT array_agg(coalesce(a, 0) + coalesce(b, 0) ORDER BY i)
                  FROM unnest(s.durations_ms, EXCLUDED.durations_ms) WITH ORDINALITY AS x(a, b, i))
