-- Rendered from app/db/rescue.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: JOB_FAIL_EXHAUSTED --
WITH exhausted AS (
  -- Lapsed leases on the last attempt: the terminal path, kept separate so it is easy to see.
  SELECT id FROM jobs
  WHERE status = 'running'
    AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    AND attempts >= max_attempts
  ORDER BY lease_expires_at
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), failed AS (
  UPDATE jobs AS j
  SET status = 'failed', finished_at = clock_timestamp(), lease_expires_at = NULL,
      last_error = 'lease expired on the last attempt'
  FROM exhausted
  WHERE j.id = ANY(ARRAY(SELECT id FROM exhausted)) AND j.id = exhausted.id
  RETURNING j.queue_name AS queue, j.status, j.id
), counted AS (
  INSERT INTO queue_counts AS c (queue_name, status, shard, n)
  SELECT queue, status, mod(pg_backend_pid(), 64), sum(1)
  FROM failed
  WHERE status IN ('completed', 'failed', 'cancelled')
  GROUP BY 1, 2
  ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n
)
SELECT queue, id FROM failed

-- name: JOB_RESCUE_EXPIRED --
WITH expired AS (
  -- Leases that lapsed while attempts remain, oldest first through jobs_lease_idx. SKIP LOCKED:
  -- replicas rescuing at once split the work, and a job that a worker is completing right now is left
  -- to that worker.
  SELECT id FROM jobs
  WHERE status = 'running'
    AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    AND attempts < max_attempts
  ORDER BY lease_expires_at
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
)
UPDATE jobs AS j
SET status = 'pending', run_at = now(), lease_expires_at = NULL, claim_token = NULL,
    last_error = 'lease expired'
FROM expired
WHERE j.id = ANY(ARRAY(SELECT id FROM expired)) AND j.id = expired.id
RETURNING j.queue_name
