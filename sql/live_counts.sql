-- Rendered from app/db/live_counts.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: LIVE_COUNTS_CLOCK --
UPDATE jobq.live_counts_clock SET counted_at = now(), took_seconds = %(took)s WHERE id

-- name: LIVE_COUNTS_DUE --
-- Whether a count is due: the last one is older than the interval, or than ten times that count's duration
-- (counting takes at most about a tenth of one core, a count that failed included).
SELECT counted_at <= now() - make_interval(secs => greatest(%(interval)s, 10 * took_seconds))
FROM jobq.live_counts_clock WHERE id

-- name: LIVE_COUNTS_LOCK --
SELECT pg_try_advisory_xact_lock(1785684588)

-- name: LIVE_COUNTS_PRUNE --
-- Queues the count just made found without a live job.
DELETE FROM jobq.queue_live_counts WHERE counted_at < now()

-- name: LIVE_COUNTS_WRITE --
-- Every queue's live jobs, as of this transaction's now().
INSERT INTO jobq.queue_live_counts AS l (queue_name, ready, scheduled, running, waiting, on_last, one_left,
                                         oldest_ready, counted_at)
SELECT queue_name, ready, scheduled, running, waiting, on_last, one_left, oldest_ready, now()
FROM (
SELECT queue_name, sum(ready)::bigint AS ready, sum(scheduled)::bigint AS scheduled, sum(running)::bigint AS running,
       sum(waiting)::bigint AS waiting, sum(on_last)::bigint AS on_last, sum(one_left)::bigint AS one_left,
       min(oldest_ready) AS oldest_ready
FROM (
  SELECT queue_name, count(*) FILTER (WHERE run_at <= now()) AS ready,
         count(*) FILTER (WHERE run_at > now()) AS scheduled, 0 AS running, 0 AS waiting, 0 AS on_last,
         0 AS one_left, min(run_at) FILTER (WHERE run_at <= now()) AS oldest_ready
  FROM jobq.jobs WHERE status = 'pending' GROUP BY queue_name
  UNION ALL
  SELECT queue_name, 0, 0, count(*), 0, 0, 0, NULL FROM jobq.jobs WHERE status = 'running' COLLATE "C" GROUP BY queue_name
  UNION ALL
  SELECT queue_name, 0, 0, 0, count(*), 0, 0, NULL FROM jobq.jobs WHERE status = 'waiting' GROUP BY queue_name
  UNION ALL
  -- jobs_last_attempts_idx holds exactly these rows.
  SELECT queue_name, 0, 0, 0, 0, count(*) FILTER (WHERE attempts >= max_attempts),
         count(*) FILTER (WHERE attempts = max_attempts - 1), NULL
  FROM jobq.jobs WHERE status IN ('pending', 'running') AND attempts >= max_attempts - 1 GROUP BY queue_name
) k
GROUP BY queue_name
) v
ON CONFLICT (queue_name) DO UPDATE SET
  ready = EXCLUDED.ready, scheduled = EXCLUDED.scheduled, running = EXCLUDED.running, waiting = EXCLUDED.waiting,
  on_last = EXCLUDED.on_last, one_left = EXCLUDED.one_left, oldest_ready = EXCLUDED.oldest_ready,
  counted_at = EXCLUDED.counted_at

-- name: LIVE_GROUPS_PRUNE --
-- Groups that are no longer among their queue's top ones, or have no ready job left.
DELETE FROM jobq.queue_live_groups WHERE counted_at < now()

-- name: LIVE_GROUPS_WRITE --
-- Every queue's 60 groups with the most ready jobs (index-only over jobs_group_idx), with their running
-- jobs (jobs_running_idx), as of this transaction's now(). Ranked per queue, the distribution column: on Citus
-- each shard ranks its own queues.
INSERT INTO jobq.queue_live_groups AS l (queue_name, group_key, ready, running, counted_at)
SELECT t.queue_name, t.group_key, t.ready, coalesce(r.running, 0), now()
FROM (
  SELECT queue_name, group_key, ready,
         row_number() OVER (PARTITION BY queue_name ORDER BY ready DESC, group_key) AS rank
  FROM (
    SELECT queue_name, group_key, count(*) FILTER (WHERE run_at <= now()) AS ready FROM jobq.jobs
    WHERE status = 'pending' AND group_key IS NOT NULL GROUP BY queue_name, group_key
  ) g
  WHERE ready > 0
) t
LEFT JOIN (
  SELECT queue_name, group_key, count(*) AS running FROM jobq.jobs
  WHERE status = 'running' COLLATE "C" AND group_key IS NOT NULL GROUP BY queue_name, group_key
) r ON r.queue_name = t.queue_name AND r.group_key = t.group_key
WHERE t.rank <= 60
ON CONFLICT (queue_name, group_key) DO UPDATE SET
  ready = EXCLUDED.ready, running = EXCLUDED.running, counted_at = EXCLUDED.counted_at

-- name: NO_SEQSCAN --
SET LOCAL enable_seqscan = off

-- name: REFRESH_TIMEOUT --
SET LOCAL statement_timeout = 60000
