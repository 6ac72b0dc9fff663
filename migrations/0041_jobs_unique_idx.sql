-- jobq: no-transaction
-- Unique jobs (0040): at most one job per (queue, unique key, window start, window length) among the jobs
-- in one of the states their key holds in. The enqueue's ON CONFLICT DO NOTHING is what makes it race-free: of concurrent
-- enqueues with one key, one inserts and the others wait for it, then find it (app/db/jobs.py). Jobs without
-- a unique key are not in it, so it costs the other enqueues and every claim nothing.
-- The window's length is in the key: aligned windows of different lengths share starts (12:00:00 starts a
-- 60 s and a 3600 s window), and a different for_seconds is another key (docs/producers.md).
-- Built concurrently: enqueues and claims go on while it is built.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_unique_idx
  ON jobs (queue_name, unique_key, unique_from, coalesce(unique_for_seconds, 0))
  WHERE unique_key IS NOT NULL AND status = ANY(unique_states);
