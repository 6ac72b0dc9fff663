-- Release per statement, not per row: a statement that finishes several jobs with dependants (a batch
-- complete, a group of coalesced completes, a bulk cancel, the rescuer's terminal fails) releases all their
-- dependants in one pass, locking them in one id order.
--
-- Why: 0010 ran the release once per finished row. Each call locked its own parent's dependants in id
-- order, but a statement finishing parents A and B locked A's dependants, then B's. Two statements
-- finishing (A, B) and (C, D), where X depends on A and D and Y on B and C, took X then Y and Y then X:
-- a deadlock, and one of them (a worker's complete) failed with 503. Now every statement takes the
-- dependants of all the jobs it finished in one id order, so such statements queue instead.
--
-- How: the row trigger jobs_release_dependants keeps its WHEN (a job nobody depends on costs nothing) and
-- only notes the finished job's id in a transaction-local setting; the statement trigger below reads the
-- notes at the end of the statement (after every row trigger of it) and runs 0010's loop once per parent
-- status (one statement finishes jobs with one status: complete, fail, cancel). It costs a statement that
-- changes a job's status one call of a function that finds no note and returns.

CREATE OR REPLACE FUNCTION jobs_release_dependants() RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF pg_trigger_depth() = 1 THEN  -- deeper: a job the release itself cancelled, which its loop follows
    PERFORM set_config('jobq.finished_parents',
                       coalesce(current_setting('jobq.finished_parents', true), '') || NEW.id || ',', true);
  END IF;
  RETURN NULL;
END
$$;

CREATE FUNCTION jobs_release_finished() RETURNS trigger
LANGUAGE plpgsql VOLATILE
-- As in 0010: every query reaches jobs and job_dependencies by primary key (see there).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
  noted     text := current_setting('jobq.finished_parents', true);
  parents   bigint[];
  parent_status text;
  queues    text[] := '{}';
  cancelled bigint[] := '{}';
  step_queues    text[];
  step_cancelled bigint[];
  names     text[];
  message   text;
  item      text;
BEGIN
  IF pg_trigger_depth() > 1 OR noted IS NULL OR noted = '' THEN
    RETURN NULL;  -- nothing finished with dependants (or a statement of the release itself)
  END IF;
  PERFORM set_config('jobq.finished_parents', '', true);
  FOR parent_status, parents IN
    SELECT j.status, array_agg(j.id ORDER BY j.id) FROM jobs j
    WHERE j.id = ANY(ARRAY(SELECT DISTINCT n::bigint FROM unnest(string_to_array(rtrim(noted, ','), ',')) AS n))
    GROUP BY j.status ORDER BY j.status
  LOOP
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

CREATE TRIGGER jobs_release_finished
AFTER UPDATE OF status ON jobs
FOR EACH STATEMENT
EXECUTE FUNCTION jobs_release_finished();
