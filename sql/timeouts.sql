-- Rendered from app/db/timeouts.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: JOB_FAIL_TIMED_OUT --
WITH over AS (
  -- Jobs with a timeout of their own, oldest claim first (jobs_timeout_idx: running jobs with a timeout).
  (SELECT j.id FROM jobq.jobs j
   WHERE j.status = 'running' AND j.timeout_seconds IS NOT NULL
     AND j.claimed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => j.timeout_seconds)
   ORDER BY j.claimed_at
   LIMIT %(batch)s)
  UNION
  -- Jobs without one, of the queues that have one (jobs_running_idx, per queue).
  (SELECT r.id FROM jobq.queue_state q CROSS JOIN LATERAL (
     SELECT j.id FROM jobq.jobs j
     WHERE j.queue_name = q.queue_name AND j.status = 'running' COLLATE "C" AND j.timeout_seconds IS NULL
       AND j.claimed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => q.timeout_seconds)
     LIMIT %(batch)s) r
   WHERE q.timeout_seconds IS NOT NULL)
), locked AS (
  -- Locked by primary key; SKIP LOCKED leaves a job its worker is finishing right now to that worker, and
  -- the conditions are checked again on the locked row (it may have been finished and claimed again).
  SELECT j.id FROM jobq.jobs j
  WHERE j.id = ANY(ARRAY(SELECT id FROM over)) AND j.status = (SELECT 'running'::text)
    AND j.claimed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => coalesce(j.timeout_seconds, (SELECT q.timeout_seconds FROM jobq.queue_state q WHERE q.queue_name = j.queue_name)))
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), failed AS (
  -- As a worker's fail with retry: back to pending after the queue's backoff (else the global one) while
  -- attempts remain, else failed for good.
  UPDATE jobq.jobs AS j
  SET status = CASE WHEN j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
      run_at = CASE WHEN j.attempts < j.max_attempts
                    THEN clock_timestamp() + make_interval(secs =>
                         least(coalesce((SELECT backoff_max_seconds FROM jobq.queue_state
                                         WHERE queue_name = j.queue_name),
                                        %(cap)s::float8),
                               coalesce((SELECT backoff_base_seconds FROM jobq.queue_state
                                         WHERE queue_name = j.queue_name),
                                        %(base)s::float8) * power(2, least(j.attempts - 1, 60)))
                         * (0.5 + random() / 2))
                    ELSE j.run_at END,
      finished_at = CASE WHEN j.attempts < j.max_attempts THEN NULL ELSE clock_timestamp() END,
      lease_expires_at = NULL,
      claim_token = j.claim_token || '~timeout',
      last_error = 'timeout'
  FROM locked
  WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = locked.id
  RETURNING j.id, j.queue_name AS queue, j.status, j.locked_by AS worker,
            coalesce(j.has_dependants, false) AS has_dependants
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
SELECT id, queue, status, worker, has_dependants FROM failed
