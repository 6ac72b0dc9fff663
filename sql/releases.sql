-- Rendered from app/db/releases.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: DEPENDANTS_SETTLE --
WITH input AS (
  -- Per dependant: how many of its dependencies finished (n), and the first of them that did not complete.
  SELECT * FROM json_to_recordset(%(items)s::json) AS t(id bigint, n int, bad_id bigint, bad_status text)
), changed AS (
  -- Only waiting dependants change: one cancelled meanwhile (or retried since) is left alone. Reached by
  -- primary key in id order (the ids come sorted): the status is compared with a value the planner cannot
  -- see (as app/db/jobs.py RUNNING), so jobs_waiting_idx, which stale statistics can make look empty, is
  -- never the way in.
  UPDATE jobq.jobs AS j
  SET status = CASE WHEN i.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run' THEN 'cancelled'
                    WHEN j.pending_dependencies > i.n THEN 'waiting' ELSE 'pending' END,
      pending_dependencies = CASE WHEN i.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run' THEN j.pending_dependencies
                                  ELSE greatest(j.pending_dependencies - i.n, 0) END,
      -- Released: due now, or at its own run_at if that is later (a delay counts from the enqueue). Claim
      -- order then puts it after the jobs that were ready before it.
      run_at = CASE WHEN i.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run' OR j.pending_dependencies > i.n THEN j.run_at
                    ELSE greatest(j.run_at, %(now)s::timestamptz) END,
      finished_at = CASE WHEN i.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run' THEN %(now)s::timestamptz END,
      -- bad_id cast to text: text || bigint is STABLE (any type's output function), and Citus would then
      -- read the input through the coordinator.
      last_error = CASE WHEN i.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run' THEN 'dependency ' || i.bad_id::text || ' ' || i.bad_status ELSE j.last_error END
  FROM input i
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id
    AND j.status = (SELECT 'waiting'::text)
  RETURNING j.id, j.status, coalesce(j.has_dependants, false) AS has_dependants
)
-- The ones it cancelled are counted, and those others depend on recorded (the cascade's next level, released
-- by a later step), by dependants_settle's own statements in the same transaction (app/db/finishing.py): an
-- INSERT in a CTE would make Citus split this statement. Most settles cancel nothing and send neither.
SELECT id, status, has_dependants FROM changed

-- name: EDGES_FILL_QUEUES --
-- Those rows given their queue names (a reference table on Citus: its rows are joined only with the input).
UPDATE jobq.job_dependencies AS d SET parent_queue = f.parent_queue, job_queue = f.job_queue
FROM unnest(%(parents)s::bigint[], %(jobs)s::bigint[], %(parent_queues)s::text[], %(job_queues)s::text[])
  AS f(parent_id, job_id, parent_queue, job_queue)
WHERE d.parent_id = f.parent_id AND d.job_id = f.job_id

-- name: EDGES_FINISHED_PARENTS --
WITH page AS (
  -- A page of one queue's dependency rows, in parent order after `after`.
  SELECT parent_id FROM jobq.job_dependencies
  WHERE parent_queue = %(queue)s AND parent_id > %(after)s
  ORDER BY parent_id
  LIMIT %(limit)s
), found AS (
  -- Each parent as it is now (one lookup by primary key each); gone: deleted by retention, so finished.
  SELECT pa.parent_id, p.status
  FROM (SELECT DISTINCT parent_id FROM page) pa
  LEFT JOIN LATERAL (SELECT j.status FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.id = pa.parent_id OFFSET 0) p
    ON true
)
-- The finished (or gone) ones without a record, for RELEASES_RECORD. A read of one queue's shard
-- (job_dependencies is a reference table, on every node): one task on Citus.
SELECT (SELECT count(*) FROM page) AS seen, (SELECT max(parent_id) FROM page) AS last,
       ARRAY(SELECT f.parent_id FROM found f WHERE (f.status IS NULL OR f.status IN ('completed', 'failed', 'cancelled')) AND NOT EXISTS (SELECT FROM jobq.dependency_releases r WHERE r.queue_name = %(queue)s AND r.job_id = f.parent_id) ORDER BY f.parent_id) AS ids,
       ARRAY(SELECT coalesce(f.status, 'completed') FROM found f WHERE (f.status IS NULL OR f.status IN ('completed', 'failed', 'cancelled')) AND NOT EXISTS (SELECT FROM jobq.dependency_releases r WHERE r.queue_name = %(queue)s AND r.job_id = f.parent_id) ORDER BY f.parent_id) AS statuses

-- name: EDGES_LEGACY --
-- Dependency rows a previous release wrote (no queue names), a batch at a time, locked.
SELECT parent_id, job_id FROM jobq.job_dependencies
WHERE parent_queue IS NULL OR job_queue IS NULL
ORDER BY parent_id, job_id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: EDGES_PARENT_QUEUES --
-- The next queue (in name order) whose jobs others wait for: one probe of job_dependencies_parent_queue_idx.
SELECT min(parent_queue) FROM jobq.job_dependencies WHERE parent_queue > %(after)s

-- name: EDGES_TAKE --
-- At most `limit` dependency rows of the finished jobs `parents` (all in `queue`), in (parent, dependant) order,
-- locked, consumed; a row a previous release wrote without queue names waits for the reconciliation. By primary
-- key (on Citus job_dependencies is a reference table, whose copies share no ctid): one task.
DELETE FROM jobq.job_dependencies d
WHERE (d.parent_id, d.job_id) IN (
  SELECT parent_id, job_id FROM jobq.job_dependencies
  WHERE parent_queue = %(queue)s AND parent_id = ANY(%(parents)s::bigint[])
  ORDER BY parent_id, job_id
  LIMIT %(limit)s
  FOR UPDATE
)
RETURNING d.parent_id, d.job_id, d.job_queue

-- name: JOBS_QUEUES --
-- The queues of jobs known by id alone (the one lookup across queues here, for rows only a previous release
-- writes): by primary key; on Citus a read of every shard, once per batch.
SELECT id, queue_name FROM jobq.jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: PARENTS_MARK --
WITH free AS (
  -- The parents (all in `queue`) locked free now, in id order (one locked by a finishing statement is waited for
  -- alone, holding nothing: parent_wait_for). FOR NO KEY UPDATE reads the newest committed version: the status a
  -- finish that committed meanwhile wrote.
  SELECT p.id, p.status, p.has_dependants FROM jobq.jobs p
  WHERE p.queue_name = %(queue)s AND p.id = ANY(%(parents)s::bigint[])
  ORDER BY p.id
  FOR NO KEY UPDATE SKIP LOCKED
), marked AS (
  -- Marked: a finish from now on records the parent in the outbox itself (app/db/jobs.py record_finished).
  UPDATE jobq.jobs AS p SET has_dependants = true
  FROM free f WHERE p.queue_name = %(queue)s AND p.id = f.id AND NOT coalesce(f.has_dependants, false)
)
-- Each parent: busy (locked by someone else: not marked yet), or finished before it was marked (its finish recorded
-- nothing, or recorded it and was released before these rows were visible), or gone (deleted by retention, so
-- finished: as completed): the caller records those (RELEASES_RECORD) and releases them. One task on Citus.
SELECT e.id AS parent_id,
       f.id IS NULL AND EXISTS (SELECT FROM jobq.jobs x WHERE x.queue_name = %(queue)s AND x.id = e.id) AS busy,
       CASE WHEN f.status IN ('completed', 'failed', 'cancelled') THEN f.status
            WHEN f.id IS NULL AND NOT EXISTS (SELECT FROM jobq.jobs x WHERE x.queue_name = %(queue)s AND x.id = e.id)
            THEN 'completed' END AS finished
FROM unnest(%(parents)s::bigint[]) AS e(id)
LEFT JOIN free f ON f.id = e.id
ORDER BY e.id

-- name: PARENT_EDGES --
-- The dependency rows of dependants of one queue that an SQL enqueue just committed (migrations/0045_sql_enqueue.sql,
-- which writes them without touching the parents), each by its primary key: a dependant's depends_on names its
-- parents. `only`: one parent, after waiting for its lock. One primary-key lookup per dependant and per dependency
-- row (OFFSET 0 keeps each a lookup: a join of the id list with job_dependencies, whose key starts with the
-- parent, would read it whole). A read of the dependants' shard (job_dependencies is a reference table).
SELECT DISTINCT d.parent_id, d.parent_queue
FROM unnest(%(jobs)s::bigint[]) AS i(id)
CROSS JOIN LATERAL (
  SELECT c.id, c.depends_on FROM jobq.jobs c WHERE c.queue_name = %(queue)s AND c.id = i.id OFFSET 0
) c
CROSS JOIN LATERAL unnest(c.depends_on) AS u(parent_id)
CROSS JOIN LATERAL (
  SELECT d.parent_id, d.parent_queue FROM jobq.job_dependencies d
  WHERE d.parent_id = u.parent_id AND d.job_id = c.id AND d.parent_queue IS NOT NULL OFFSET 0
) d
WHERE %(only)s::bigint IS NULL OR d.parent_id = %(only)s::bigint
ORDER BY d.parent_id

-- name: PARENT_WAIT_FOR --
SELECT FROM jobq.jobs WHERE queue_name = %(queue)s AND id = %(id)s FOR NO KEY UPDATE

-- name: RELEASES_CLAIM --
-- A batch of one queue's outbox rows, oldest first (or those of the jobs `jobs`: the ones a request just
-- finished), locked until the step commits; rows another step holds are skipped (by the background; the
-- request's own step waits for them instead: RELEASES_CLAIM_OWN). With each, the job as it
-- is now: finished (its dependants are released by how it finished), not finished (retried since: its
-- rows wait for its next finish), or gone (deleted by retention: as recorded). And the database's clock,
-- which the step's writes use.
SELECT r.id, r.job_id, r.status AS recorded, p.status AS status, clock_timestamp() AS now
FROM (
  SELECT d.id, d.job_id, d.status FROM jobq.dependency_releases d
  WHERE d.queue_name = %(queue)s AND (%(jobs)s::bigint[] IS NULL OR d.job_id = ANY(%(jobs)s::bigint[]))
  ORDER BY d.id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
) r
LEFT JOIN LATERAL (
  -- One lookup by primary key per row (OFFSET 0: kept a lookup whatever the statistics say).
  SELECT j.status FROM jobq.jobs j WHERE j.id = r.job_id AND j.queue_name = %(queue)s OFFSET 0
) p ON true
ORDER BY r.id

-- name: RELEASES_CLAIM_OWN --
-- A batch of one queue's outbox rows, oldest first (or those of the jobs `jobs`: the ones a request just
-- finished), locked until the step commits; rows another step holds are skipped (by the background; the
-- request's own step waits for them instead: RELEASES_CLAIM_OWN). With each, the job as it
-- is now: finished (its dependants are released by how it finished), not finished (retried since: its
-- rows wait for its next finish), or gone (deleted by retention: as recorded). And the database's clock,
-- which the step's writes use.
SELECT r.id, r.job_id, r.status AS recorded, p.status AS status, clock_timestamp() AS now
FROM (
  SELECT d.id, d.job_id, d.status FROM jobq.dependency_releases d
  WHERE d.queue_name = %(queue)s AND (%(jobs)s::bigint[] IS NULL OR d.job_id = ANY(%(jobs)s::bigint[]))
  ORDER BY d.id
  LIMIT %(limit)s
  FOR UPDATE
) r
LEFT JOIN LATERAL (
  -- One lookup by primary key per row (OFFSET 0: kept a lookup whatever the statistics say).
  SELECT j.status FROM jobq.jobs j WHERE j.id = r.job_id AND j.queue_name = %(queue)s OFFSET 0
) p ON true
ORDER BY r.id

-- name: RELEASES_DONE --
-- Outbox rows whose job has no dependency row left (or was retried since: its next finish records it again).
DELETE FROM jobq.dependency_releases WHERE queue_name = %(queue)s AND id = ANY(%(ids)s::bigint[])

-- name: RELEASES_RECORD --
-- Parents finished without a record (finished by a previous release's process, or a record lost some other way),
-- as EDGES_FINISHED_PARENTS found them: recorded now. (One recorded meanwhile by the release gets a second row,
-- which is consumed like the first.)
INSERT INTO jobq.dependency_releases (queue_name, job_id, status)
SELECT %(queue)s::text, f.id, f.status FROM unnest(%(ids)s::bigint[], %(statuses)s::text[]) AS f(id, status)
RETURNING job_id

-- name: RELEASE_QUEUES --
-- The queues with outbox rows, in name order after `after` (a pass goes round them all). The outbox holds
-- only cascades in progress: a few rows. A read without locks.
SELECT DISTINCT queue_name FROM jobq.dependency_releases
WHERE queue_name > %(after)s
ORDER BY 1
LIMIT %(limit)s
