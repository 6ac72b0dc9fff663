-- Rendered from app/db/scale.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: QUEUES_HELD --
-- Queues whose claims something may hold back (limits, or paused): the others can claim every ready job.
SELECT queue_name FROM jobq.queue_state WHERE limited OR paused

-- name: QUEUE_SCALE --
WITH RECURSIVE cfg AS (
  -- The queue's limits as they are now: this statement started after the queue's claim lock was taken.
  -- No row (the configuration was just removed): no limits.
  SELECT coalesce(s.paused, false) AS paused, s.concurrency, s.rate_limit, s.rate_per_seconds,
         coalesce(s.group_concurrency, CASE WHEN s.ordered THEN 1 END) AS group_concurrency,
         s.group_rate_limit, s.group_rate_per_seconds, coalesce(s.fair, false) AS fair,
         coalesce(s.ordered, false) AS ordered, coalesce(s.grouped, false) AS grouped
  FROM (SELECT) one LEFT JOIN jobq.queue_state s ON s.queue_name = %(queue)s
), stamp AS (
  SELECT clock_timestamp() AS now
), running AS (
  -- Running jobs of this queue by group (jobs_running_idx): what the concurrency limits count.
  SELECT group_key, count(*) AS n FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = 'running' COLLATE "C"
    AND (SELECT concurrency IS NOT NULL OR group_concurrency IS NOT NULL FROM cfg)
  GROUP BY group_key
), recent AS (
  -- Claims of this queue inside its rate window, and when the oldest of them leaves it.
  SELECT coalesce(sum(c.n), 0) AS n, min(c.claimed_at) + make_interval(secs => cfg.rate_per_seconds) AS frees_at
  FROM cfg CROSS JOIN stamp
  JOIN jobq.queue_claims c ON c.queue_name = %(queue)s
   AND c.claimed_at > stamp.now - make_interval(secs => cfg.rate_per_seconds)
  WHERE cfg.rate_limit IS NOT NULL
  GROUP BY cfg.rate_per_seconds
), levels(p, first_run, k, acc) AS (
  -- The queue's priority levels with pending jobs, highest first (a loose scan of jobs_claim_idx, one probe
  -- per level, at most %(levels)s), each level's earliest run_at, and the due jobs so far, counted up to
  -- `cap` in all: within a level the due jobs come first in the index, so each count is one short range.
  SELECT f.priority, f.run_at, 1, (SELECT count(*) FROM (
      SELECT 1 FROM jobq.jobs
      WHERE queue_name = %(queue)s AND status = 'pending' AND priority = f.priority AND run_at <= stamp.now
      -- In the index's order: with stale statistics, a LIMIT alone may look cheapest as a sequential scan.
      ORDER BY priority DESC, run_at, id
      LIMIT greatest(%(cap)s, 0)) d)
  FROM stamp CROSS JOIN LATERAL (
    SELECT priority, run_at FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending'
    ORDER BY priority DESC, run_at, id LIMIT 1) f
  UNION ALL
  SELECT x.priority, x.run_at, l.k + 1, l.acc + (SELECT count(*) FROM (
      SELECT 1 FROM jobq.jobs
      WHERE queue_name = %(queue)s AND status = 'pending' AND priority = x.priority AND run_at <= stamp.now
      -- In the index's order: with stale statistics, a LIMIT alone may look cheapest as a sequential scan.
      ORDER BY priority DESC, run_at, id
      LIMIT greatest(%(cap)s - l.acc, 0)) d)
  FROM levels l CROSS JOIN stamp CROSS JOIN LATERAL (
    SELECT priority, run_at FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending' AND priority < l.p
    ORDER BY priority DESC, run_at, id LIMIT 1) x
  WHERE l.k < %(levels)s
), ready AS (
  SELECT coalesce(max(l.acc), 0)::int AS n,
         coalesce(max(l.acc), 0) >= %(cap)s OR count(*) >= %(levels)s AS capped,
         min(l.first_run) FILTER (WHERE l.first_run <= stamp.now) AS oldest
  FROM levels l CROSS JOIN stamp
  GROUP BY stamp.now
), rooms AS (
  -- What each queue-wide limit alone lets through, as the claim's `room`; `bound`: the least of them.
  SELECT r.n AS ready, r.capped, r.oldest,
         cfg.concurrency - (SELECT coalesce(sum(n), 0) FROM running)::int AS by_concurrency,
         cfg.rate_limit - coalesce((SELECT n FROM recent), 0)::int AS by_rate
  FROM cfg CROSS JOIN (SELECT * FROM ready UNION ALL SELECT 0, false, NULL WHERE NOT EXISTS (SELECT FROM ready)) r
), bound AS (
  SELECT greatest(0, least(ready, by_concurrency, by_rate)) AS n FROM rooms
), lane AS (
  -- Group limits: jobs without a group are held back by none; those among the first `bound` ready jobs.
  SELECT count(*) FILTER (WHERE w.group_key IS NULL)::int AS n FROM stamp CROSS JOIN LATERAL (
    SELECT group_key FROM jobq.jobs
    WHERE queue_name = %(queue)s AND status = 'pending' AND run_at <= stamp.now AND (SELECT grouped FROM cfg)
    ORDER BY priority DESC, run_at, id
    LIMIT (SELECT n FROM bound)) w
), walk(g, k, acc) AS (
  -- Then every group with pending jobs, once, in key order (as the claim's walk), adding what each lets
  -- through, until that covers `bound` (more would change nothing) or %(groups)s groups were seen.
  SELECT f.g, 1, (SELECT count(*) FILTER (WHERE h.run_at <= stamp.now) FROM (
      SELECT run_at FROM jobq.jobs
      WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = f.g
        AND (cfg.ordered OR run_at <= stamp.now)
      ORDER BY priority DESC, id
      LIMIT greatest(0, least(%(cap)s::int,
        cfg.group_concurrency - coalesce((SELECT r.n FROM running r WHERE r.group_key = f.g), 0)::int,
        cfg.group_rate_limit - coalesce((
          SELECT sum(c.n) FROM jobq.queue_claims c
          WHERE c.queue_name = %(queue)s AND c.group_key = f.g AND cfg.group_rate_limit IS NOT NULL
            AND c.claimed_at > stamp.now - make_interval(secs => cfg.group_rate_per_seconds)), 0)::int,
        CASE WHEN cfg.ordered THEN 1 END))) h)
  FROM cfg CROSS JOIN stamp CROSS JOIN LATERAL (
    SELECT group_key AS g FROM jobq.jobs
    WHERE queue_name = %(queue)s AND status = 'pending' AND group_key IS NOT NULL
    ORDER BY group_key LIMIT 1) f
  WHERE cfg.grouped AND (SELECT n FROM bound) > (SELECT n FROM lane)
  UNION ALL
  SELECT x.g, w.k + 1, w.acc + (SELECT count(*) FILTER (WHERE h.run_at <= stamp.now) FROM (
      SELECT run_at FROM jobq.jobs
      WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = x.g
        AND (cfg.ordered OR run_at <= stamp.now)
      ORDER BY priority DESC, id
      LIMIT greatest(0, least(%(cap)s::int,
        cfg.group_concurrency - coalesce((SELECT r.n FROM running r WHERE r.group_key = x.g), 0)::int,
        cfg.group_rate_limit - coalesce((
          SELECT sum(c.n) FROM jobq.queue_claims c
          WHERE c.queue_name = %(queue)s AND c.group_key = x.g AND cfg.group_rate_limit IS NOT NULL
            AND c.claimed_at > stamp.now - make_interval(secs => cfg.group_rate_per_seconds)), 0)::int,
        CASE WHEN cfg.ordered THEN 1 END))) h)
  FROM walk w CROSS JOIN cfg CROSS JOIN stamp CROSS JOIN LATERAL (
    SELECT group_key AS g FROM jobq.jobs
    WHERE queue_name = %(queue)s AND status = 'pending' AND group_key > w.g
    ORDER BY group_key LIMIT 1) x
  WHERE w.k < %(groups)s AND w.acc < (SELECT n FROM bound) - (SELECT n FROM lane)
)
SELECT cfg.paused, rooms.ready, rooms.capped OR (SELECT count(*) >= %(groups)s FROM walk) AS capped,
       extract(epoch FROM stamp.now - rooms.oldest)::float8 AS oldest_ready_age,
       -- Every running job of the queue (jobs_running_idx), whether or not a limit counts them.
       (SELECT count(*) FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'running' COLLATE "C")::int AS running,
       cfg.concurrency, cfg.rate_limit, cfg.rate_per_seconds,
       rooms.by_concurrency AS room_concurrency, rooms.by_rate AS room_rate,
       CASE WHEN cfg.grouped THEN (SELECT n FROM lane) + coalesce((SELECT max(acc) FROM walk), 0)::int END
         AS room_groups
FROM cfg CROSS JOIN stamp CROSS JOIN rooms
