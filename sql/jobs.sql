-- Rendered from app/db/jobs.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: CITUS_IDS --
-- On Citus: ids for a batch of n jobs, in order, from the jobs' identity sequence (no table read).
SELECT nextval((SELECT pg_get_serial_sequence('jobq.jobs', 'id')::regclass)) AS id FROM generate_series(1, %(n)s) ORDER BY 1

-- name: CITUS_UNIQUE_IDS --
-- On Citus: ids for a batch with unique jobs, in input order, and each unique job's key and window start (as
-- JOB_INSERT_UNIQUE computes them; the window as text, '-infinity' for none). No table read; the insert that
-- follows, in the same transaction, has the same now().
SELECT t.ord, nextval((SELECT pg_get_serial_sequence('jobq.jobs', 'id')::regclass)) AS id,
       CASE WHEN t.is_unique THEN coalesce(t.unique_key, encode(sha256(convert_to(coalesce(t.payload, 'null')::text, 'UTF8')), 'hex')) END AS ukey,
       CASE WHEN t.is_unique THEN (CASE WHEN t.unique_for IS NULL THEN '-infinity'::timestamptz ELSE to_timestamp(floor(extract(epoch FROM now())::float8 / t.unique_for) * t.unique_for) END)::text END AS ufrom
FROM json_to_recordset(%(batch)s::json)
    AS t(ord int, queue_name text, payload jsonb, priority int, run_at timestamptz, delay float8,
         max_attempts int, idempotency_key text, traceparent text, group_key text, timeout_seconds int,
         is_unique bool, unique_key text, unique_for int, unique_states text[])
ORDER BY ord

-- name: JOBS_GET_MADE --
-- On Citus: the jobs of one queue that a unique enqueue just made, by id (one task on the queue's shard).
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[])

-- name: JOBS_GET_WAITED --
-- Jobs that requests wait for (app/core/results.py), each as it is now: with payload and result only when
-- it has finished, since only then is it an answer. A job that is gone is not in the result. `queues`: the
-- queues of those jobs, known since each wait began; on Citus the read goes to their shards only (one task
-- when they are of one queue), still one statement for every job woken at once.
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN j.status IN ('completed', 'failed', 'cancelled') THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN j.status IN ('completed', 'failed', 'cancelled') THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.id = ANY(%(ids)s) AND j.queue_name = ANY(%(queues)s::text[])

-- name: JOB_COPY --
COPY jobq.jobs (id, queue_name, payload, priority, run_at, max_attempts, created_at, traceparent, group_key, timeout_seconds) FROM STDIN

-- name: JOB_GET --
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
WHERE j.id = %(id)s AND j.queue_name = %(queue)s AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)

-- name: JOB_GET_BY_KEYS --
-- The jobs of one queue already holding these keys, one lookup each through jobs_idempotency_idx (the
-- restriction `IS NOT NULL` proves its predicate; OFFSET 0 keeps each lookup a lookup). One queue per
-- statement: on Citus, a router query on that queue's shard (app/db/distribute.py).
SELECT j.*
FROM json_array_elements_text(%(keys)s::json) AS k(idempotency_key)
CROSS JOIN LATERAL (
  SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.idempotency_key = k.idempotency_key AND j.idempotency_key IS NOT NULL
  OFFSET 0
) j

-- name: JOB_GET_BY_UNIQUE --
-- The jobs holding these unique keys in the window that is current now, one lookup each through
-- jobs_unique_idx (the restriction repeats its predicate; OFFSET 0 keeps each lookup a lookup). A holder that
-- finished or was deleted since the insert is not found here: the caller inserts again. (The window cannot turn
-- in between: the caller runs both in one transaction, and the window is taken from its now().) The jobs of
-- one queue per statement: on Citus, a router query on that queue's shard.
SELECT t.ord, false AS created, j.*
FROM json_to_recordset(%(batch)s::json)
    AS t(ord int, queue_name text, payload jsonb, priority int, run_at timestamptz, delay float8,
         max_attempts int, idempotency_key text, traceparent text, group_key text, timeout_seconds int,
         is_unique bool, unique_key text, unique_for int, unique_states text[])
CROSS JOIN LATERAL (
  SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.unique_key = coalesce(t.unique_key, encode(sha256(convert_to(coalesce(t.payload, 'null')::text, 'UTF8')), 'hex')) AND j.unique_from = CASE WHEN t.unique_for IS NULL THEN '-infinity'::timestamptz ELSE to_timestamp(floor(extract(epoch FROM now())::float8 / t.unique_for) * t.unique_for) END
    AND coalesce(j.unique_for_seconds, 0) = coalesce(t.unique_for, 0)
    AND j.unique_key IS NOT NULL AND j.status = ANY(j.unique_states)
  OFFSET 0
) j

-- name: JOB_IDS --
SELECT now(), array(SELECT nextval((SELECT pg_get_serial_sequence('jobq.jobs', 'id')::regclass)) FROM generate_series(1, %(n)s))

-- name: JOB_INSERT_BATCH['brief'] --
WITH input AS (
  -- A batch of more than VALUES_MAX jobs (see job_insert_values for the others). On Citus an INSERT ... SELECT
  -- is pulled through the coordinator: the rows are sent to each shard named, then inserted there (a few round
  -- trips, for many rows). Ids are drawn in the input's order (a volatile select-list expression is evaluated after the
  -- ORDER BY): that is how rows without a key are matched back to their input, and ids are the last
  -- tie-break of claim order, so a batch keeps its order.
  SELECT t.*, nextval((SELECT pg_get_serial_sequence('jobq.jobs', 'id')::regclass)) AS id
  FROM json_to_recordset(%(batch)s::json)
    AS t(ord int, queue_name text, payload jsonb, priority int, run_at timestamptz, delay float8,
         max_attempts int, idempotency_key text, traceparent text, group_key text, timeout_seconds int)
  ORDER BY ord
)
INSERT INTO jobq.jobs AS j (id, queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent,
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
RETURNING j.id, j.queue_name AS queue, j.status, CASE WHEN false THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN false THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, NULL::text AS "unique", NULL::text AS debounce, coalesce(j.has_dependants, false) AS has_dependants

-- name: JOB_INSERT_BATCH['full'] --
WITH input AS (
  -- A batch of more than VALUES_MAX jobs (see job_insert_values for the others). On Citus an INSERT ... SELECT
  -- is pulled through the coordinator: the rows are sent to each shard named, then inserted there (a few round
  -- trips, for many rows). Ids are drawn in the input's order (a volatile select-list expression is evaluated after the
  -- ORDER BY): that is how rows without a key are matched back to their input, and ids are the last
  -- tie-break of claim order, so a batch keeps its order.
  SELECT t.*, nextval((SELECT pg_get_serial_sequence('jobq.jobs', 'id')::regclass)) AS id
  FROM json_to_recordset(%(batch)s::json)
    AS t(ord int, queue_name text, payload jsonb, priority int, run_at timestamptz, delay float8,
         max_attempts int, idempotency_key text, traceparent text, group_key text, timeout_seconds int)
  ORDER BY ord
)
INSERT INTO jobq.jobs AS j (id, queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent,
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
RETURNING j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, NULL::text AS "unique", NULL::text AS debounce, coalesce(j.has_dependants, false) AS has_dependants

-- name: JOB_INSERT_CITUS_ONE --
INSERT INTO jobq.jobs AS j (id, queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent, group_key, timeout_seconds)
OVERRIDING SYSTEM VALUE
VALUES (%(i0)s::bigint, %(q0)s::text, %(p0)s::jsonb, %(pr0)s::int, coalesce(%(r0)s::timestamptz, now() + make_interval(secs => coalesce(%(d0)s::float8, 0))), %(m0)s::int, %(k0)s::text, %(t0)s::text, %(g0)s::text, %(o0)s::int)
-- A key already taken on this queue: insert nothing, the caller fetches the existing job.
ON CONFLICT (queue_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, NULL::text AS "unique", NULL::text AS debounce, coalesce(j.has_dependants, false) AS has_dependants

-- name: JOB_INSERT_ONE --
INSERT INTO jobq.jobs AS j (queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent, group_key, timeout_seconds)
VALUES (%(q0)s::text, %(p0)s::jsonb, %(pr0)s::int, now() + make_interval(secs => %(d0)s::float8), %(m0)s::int, %(k0)s::text, %(t0)s::text, %(g0)s::text, %(o0)s::int)
-- A key already taken on this queue: insert nothing, the caller fetches the existing job.
ON CONFLICT (queue_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, NULL::text AS "unique", NULL::text AS debounce, coalesce(j.has_dependants, false) AS has_dependants

-- name: JOB_INSERT_UNIQUE --
WITH input AS (
  -- As JOB_INSERT_BATCH, for a batch in which some job is unique: its own statement, so that the shared one
  -- stays as it is for every other enqueue. Ids in input order; each input row keeps its id, and the answer
  -- is one row per input, in order, with the job when this statement inserted it.
  SELECT t.*, nextval((SELECT pg_get_serial_sequence('jobq.jobs', 'id')::regclass)) AS id,
         CASE WHEN t.is_unique THEN coalesce(t.unique_key, encode(sha256(convert_to(coalesce(t.payload, 'null')::text, 'UTF8')), 'hex')) END AS ukey,
         CASE WHEN t.is_unique THEN CASE WHEN t.unique_for IS NULL THEN '-infinity'::timestamptz ELSE to_timestamp(floor(extract(epoch FROM now())::float8 / t.unique_for) * t.unique_for) END END AS ufrom
  FROM json_to_recordset(%(batch)s::json)
    AS t(ord int, queue_name text, payload jsonb, priority int, run_at timestamptz, delay float8,
         max_attempts int, idempotency_key text, traceparent text, group_key text, timeout_seconds int,
         is_unique bool, unique_key text, unique_for int, unique_states text[])
  ORDER BY ord
), inserted AS (
  INSERT INTO jobq.jobs AS j (id, queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent,
                         group_key, timeout_seconds, unique_key, unique_from, unique_for_seconds, unique_states)
  OVERRIDING SYSTEM VALUE
  SELECT id, queue_name, coalesce(payload, 'null'), priority,
         coalesce(run_at, now() + make_interval(secs => coalesce(delay, 0))),
         max_attempts, idempotency_key, traceparent, group_key, timeout_seconds,
         ukey, ufrom, CASE WHEN is_unique THEN unique_for END, CASE WHEN is_unique THEN unique_states END
  FROM input
  -- Keys in one global order (see JOB_INSERT_BATCH: no deadlock between batches); the first of equal keys wins.
  ORDER BY queue_name COLLATE "C", idempotency_key COLLATE "C", ukey COLLATE "C", ufrom, ord
  -- A key taken (an idempotency key, or a unique key in this window by a job in one of its states): insert
  -- nothing, the caller looks the job up. Without a target, both unique indexes are arbiters; a job has at
  -- most one of the two keys (the API refuses both).
  ON CONFLICT DO NOTHING
  RETURNING j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants
)
SELECT i.ord, j.id IS NOT NULL AS created, j.* FROM input i LEFT JOIN inserted j ON j.id = i.id ORDER BY i.ord

-- name: JOB_INSERT_UNIQUE_CITUS_ONE --
INSERT INTO jobq.jobs AS j (id, queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent, group_key, timeout_seconds, unique_key, unique_from, unique_for_seconds, unique_states)
OVERRIDING SYSTEM VALUE
VALUES (%(i0)s::bigint, %(q0)s::text, %(p0)s::jsonb, %(pr0)s::int, coalesce(%(r0)s::timestamptz, now() + make_interval(secs => coalesce(%(d0)s::float8, 0))), %(m0)s::int, %(k0)s::text, %(t0)s::text, %(g0)s::text, %(o0)s::int, %(uk0)s::text, %(uf0)s::timestamptz, %(us0)s::int, %(ut0)s::text[])
-- Without a target, both unique indexes are arbiters; a job has at most one of the two keys.
ON CONFLICT DO NOTHING
RETURNING j.id
