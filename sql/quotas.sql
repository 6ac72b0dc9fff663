-- Rendered from app/db/quotas.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: QUEUES_LIVE_COUNT --
-- Live queues, at most %(cap)s: the queues with pending, waiting or running jobs by loose scans of
-- jobs_claim_idx, jobs_waiting_idx and jobs_running_idx (one index descent per queue, however long the
-- queue, each walk stopping after %(cap)s queues), and those with a configuration.
WITH RECURSIVE pending(name, n) AS (
  (SELECT queue_name, 0 FROM jobq.jobs WHERE status = 'pending' ORDER BY queue_name LIMIT 1)
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs
          WHERE status = 'pending' AND queue_name > p.name ORDER BY queue_name LIMIT 1),
         p.n + (CASE WHEN strpos(p.name, '#') = 0 THEN 1 ELSE 0 END)
  FROM pending p WHERE p.name IS NOT NULL AND p.n + (CASE WHEN strpos(p.name, '#') = 0 THEN 1 ELSE 0 END) < %(cap)s
), waiting(name, n) AS (
  (SELECT queue_name, 0 FROM jobq.jobs WHERE status = 'waiting' ORDER BY queue_name LIMIT 1)
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs
          WHERE status = 'waiting' AND queue_name > w.name ORDER BY queue_name LIMIT 1),
         w.n + (CASE WHEN strpos(w.name, '#') = 0 THEN 1 ELSE 0 END)
  FROM waiting w WHERE w.name IS NOT NULL AND w.n + (CASE WHEN strpos(w.name, '#') = 0 THEN 1 ELSE 0 END) < %(cap)s
), running(name, n) AS (
  (SELECT queue_name, 0 FROM jobq.jobs WHERE status = 'running' COLLATE "C" ORDER BY queue_name LIMIT 1)
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = 'running' COLLATE "C" AND queue_name > r.name
          ORDER BY queue_name LIMIT 1),
         r.n + (CASE WHEN strpos(r.name, '#') = 0 THEN 1 ELSE 0 END)
  FROM running r WHERE r.name IS NOT NULL AND r.n + (CASE WHEN strpos(r.name, '#') = 0 THEN 1 ELSE 0 END) < %(cap)s
)
SELECT count(*) FROM (
  SELECT name FROM pending WHERE name IS NOT NULL AND strpos(name, '#') = 0
  UNION SELECT name FROM waiting WHERE name IS NOT NULL AND strpos(name, '#') = 0
  UNION SELECT name FROM running WHERE name IS NOT NULL AND strpos(name, '#') = 0
  UNION (SELECT queue_name FROM jobq.queue_state WHERE strpos(queue_name, '#') = 0
         ORDER BY queue_name LIMIT %(cap)s)
  LIMIT %(cap)s
) q

-- name: QUEUES_LIVE_COUNT_FANOUT --
SELECT count(*) FROM (
  SELECT queue_name FROM (
    SELECT queue_name FROM jobq.jobs WHERE status IN ('pending', 'waiting', 'running') GROUP BY queue_name
    UNION SELECT queue_name FROM jobq.queue_state
  ) u
  WHERE strpos(queue_name, '#') = 0
  LIMIT %(cap)s
) q

-- name: QUEUE_BACKLOG_COUNT --
-- Jobs of one queue not yet started, at most %(cap)s of each kind: pending ones (due or delayed) index-only
-- over jobs_claim_idx, those waiting for dependencies over jobs_waiting_idx, each walk stopping at the cap.
SELECT (SELECT count(*) FROM (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending'
                              LIMIT %(cap)s) p)
     + (SELECT count(*) FROM (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'waiting'
                              LIMIT %(cap)s) w)

-- name: QUEUE_LIVE --
-- Whether a queue is live: it holds a job not finished yet, or a configuration (paused, limits). One index
-- probe each.
SELECT EXISTS (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending')
    OR EXISTS (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'waiting')
    OR EXISTS (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'running' COLLATE "C")
    OR EXISTS (SELECT 1 FROM jobq.queue_state WHERE queue_name = %(queue)s)
