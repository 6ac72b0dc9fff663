-- jobq: no-transaction
-- Running jobs with a timeout of their own, by claim time: what the timeout sweeper reads (app/db/timeouts.py).
-- Built concurrently: enqueues and claims go on while it is built. It holds only running jobs that have a
-- timeout, so it stays small.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_timeout_idx ON jobs (claimed_at)
  WHERE status = 'running' AND timeout_seconds IS NOT NULL;
