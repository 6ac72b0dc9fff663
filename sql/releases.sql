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
      last_error = CASE WHEN i.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run' THEN 'dependency ' || i.bad_id || ' ' || i.bad_status ELSE j.last_error END
  FROM input i
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id
    AND j.status = (SELECT 'waiting'::text)
  RETURNING j.id, j.queue_name AS queue, j.status, coalesce(j.has_dependants, false) AS has_dependants
), counted AS (
  INSERT INTO jobq.queue_counts AS c (queue_name, status, shard, n)
  SELECT queue, status, mod(pg_backend_pid(), 64), sum(1)
  FROM changed
  WHERE status IN ('completed', 'failed', 'cancelled')
  GROUP BY 1, 2
  ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n
), recorded AS (
  -- The cascade's next level: a cancelled dependant that others depend on, released by a later step.
  INSERT INTO jobq.dependency_releases (queue_name, job_id, status)
  SELECT queue, id, status FROM changed WHERE status = 'cancelled' AND has_dependants
)
SELECT id, status, has_dependants FROM changed

-- name: EDGES_FILL_QUEUES --
WITH legacy AS (
  -- Dependency rows a previous release wrote (no queue names), a batch at a time.
  SELECT parent_id, job_id FROM jobq.job_dependencies
  WHERE parent_queue IS NULL OR job_queue IS NULL
  ORDER BY parent_id, job_id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
)
-- Their jobs looked up by id (the one lookup across queues here, for rows only a previous release writes).
-- A parent gone (deleted by retention, so finished) files the row under its dependant's queue, where the
-- reconciliation finds no such job, and so releases the dependant as if it had completed; a dependant gone
-- leaves a row that the release consumes and that changes nothing.
UPDATE jobq.job_dependencies AS d
SET parent_queue = coalesce((SELECT p.queue_name FROM jobq.jobs p WHERE p.id = l.parent_id),
                            (SELECT c.queue_name FROM jobq.jobs c WHERE c.id = l.job_id), ''),
    job_queue = coalesce((SELECT c.queue_name FROM jobq.jobs c WHERE c.id = l.job_id), '')
FROM legacy l
WHERE d.parent_id = l.parent_id AND d.job_id = l.job_id
RETURNING d.parent_id

-- name: EDGES_FINISHED_PARENTS --
WITH page AS (
  -- A page of one queue's dependency rows, in parent order after `after`.
  SELECT parent_id FROM jobq.job_dependencies
  WHERE parent_queue = %(queue)s AND parent_id > %(after)s
  ORDER BY parent_id
  LIMIT %(limit)s
), parents AS (
  SELECT DISTINCT parent_id FROM page
), found AS (
  -- Each parent as it is now (one lookup by primary key each); gone: deleted by retention, so finished.
  SELECT pa.parent_id, p.status
  FROM parents pa
  LEFT JOIN LATERAL (SELECT j.status FROM jobq.jobs j WHERE j.id = pa.parent_id AND j.queue_name = %(queue)s OFFSET 0) p
    ON true
), recorded AS (
  -- Finished without a record (finished by a previous release's process, or a record lost some other way):
  -- recorded now. One the release holds right now has its row: not recorded twice.
  INSERT INTO jobq.dependency_releases (queue_name, job_id, status)
  SELECT %(queue)s, f.parent_id, coalesce(f.status, 'completed') FROM found f
  WHERE (f.status IS NULL OR f.status IN ('completed', 'failed', 'cancelled'))
    AND NOT EXISTS (SELECT FROM jobq.dependency_releases r WHERE r.queue_name = %(queue)s AND r.job_id = f.parent_id)
  RETURNING job_id
)
SELECT (SELECT count(*) FROM page) AS seen, (SELECT max(parent_id) FROM page) AS last,
       (SELECT count(*) FROM recorded) AS recorded

-- name: EDGES_PARENT_QUEUES --
-- The next queue (in name order) whose jobs others wait for: one probe of job_dependencies_parent_queue_idx.
SELECT min(parent_queue) FROM jobq.job_dependencies WHERE parent_queue > %(after)s

-- name: EDGES_TAKE --
WITH taken AS (
  -- At most `limit` dependency rows of the finished jobs `parents` (all in `queue`), in (parent, dependant)
  -- order, locked; a row a previous release wrote without queue names waits for the reconciliation.
  SELECT ctid FROM jobq.job_dependencies
  WHERE parent_queue = %(queue)s AND parent_id = ANY(%(parents)s::bigint[])
  ORDER BY parent_id, job_id
  LIMIT %(limit)s
  FOR UPDATE
)
DELETE FROM jobq.job_dependencies d
WHERE d.ctid = ANY(ARRAY(SELECT ctid FROM taken))
RETURNING d.parent_id, d.job_id, d.job_queue

-- name: PARENTS_MARK --
WITH edges AS (
  -- The dependency rows of dependants an SQL enqueue just committed (migrations/0045_sql_enqueue.sql, which
  -- writes them without touching the parents), each by its primary key: a dependant's depends_on names its
  -- parents. `only`: one parent, after waiting for its lock.
  -- One primary-key lookup per dependant and per dependency row (OFFSET 0 keeps each a lookup: a join of the
  -- id list with job_dependencies, whose key starts with the parent, would read it whole).
  SELECT DISTINCT d.parent_id, d.parent_queue
  FROM unnest(%(jobs)s::bigint[]) AS i(id)
  CROSS JOIN LATERAL (
    SELECT c.id, c.depends_on FROM jobq.jobs c WHERE c.id = i.id AND c.queue_name = %(queue)s OFFSET 0
  ) c
  CROSS JOIN LATERAL unnest(c.depends_on) AS u(parent_id)
  CROSS JOIN LATERAL (
    SELECT d.parent_id, d.parent_queue FROM jobq.job_dependencies d
    WHERE d.parent_id = u.parent_id AND d.job_id = c.id AND d.parent_queue IS NOT NULL OFFSET 0
  ) d
  WHERE %(only)s::bigint IS NULL OR d.parent_id = %(only)s::bigint
), free AS (
  -- The parents locked free now, in id order (one locked by a finishing statement is waited for alone, holding
  -- nothing: parents_wait_for). FOR NO KEY UPDATE reads the newest committed version: the status a finish
  -- that committed meanwhile wrote.
  SELECT p.id, p.status, p.has_dependants FROM jobq.jobs p
  WHERE p.id = ANY(ARRAY(SELECT parent_id FROM edges))
  ORDER BY p.id
  FOR NO KEY UPDATE SKIP LOCKED
), marked AS (
  -- Marked: a finish from now on records the parent in the outbox itself (app/db/jobs.py record_finished).
  UPDATE jobq.jobs AS p SET has_dependants = true
  FROM free f WHERE p.id = f.id AND NOT coalesce(f.has_dependants, false)
), recorded AS (
  -- Finished before it was marked (its finish recorded nothing, or recorded it and was released before these
  -- rows were visible), or gone (deleted by retention, so finished): recorded now, released by the caller's
  -- step. As EDGES_FINISHED_PARENTS records, for these parents only; a second row for one job is consumed
  -- like the first.
  INSERT INTO jobq.dependency_releases (queue_name, job_id, status)
  SELECT e.parent_queue, e.parent_id, coalesce(f.status, 'completed')
  FROM edges e LEFT JOIN free f ON f.id = e.parent_id
  WHERE f.status IN ('completed', 'failed', 'cancelled')
     OR (f.id IS NULL AND NOT EXISTS (SELECT FROM jobq.jobs x WHERE x.id = e.parent_id))
  RETURNING queue_name, job_id
)
SELECT e.parent_id, e.parent_queue,
       f.id IS NULL AND EXISTS (SELECT FROM jobq.jobs x WHERE x.id = e.parent_id) AS busy,
       EXISTS (SELECT FROM recorded r WHERE r.job_id = e.parent_id) AS recorded
FROM edges e LEFT JOIN free f ON f.id = e.parent_id
ORDER BY e.parent_id

-- name: PARENT_WAIT_FOR --
SELECT FROM jobq.jobs WHERE id = %(id)s FOR NO KEY UPDATE

-- name: RELEASES_CLAIM --
-- A batch of one queue's outbox rows, oldest first (or those of the jobs `jobs`: the ones a request just
-- finished), locked until the step commits; rows another step holds are skipped. With each, the job as it
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

-- name: RELEASES_DONE --
-- Outbox rows whose job has no dependency row left (or was retried since: its next finish records it again).
DELETE FROM jobq.dependency_releases WHERE queue_name = %(queue)s AND id = ANY(%(ids)s::bigint[])

-- name: RELEASE_QUEUES --
-- The queues with outbox rows, in name order after `after` (a pass goes round them all). The outbox holds
-- only cascades in progress: a few rows. A read without locks.
SELECT DISTINCT queue_name FROM jobq.dependency_releases
WHERE queue_name > %(after)s
ORDER BY 1
LIMIT %(limit)s
