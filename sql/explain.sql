-- Rendered from app/db/explain.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: JOB_EXPLAIN --
WITH cfg AS (
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
), job AS (
  SELECT j.id, j.run_at, j.group_key, j.depends_on FROM jobq.jobs j WHERE j.id = %(id)s AND j.queue_name = %(queue)s
), w AS (
  -- The job's group, under the name the claim's group fragments read (its walk's `w.g`).
  SELECT job.group_key AS g FROM job
), group_recent AS (
  SELECT gr.n, gr.frees_at FROM w CROSS JOIN cfg LEFT JOIN LATERAL (
    SELECT sum(c.n) AS n, min(c.claimed_at) + make_interval(secs => cfg.group_rate_per_seconds) AS frees_at
    FROM jobq.queue_claims c, stamp
    WHERE c.queue_name = %(queue)s AND c.group_key = w.g AND cfg.group_rate_limit IS NOT NULL
      AND c.claimed_at > stamp.now - make_interval(secs => cfg.group_rate_per_seconds)
  ) gr ON true
  WHERE w.g IS NOT NULL
), head AS (
  -- An ordered group's turn: its first pending job in the group's order, due or not (as the claim's heads).
  SELECT h.id, h.run_at FROM w CROSS JOIN cfg CROSS JOIN LATERAL (
    SELECT id, run_at FROM jobq.jobs
    WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = w.g
    ORDER BY priority DESC, id LIMIT 1) h
  WHERE cfg.ordered AND w.g IS NOT NULL
)
SELECT cfg.paused, job.run_at > stamp.now AS not_due,
       cfg.concurrency, (SELECT coalesce(sum(n), 0) FROM running)::int AS running,
       ARRAY(SELECT r.id FROM jobq.jobs r WHERE r.queue_name = %(queue)s AND r.status = 'running' COLLATE "C"
             ORDER BY r.id LIMIT 100) AS running_ids,
       cfg.rate_limit, cfg.rate_per_seconds, coalesce((SELECT n FROM recent), 0)::int AS recent,
       (SELECT frees_at FROM recent) AS rate_frees_at,
       cfg.group_concurrency, coalesce((SELECT n FROM running r WHERE r.group_key = job.group_key), 0)::int
         AS group_running,
       ARRAY(SELECT r.id FROM jobq.jobs r WHERE r.queue_name = %(queue)s AND r.status = 'running' COLLATE "C"
               AND r.group_key = job.group_key ORDER BY r.id LIMIT 100) AS group_running_ids,
       cfg.group_rate_limit, cfg.group_rate_per_seconds,
       coalesce((SELECT n FROM group_recent), 0)::int AS group_recent,
       (SELECT frees_at FROM group_recent) AS group_rate_frees_at,
       cfg.ordered, (SELECT id FROM head) AS head_id
FROM cfg CROSS JOIN stamp CROSS JOIN job

-- name: JOB_PARENT_QUEUES --
SELECT d.parent_id, d.parent_queue FROM jobq.job_dependencies d
WHERE d.parent_id = ANY(%(parents)s::bigint[]) AND d.job_id = %(id)s

-- name: JOB_WAITING_FOR --
SELECT p.id FROM jobq.jobs p
WHERE p.queue_name = %(queue)s AND p.id = ANY(%(ids)s::bigint[])
  AND p.status NOT IN ('completed', 'failed', 'cancelled')
  AND (%(allowed)s::text IS NULL OR split_part(p.queue_name, '#', 1) ~ %(allowed)s::text)

-- name: PARENT_QUEUES_BY_ID --
SELECT id, queue_name FROM jobq.jobs WHERE id = ANY(%(ids)s::bigint[])
