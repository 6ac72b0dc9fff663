-- Rendered from app/db/rescue.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: JOB_FAIL_EXHAUSTED --
WITH exhausted AS (
  -- One queue's lapsed leases on the last attempt: the terminal path, kept separate so it is easy to see.
  SELECT id FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = 'running'
    AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    AND attempts >= max_attempts
  ORDER BY lease_expires_at
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), failed AS (
  UPDATE jobq.jobs AS j
  SET status = 'failed', finished_at = now(), lease_expires_at = NULL,
      last_error = 'lease expired on the last attempt'
  FROM exhausted
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM exhausted)) AND j.id = exhausted.id
  RETURNING j.queue_name AS queue, j.status, j.id, coalesce(j.has_dependants, false) AS has_dependants
  -- The jobs waiting for these are released (cancelled) afterwards, by the dependency release: recorded, and
  -- counted, by statements of their own in this transaction (app/db/finishing.py).
)
SELECT queue, id, has_dependants FROM failed

-- name: JOB_LAPSED_QUEUES --
-- The queues among the oldest `scan` lapsed leases, other than those in `skip` (done or failed in this pass):
-- an index-only read of jobs_lease_idx, no lock. A queue done this pass is skipped even when some of its
-- lapsed jobs are left (locked by a worker finishing them: SKIP LOCKED left them), so a pass always ends.
SELECT DISTINCT queue_name FROM (
  SELECT queue_name FROM jobq.jobs
  WHERE status = 'running'
    AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    AND queue_name <> ALL(%(skip)s::text[])
  ORDER BY lease_expires_at
  LIMIT %(scan)s
) lapsed

-- name: JOB_RESCUE_EXPIRED --
WITH expired AS (
  -- One queue's leases that lapsed while attempts remain, oldest first through jobs_queue_lease_idx. SKIP
  -- LOCKED: replicas rescuing at once split the work, and a job that a worker is completing right now is
  -- left to that worker.
  SELECT id FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = 'running'
    AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    AND attempts < max_attempts
  ORDER BY lease_expires_at
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
)
UPDATE jobq.jobs AS j
SET status = 'pending', run_at = now(), lease_expires_at = NULL, claim_token = NULL,
    last_error = 'lease expired'
FROM expired
WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM expired)) AND j.id = expired.id
RETURNING j.queue_name
