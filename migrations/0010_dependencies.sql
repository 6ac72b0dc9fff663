-- Dependencies between jobs (issue 13): a job enqueued with `depends_on` waits, in the new status
-- `waiting`, until every job it depends on has finished; the statement that finishes the last of them
-- releases it (app/db/dependencies.py tells the whole story).
--
-- Cheap on a big table: the new columns are nullable without a default (metadata only); the new CHECKs
-- are NOT VALID, so they hold for every row written from now on without a scan now. They need none: no
-- existing row is `waiting`, and every existing row passed the old status CHECK, which allowed less. (A
-- VALIDATE in this file would scan the table under the ACCESS EXCLUSIVE lock the ALTER already holds: the
-- runner applies a file in one transaction.) The partial index on `waiting` holds no entry yet, but is
-- built from a scan of jobs while writes wait, about a second per million jobs.

-- --- the status ------------------------------------------------------------------------------------------
ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
  CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled', 'waiting')) NOT VALID;

-- --- the columns -----------------------------------------------------------------------------------------
-- All NULL on a job without dependencies, so such a job's row is as wide as before.
ALTER TABLE jobs
  ADD COLUMN depends_on            bigint[],  -- the parents as enqueued, for display; NULL: none
  ADD COLUMN pending_dependencies  integer,   -- parents not finished yet (meaningful while waiting)
  ADD COLUMN on_dependency_failure text,      -- 'run' or NULL (= cancel)
  ADD COLUMN has_dependants        boolean;   -- true once some job was enqueued depending on this one

ALTER TABLE jobs ADD CONSTRAINT jobs_on_dependency_failure_values
  CHECK (on_dependency_failure IN ('cancel', 'run')) NOT VALID;

-- waiting: like pending (an attempt left, no lease, not finished), and something still to wait for.
ALTER TABLE jobs ADD CONSTRAINT jobs_waiting_shape CHECK (status <> 'waiting'
    OR (attempts < max_attempts AND lease_expires_at IS NULL AND finished_at IS NULL
        AND pending_dependencies > 0)) NOT VALID;

-- Listings (?status=waiting) and counts of waiting jobs per queue; claims never read it.
CREATE INDEX jobs_waiting_idx ON jobs (queue_name, id) WHERE status = 'waiting';

-- --- the reverse lookup --------------------------------------------------------------------------------------
-- One row per (parent not finished when the dependant was enqueued, dependant). Consumed (deleted) when the
-- parent finishes; a row whose dependant is gone or no longer waiting is deleted then as well.
CREATE TABLE job_dependencies (
  parent_id bigint NOT NULL,
  job_id    bigint NOT NULL,
  PRIMARY KEY (parent_id, job_id)
);

-- --- the release ------------------------------------------------------------------------------------------------
-- Called for each job that finishes (completed, failed, cancelled) while has_dependants is set, by
-- whichever statement finishes it: complete (single, batch, handed in on a claim), fail for good, cancel
-- (single, bulk), the lease rescuer's terminal fail. The statements themselves do not change.
--
-- Why a trigger and not a CTE in those statements: a CTE runs on its statement's snapshot. When the
-- finishing UPDATE waited for the row lock of an enqueue that was adding a dependant to this job, the
-- CTE would not see that enqueue's job_dependencies rows, and the dependant would wait forever. This
-- function is VOLATILE, so under READ COMMITTED each of its queries takes a fresh snapshot and sees
-- every dependency committed before the lock was granted; NEW is the row after the wait.
--
-- Cascades (a cancelled dependant has dependants of its own) are handled by the loop below, a frontier
-- of finished parents at a time, not by recursion through nested trigger calls, which a chain of a few
-- thousand jobs would take past max_stack_depth: the nested calls return at once.
--
-- Wake-ups: one NOTIFY on jobq_wakeup from sender "db" (app/core/wakeups.py) naming the queues of the
-- released jobs and "#<id>" of the cancelled ones, so that parked claims and result waits in every
-- process, the one that ran the statement included, are answered at once.
CREATE FUNCTION jobs_release_dependants() RETURNS trigger
LANGUAGE plpgsql VOLATILE
-- Every query below reaches jobs and job_dependencies by their primary keys, one lookup per dependant.
-- Statistics lag (a table that just grew, a fan-out enqueued a moment ago), and with them the planner
-- takes thousands of dependants for one: it then may scan jobs, or join in a way that repeats the
-- whole list per dependant. A nested loop over primary-key lookups is the only plan left to it.
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
  parents   bigint[] := ARRAY[NEW.id];
  parent_status text := NEW.status;  -- of every parent in `parents`: one at first, then cancelled ones
  queues    text[] := '{}';
  cancelled bigint[] := '{}';
  step_queues    text[];
  step_cancelled bigint[];
  names     text[];
  message   text;
  item      text;
BEGIN
  IF pg_trigger_depth() > 1 THEN
    RETURN NULL;  -- a row this function itself finished: its dependants are the loop's next frontier
  END IF;
  LOOP
    WITH consumed AS (
      DELETE FROM job_dependencies d WHERE d.parent_id = ANY(parents) RETURNING d.parent_id, d.job_id
    ), per_job AS (
      -- Per dependant: how many of its parents finished here, and the first of them when they did not
      -- complete.
      SELECT c.job_id, count(*)::int AS n,
             CASE WHEN parent_status <> 'completed' THEN min(c.parent_id) END AS bad_id
      FROM consumed c
      GROUP BY c.job_id
      -- Dependants locked in id order (the nested loop below keeps it): statements finishing parents
      -- that share dependants never wait on each other in a cycle.
      ORDER BY c.job_id
    ), changed AS (
      -- Only waiting dependants change: one cancelled meanwhile (or retried since) is left alone. The
      -- status is compared with a value the planner cannot see (as app/db/jobs.py RUNNING), so that
      -- jobs_waiting_idx, which stale statistics can make look empty, is never the way in: every waiting
      -- job of every queue would be read through it. The primary key is.
      UPDATE jobs AS j
      SET status = CASE
            WHEN pj.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run' THEN 'cancelled'
            WHEN j.pending_dependencies > pj.n THEN 'waiting'
            ELSE 'pending' END,
          pending_dependencies = CASE
            WHEN pj.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run' THEN j.pending_dependencies
            ELSE greatest(j.pending_dependencies - pj.n, 0) END,
          -- Released: due now, or at its own run_at if that is later (a delay counts from the enqueue).
          -- Claim order then puts it after the jobs that were ready before it.
          run_at = CASE
            WHEN pj.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run' THEN j.run_at
            WHEN j.pending_dependencies > pj.n THEN j.run_at
            ELSE greatest(j.run_at, now()) END,
          finished_at = CASE
            WHEN pj.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run' THEN clock_timestamp() END,
          last_error = CASE
            WHEN pj.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run'
            THEN format('dependency %s %s', pj.bad_id, parent_status) ELSE j.last_error END
      FROM per_job pj
      WHERE j.id = pj.job_id AND j.status = (SELECT 'waiting'::text)
      RETURNING j.id, j.queue_name, j.status, j.has_dependants
    ), counted AS (
      -- The finished-job counters (app/db/jobs.py count_finished), in the same statement.
      INSERT INTO queue_counts AS qc (queue_name, status, shard, n)
      SELECT queue_name, 'cancelled', mod(pg_backend_pid(), 64), count(*)
      FROM changed WHERE status = 'cancelled'
      GROUP BY 1
      ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = qc.n + EXCLUDED.n
    )
    SELECT coalesce(array_agg(DISTINCT queue_name) FILTER (WHERE status = 'pending'), '{}'),
           coalesce(array_agg(id) FILTER (WHERE status = 'cancelled'), '{}'),
           coalesce(array_agg(id ORDER BY id) FILTER (WHERE status = 'cancelled' AND has_dependants), '{}')
    INTO step_queues, step_cancelled, parents
    FROM changed;

    queues := queues || step_queues;
    cancelled := cancelled || step_cancelled;
    EXIT WHEN cardinality(parents) = 0;
    parent_status := 'cancelled';
  END LOOP;

  -- "db w q1 q2 ... #id ...", cut under the 8000-byte NOTIFY limit.
  SELECT array_agg(DISTINCT q) INTO names FROM unnest(queues) AS q;
  names := coalesce(names, '{}') || ARRAY(SELECT '#' || i FROM unnest(cancelled) AS i);
  message := 'db w';
  FOREACH item IN ARRAY names LOOP
    IF length(message) + 1 + length(item) > 7900 THEN
      PERFORM pg_notify('jobq_wakeup', message);
      message := 'db w';
    END IF;
    message := message || ' ' || item;
  END LOOP;
  IF message <> 'db w' THEN
    PERFORM pg_notify('jobq_wakeup', message);
  END IF;
  RETURN NULL;
END
$$;

-- The WHEN is checked before an event is queued: a job nobody depends on costs nothing more.
CREATE TRIGGER jobs_release_dependants
AFTER UPDATE OF status ON jobs
FOR EACH ROW
WHEN (NEW.has_dependants AND NEW.status IN ('completed', 'failed', 'cancelled')
      AND OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION jobs_release_dependants();
