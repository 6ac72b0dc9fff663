-- Rendered from app/db/workers.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: WORKERS_FLUSH --
WITH input AS (
  SELECT * FROM json_to_recordset(%(rows)s::json)
    AS t(name text, queue text, sdk text, version text, host text, seen bool, completed int, failed int)
), seen AS (
  -- Stamped with this statement's clock: a flush runs about once a second, so last_seen is that close.
  INSERT INTO jobq.workers AS w (name, queue_name, sdk, version, host, first_seen, last_seen)
  SELECT name, queue, sdk, version, host, now(), now() FROM input WHERE seen
  ON CONFLICT (queue_name, name) DO UPDATE
  SET last_seen = EXCLUDED.last_seen,
      -- What a request told, else what the worker told before (a complete says nothing of the SDK).
      sdk = coalesce(EXCLUDED.sdk, w.sdk), version = coalesce(EXCLUDED.version, w.version),
      host = coalesce(EXCLUDED.host, w.host)
), counted AS (
  INSERT INTO jobq.worker_minutes AS m (queue_name, name, minute, completed, failed)
  SELECT queue, name, date_trunc('minute', now()), completed, failed FROM input WHERE completed > 0 OR failed > 0
  ON CONFLICT (queue_name, name, minute) DO UPDATE
  SET completed = m.completed + EXCLUDED.completed, failed = m.failed + EXCLUDED.failed
)
SELECT count(*) FROM input

-- name: WORKERS_LIST --
WITH w AS (
  SELECT w.name, array_agg(w.queue_name ORDER BY w.queue_name) AS queues,
         -- What the worker said most recently, whichever queue it said it on.
         (array_agg(w.sdk ORDER BY w.last_seen DESC) FILTER (WHERE w.sdk IS NOT NULL))[1] AS sdk,
         (array_agg(w.version ORDER BY w.last_seen DESC) FILTER (WHERE w.version IS NOT NULL))[1] AS version,
         (array_agg(w.host ORDER BY w.last_seen DESC) FILTER (WHERE w.host IS NOT NULL))[1] AS host,
         min(w.first_seen) AS first_seen, max(w.last_seen) AS last_seen
  FROM jobq.workers w
  WHERE w.last_seen > now() - make_interval(secs => %(keep)s) AND (%(allowed)s::text IS NULL OR split_part(w.queue_name, '#', 1) ~ %(allowed)s::text)
  GROUP BY w.name
), held AS (
  SELECT j.locked_by AS name, count(*) AS n, max(j.lease_expires_at) AS lease_expires_at,
         (array_agg(j.id ORDER BY j.claimed_at, j.id))[1:%(ids)s] AS job_ids
  FROM jobq.jobs j
  WHERE j.status = 'running' AND j.locked_by IN (SELECT name FROM w)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  GROUP BY j.locked_by
), done AS (
  SELECT m.name, sum(m.completed) AS completed, sum(m.failed) AS failed
  FROM jobq.worker_minutes m
  WHERE m.minute > now() - interval '1 hour' AND m.name IN (SELECT name FROM w)
    AND (%(allowed)s::text IS NULL OR split_part(m.queue_name, '#', 1) ~ %(allowed)s::text)
  GROUP BY m.name
)
SELECT w.name,
       coalesce(h.lease_expires_at > now(), false) OR w.last_seen > now() - make_interval(secs => %(gone)s)
         AS live,
       w.queues, w.sdk, w.version, w.host, w.first_seen, w.last_seen,
       coalesce(h.n, 0)::int AS jobs_held, coalesce(h.job_ids, '{}') AS job_ids, h.lease_expires_at,
       coalesce(d.completed, 0)::int AS completed_last_hour, coalesce(d.failed, 0)::int AS failed_last_hour
FROM w
LEFT JOIN held h ON h.name = w.name
LEFT JOIN done d ON d.name = w.name
ORDER BY 2 DESC, w.last_seen DESC, w.name
LIMIT %(limit)s

-- name: WORKERS_PRUNE --
-- One queue's workers not seen for `keep` seconds, and its minutes older than the hour the figures cover.
WITH gone AS (
  DELETE FROM jobq.workers
  WHERE queue_name = %(queue)s AND last_seen < now() - make_interval(secs => %(keep)s)
  RETURNING 1
), old AS (
  DELETE FROM jobq.worker_minutes WHERE queue_name = %(queue)s AND minute < now() - interval '65 minutes' RETURNING 1
)
SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM old)

-- name: WORKERS_STALE_QUEUES --
-- The queues with workers not seen for `keep` seconds (workers_last_seen_idx) or minutes older than the hour
-- the figures cover (worker_minutes_minute_idx), other than those in `skip` (done in this pass), among the
-- oldest `scan` of each. On Citus a read of every shard, about once a minute; each queue is then pruned on its
-- own shard.
SELECT queue_name FROM (
  SELECT queue_name FROM jobq.workers
  WHERE last_seen < now() - make_interval(secs => %(keep)s) AND queue_name <> ALL(%(skip)s::text[])
  ORDER BY last_seen
  LIMIT %(scan)s
) w
UNION
SELECT queue_name FROM (
  SELECT queue_name FROM jobq.worker_minutes
  WHERE minute < now() - interval '65 minutes' AND queue_name <> ALL(%(skip)s::text[])
  ORDER BY minute
  LIMIT %(scan)s
) m

-- name: WORKER_GET --
WITH w AS (
  SELECT w.name, array_agg(w.queue_name ORDER BY w.queue_name) AS queues,
         -- What the worker said most recently, whichever queue it said it on.
         (array_agg(w.sdk ORDER BY w.last_seen DESC) FILTER (WHERE w.sdk IS NOT NULL))[1] AS sdk,
         (array_agg(w.version ORDER BY w.last_seen DESC) FILTER (WHERE w.version IS NOT NULL))[1] AS version,
         (array_agg(w.host ORDER BY w.last_seen DESC) FILTER (WHERE w.host IS NOT NULL))[1] AS host,
         min(w.first_seen) AS first_seen, max(w.last_seen) AS last_seen
  FROM jobq.workers w
  WHERE w.name = %(name)s AND (%(allowed)s::text IS NULL OR split_part(w.queue_name, '#', 1) ~ %(allowed)s::text)
  GROUP BY w.name
), held AS (
  SELECT j.locked_by AS name, count(*) AS n, max(j.lease_expires_at) AS lease_expires_at,
         (array_agg(j.id ORDER BY j.claimed_at, j.id))[1:%(ids)s] AS job_ids
  FROM jobq.jobs j
  WHERE j.status = 'running' AND j.locked_by IN (SELECT name FROM w)
    AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
  GROUP BY j.locked_by
), done AS (
  SELECT m.name, sum(m.completed) AS completed, sum(m.failed) AS failed
  FROM jobq.worker_minutes m
  WHERE m.minute > now() - interval '1 hour' AND m.name IN (SELECT name FROM w)
    AND (%(allowed)s::text IS NULL OR split_part(m.queue_name, '#', 1) ~ %(allowed)s::text)
  GROUP BY m.name
)
SELECT w.name,
       coalesce(h.lease_expires_at > now(), false) OR w.last_seen > now() - make_interval(secs => %(gone)s)
         AS live,
       w.queues, w.sdk, w.version, w.host, w.first_seen, w.last_seen,
       coalesce(h.n, 0)::int AS jobs_held, coalesce(h.job_ids, '{}') AS job_ids, h.lease_expires_at,
       coalesce(d.completed, 0)::int AS completed_last_hour, coalesce(d.failed, 0)::int AS failed_last_hour
FROM w
LEFT JOIN held h ON h.name = w.name
LEFT JOIN done d ON d.name = w.name
ORDER BY 2 DESC, w.last_seen DESC, w.name
LIMIT %(limit)s

-- name: WORKER_JOBS --
-- The jobs a worker holds now (of the caller's queues), oldest claim first.
SELECT j.id, j.queue_name AS queue, j.attempts, j.max_attempts, j.claimed_at, j.lease_expires_at,
       j.progress::text AS progress
FROM jobq.jobs j
WHERE j.status = 'running' AND j.locked_by = %(name)s AND (%(allowed)s::text IS NULL OR split_part(j.queue_name, '#', 1) ~ %(allowed)s::text)
ORDER BY j.claimed_at, j.id
LIMIT %(limit)s
