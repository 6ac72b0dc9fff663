-- Rendered from app/db/timeouts.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: JOB_FAIL_TIMED_OUT --
WITH over AS (
  -- The queue's jobs with a timeout of their own, oldest claim first (jobs_timeout_idx: running jobs with
  -- a timeout).
  (SELECT j.id FROM jobq.jobs j
   WHERE j.queue_name = %(queue)s AND j.status = 'running' AND j.timeout_seconds IS NOT NULL
     AND j.claimed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => j.timeout_seconds)
   ORDER BY j.claimed_at
   LIMIT %(batch)s)
  UNION
  -- Its jobs without one, when the queue has one (jobs_running_idx).
  (SELECT j.id FROM jobq.queue_state q JOIN jobq.jobs j ON j.queue_name = q.queue_name
   WHERE q.queue_name = %(queue)s AND q.timeout_seconds IS NOT NULL
     AND j.queue_name = %(queue)s AND j.status = 'running' COLLATE "C" AND j.timeout_seconds IS NULL
     AND j.claimed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => q.timeout_seconds)
   LIMIT %(batch)s)
), locked AS (
  -- Locked by primary key; SKIP LOCKED leaves a job its worker is finishing right now to that worker, and
  -- the conditions are checked again on the locked row (it may have been finished and claimed again). As a
  -- worker's fail with retry: back to pending after the queue's backoff (else the global one) while attempts
  -- remain, else failed for good. What the UPDATE sets is computed here: on Citus an UPDATE may neither
  -- call a volatile function nor apply a stable one to a column (app/db/distribute.py).
  SELECT j.id, j.attempts < j.max_attempts AS retry,
         clock_timestamp() + make_interval(secs =>
           least(coalesce(q.backoff_max_seconds, %(cap)s::float8),
                 coalesce(q.backoff_base_seconds, %(base)s::float8) * power(2, least(j.attempts - 1, 60)))
           * (0.5 + random() / 2)) AS retry_at,
         clock_timestamp() AS now
  FROM jobq.jobs j
  LEFT JOIN jobq.queue_state q ON q.queue_name = j.queue_name AND q.queue_name = %(queue)s
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM over)) AND j.status = (SELECT 'running'::text)
    AND j.claimed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => coalesce(j.timeout_seconds, q.timeout_seconds))
  LIMIT %(batch)s
  FOR UPDATE OF j SKIP LOCKED
), failed AS (
  UPDATE jobq.jobs AS j
  SET status = CASE WHEN l.retry THEN 'pending' ELSE 'failed' END,
      run_at = CASE WHEN l.retry THEN l.retry_at ELSE j.run_at END,
      finished_at = CASE WHEN l.retry THEN NULL ELSE l.now END,
      lease_expires_at = NULL,
      claim_token = j.claim_token || '~timeout',
      last_error = 'timeout'
  FROM locked l
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = l.id
  RETURNING j.id, j.queue_name AS queue, j.status, j.locked_by AS worker,
            coalesce(j.has_dependants, false) AS has_dependants
  -- Those failed for good are counted, and those with dependants recorded for the dependency release, by
  -- statements of their own in this transaction (app/db/finishing.py).
)
SELECT id, queue, status, worker, has_dependants FROM failed

-- name: JOB_TIMEOUT_QUEUES --
-- The queues with running jobs past their timeout, other than those in `skip` (done in this pass): the queues
-- among the `scan` oldest claims of jobs with a timeout of their own (jobs_timeout_idx), and the queues with a
-- timeout of their own that have a running job without one past it (jobs_running_idx, one probe per queue).
-- A read, no lock. On Citus it goes to every shard, once per look (the sweep's look over all queues); each
-- queue is then swept by JOB_FAIL_TIMED_OUT on its own shard.
SELECT queue_name FROM (
  SELECT j.queue_name FROM jobq.jobs j
  WHERE j.status = 'running' AND j.timeout_seconds IS NOT NULL
    AND j.claimed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => j.timeout_seconds)
    AND j.queue_name <> ALL(%(skip)s::text[])
  ORDER BY j.claimed_at
  LIMIT %(scan)s
) own
UNION
(SELECT q.queue_name FROM jobq.queue_state q
 WHERE q.timeout_seconds IS NOT NULL AND q.queue_name <> ALL(%(skip)s::text[])
   AND EXISTS (SELECT FROM jobq.jobs j
               WHERE j.queue_name = q.queue_name AND j.status = 'running' COLLATE "C" AND j.timeout_seconds IS NULL
                 AND j.claimed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => q.timeout_seconds))
 ORDER BY q.queue_name
 LIMIT %(scan)s)
