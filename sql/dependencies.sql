-- Rendered from app/db/dependencies.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: JOB_EDGES_ADD --
-- A batch's dependency rows, with the queue of each end: the release reaches them queue by queue
-- (app/db/releases.py). On Citus job_dependencies is a reference table: written on every node.
INSERT INTO jobq.job_dependencies (parent_id, job_id, parent_queue, job_queue)
SELECT parent_id, job_id, parent_queue, job_queue
FROM json_to_recordset(%(edges)s::json) AS e(parent_id bigint, job_id bigint, parent_queue text, job_queue text)
ORDER BY parent_id, job_id
ON CONFLICT DO NOTHING

-- name: JOB_LOCK_PARENTS --
-- The parents in one queue of jobs being enqueued, locked until this enqueue commits (see the module docstring),
-- those free now only: a parent locked by another transaction is reported (locked = false), not waited for;
-- the enqueue then waits for it holding nothing (jobs_insert_dependent). Waiting while holding some
-- would deadlock with a statement finishing jobs, which locks the jobs it finishes before their
-- dependants: holding a waiting parent (a dependant there) and waiting for one that statement finishes
-- is a cycle; so is holding the parents named by id and waiting for one named by an item's key.
-- A job outside the caller's queues is not returned, exactly like a missing one. FOR UPDATE reads the
-- newest committed version, so RETURNING shows the status a statement that finished the job committed.
-- One queue per statement (on Citus a router query on its shard): the parents in other queues are found by
-- JOB_PARENT_QUEUES and locked by a statement per queue.
WITH free AS (
  SELECT j.id FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[]) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  ORDER BY j.id
  FOR UPDATE SKIP LOCKED
), marked AS (
  UPDATE jobq.jobs AS j SET has_dependants = true
  FROM free WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM free)) AND j.id = free.id
  RETURNING j.id, j.status, j.queue_name, j.dependency_depth
)
SELECT id, status, true AS locked, queue_name, coalesce(dependency_depth, 0) AS depth FROM marked
UNION ALL
SELECT j.id, j.status, false, j.queue_name, coalesce(j.dependency_depth, 0) FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[]) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  AND j.id <> ALL(ARRAY(SELECT id FROM free))

-- name: JOB_PARENT_QUEUES --
-- The queues of parents named by id that are not in the queue of the jobs being enqueued (the lock found them
-- not there): one lookup by primary key each; on Citus a read of every shard, once per such enqueue. A job
-- outside the caller's queues is not returned, exactly like a missing one.
SELECT j.id, j.queue_name FROM jobq.jobs j
WHERE j.id = ANY(%(ids)s::bigint[]) AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)

-- name: JOB_SETTLE --
WITH input AS (
  SELECT * FROM json_to_recordset(%(items)s::json)
    AS t(id bigint, status text, pending int, depends_on bigint[], policy text, error text, mark boolean,
         depth int)
), stamp AS (
  -- The database's clock, read here: on Citus an UPDATE may not call a VOLATILE function.
  SELECT clock_timestamp() AS now
), settled AS (
  -- The jobs of one queue this transaction inserted a moment ago (invisible to everyone else until it commits):
  -- each dependant's status and dependencies, and `mark` on those that have a dependant in the same batch.
  UPDATE jobq.jobs AS j
  SET status = coalesce(i.status, j.status),
      pending_dependencies = CASE WHEN i.status IS NULL THEN j.pending_dependencies ELSE i.pending END,
      depends_on = CASE WHEN i.status IS NULL THEN j.depends_on ELSE i.depends_on END,
      on_dependency_failure = CASE WHEN i.status IS NULL THEN j.on_dependency_failure ELSE i.policy END,
      finished_at = CASE WHEN i.status = 'cancelled' THEN st.now ELSE j.finished_at END,
      last_error = coalesce(i.error, j.last_error),
      has_dependants = CASE WHEN i.mark THEN true ELSE j.has_dependants END,
      dependency_depth = CASE WHEN i.status IS NULL THEN j.dependency_depth ELSE i.depth END
  FROM input i, stamp st
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id
  -- The answer's columns are computed below: Citus allows no STABLE function in RETURNING.
  RETURNING j.*, j.queue_name AS queue
)
-- The dependency rows (JOB_EDGES_ADD) and the count of jobs cancelled here (a parent had already failed) follow
-- as statements of their own: INSERTs in CTEs would make Citus split this one, which stays on one shard.
SELECT j.id, j.queue_name AS queue, j.status, CASE WHEN true THEN j.payload::text END AS payload, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, CASE WHEN true THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END AS on_dependency_failure, CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, j.timeout_seconds, CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, 'for_seconds', j.unique_for_seconds, 'while', j.unique_states, 'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, 'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS "unique", CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, 'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, 'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, coalesce(j.has_dependants, false) AS has_dependants FROM settled j

-- name: JOB_WAIT_FOR --
SELECT FROM jobq.jobs WHERE queue_name = %(queue)s AND id = %(id)s FOR UPDATE
