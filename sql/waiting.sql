-- Rendered from app/db/waiting.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: QUEUES_READY --
-- The waited queues that have a claimable job now: pending, due, and the queue not paused (a paused
-- queue with a backlog is not kicked every pass; its resume is a wake-up, and a resume whose wake-up was
-- lost is seen by the next pass, as the queue is then no longer paused). Limits are not looked at: a
-- limited queue with ready jobs is named even when its limit holds them back, bounded by the queues that
-- have ready work. The LATERAL (not EXISTS, which the planner may turn into a hash join reading every
-- pending job) keeps it one index probe per queue whatever the statistics say.
SELECT q.name
FROM unnest(%(queues)s::text[]) AS q(name)
CROSS JOIN LATERAL (
  WITH RECURSIVE heads AS (
    (SELECT priority, run_at FROM jobq.jobs
     WHERE queue_name = q.name AND status = 'pending'
     ORDER BY priority DESC, run_at
     LIMIT 1)
    UNION ALL
    SELECT below.priority, below.run_at
    FROM heads AS h
    CROSS JOIN LATERAL (
      SELECT priority, run_at FROM jobq.jobs
      WHERE queue_name = q.name AND status = 'pending' AND priority < h.priority
      ORDER BY priority DESC, run_at
      LIMIT 1
    ) AS below
    WHERE h.run_at > now()  -- this level's first job is not due: look at the next level down
  )
  SELECT FROM heads WHERE run_at <= now() LIMIT 1
) AS ready
WHERE NOT EXISTS (SELECT FROM jobq.queue_state s WHERE s.queue_name = q.name AND s.paused)

-- name: QUEUE_READY --
SELECT %(queue)s::text AS name
FROM (
  WITH RECURSIVE heads AS (
    (SELECT priority, run_at FROM jobq.jobs
     WHERE queue_name = %(queue)s AND status = 'pending'
     ORDER BY priority DESC, run_at
     LIMIT 1)
    UNION ALL
    SELECT below.priority, below.run_at
    FROM heads AS h
    CROSS JOIN LATERAL (
      SELECT priority, run_at FROM jobq.jobs
      WHERE queue_name = %(queue)s AND status = 'pending' AND priority < h.priority
      ORDER BY priority DESC, run_at
      LIMIT 1
    ) AS below
    WHERE h.run_at > now()  -- this level's first job is not due: look at the next level down
  )
  SELECT FROM heads WHERE run_at <= now() LIMIT 1
) AS ready
WHERE NOT EXISTS (SELECT FROM jobq.queue_state s WHERE s.queue_name = %(queue)s AND s.paused)
