-- Rendered from app/db/schedules.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: CLOCK --
SELECT clock_timestamp()

-- name: SCHEDULES_ADVANCE --
WITH advance AS (
  SELECT * FROM json_to_recordset(%(advance)s::json)
    AS a(name text, revision bigint, due timestamptz, next timestamptz, last timestamptz)
)
-- Only from the state the ticks were computed from. Replicas that fire the same ticks queue on the row lock
-- (held until the ticks' jobs are made, in the same transaction); the first moves next_run_at, and the others
-- then match nothing and enqueue nothing.
UPDATE jobq.schedules AS s
SET next_run_at = a.next, last_run_at = coalesce(a.last, s.last_run_at)
FROM advance a
WHERE s.name = a.name AND s.revision = a.revision AND s.next_run_at = a.due AND NOT s.paused
RETURNING s.name, s.queue_name

-- name: SCHEDULES_COUNT --
SELECT count(*) FROM jobq.schedules

-- name: SCHEDULES_DUE --
-- Active schedules whose next tick has come, by the database clock, through schedules_due_idx. Not
-- locked: replicas that read the same schedule compute the same ticks, and SCHEDULES_FIRE lets one of
-- them through.
SELECT name, cron, timezone, missed, next_run_at, revision, now() AS now
FROM jobq.schedules
WHERE NOT paused AND next_run_at <= now() AND NOT EXISTS (
  SELECT FROM unnest(%(skip_names)s::text[], %(skip_crons)s::text[], %(skip_zones)s::text[]) AS x(name, cron, tz)
  WHERE x.name = schedules.name AND x.cron = schedules.cron AND x.tz = schedules.timezone)
ORDER BY next_run_at
LIMIT %(batch)s

-- name: SCHEDULES_LIST --
SELECT 
  s.name, s.queue_name AS queue, s.cron, s.timezone, s.payload::text AS payload, s.priority, s.max_attempts,
  s.job_group AS group, s.missed, s.paused, CASE WHEN s.paused THEN NULL ELSE s.next_run_at END AS next_run_at,
  s.last_run_at, s.created_at, s.updated_at, s.revision, s.next_run_at AS next_tick FROM jobq.schedules s
WHERE (%(allowed)s::text IS NULL OR split_part(s.queue_name, '#', 1) ~ %(allowed)s::text)
ORDER BY s.name

-- name: SCHEDULES_LOCK --
SELECT pg_advisory_xact_lock(1785684595)

-- name: SCHEDULES_NEXT_DUE --
-- Seconds until the earliest active schedule is due, by the database clock (NULL: none).
SELECT extract(epoch FROM min(next_run_at) - now())::float8 FROM jobq.schedules WHERE NOT paused AND NOT EXISTS (
  SELECT FROM unnest(%(skip_names)s::text[], %(skip_crons)s::text[], %(skip_zones)s::text[]) AS x(name, cron, tz)
  WHERE x.name = schedules.name AND x.cron = schedules.cron AND x.tz = schedules.timezone)

-- name: SCHEDULE_DELETE --
DELETE FROM jobq.schedules s WHERE s.name = %(name)s AND (%(allowed)s::text IS NULL OR split_part(s.queue_name, '#', 1) ~ %(allowed)s::text)
RETURNING s.name

-- name: SCHEDULE_GET --
SELECT 
  s.name, s.queue_name AS queue, s.cron, s.timezone, s.payload::text AS payload, s.priority, s.max_attempts,
  s.job_group AS group, s.missed, s.paused, CASE WHEN s.paused THEN NULL ELSE s.next_run_at END AS next_run_at,
  s.last_run_at, s.created_at, s.updated_at, s.revision, s.next_run_at AS next_tick FROM jobq.schedules s
WHERE s.name = %(name)s AND (%(allowed)s::text IS NULL OR split_part(s.queue_name, '#', 1) ~ %(allowed)s::text)

-- name: SCHEDULE_HOLDER --
-- Whether a schedule has this name, and whether the caller may see it (its queue is one of the caller's).
SELECT (%(allowed)s::text IS NULL OR split_part(s.queue_name, '#', 1) ~ %(allowed)s::text) AS visible FROM jobq.schedules s WHERE s.name = %(name)s

-- name: SCHEDULE_PAUSE --
UPDATE jobq.schedules s SET paused = true, revision = s.revision + 1, updated_at = now()
WHERE s.name = %(name)s AND (%(allowed)s::text IS NULL OR split_part(s.queue_name, '#', 1) ~ %(allowed)s::text)
RETURNING 
  s.name, s.queue_name AS queue, s.cron, s.timezone, s.payload::text AS payload, s.priority, s.max_attempts,
  s.job_group AS group, s.missed, s.paused, CASE WHEN s.paused THEN NULL ELSE s.next_run_at END AS next_run_at,
  s.last_run_at, s.created_at, s.updated_at, s.revision, s.next_run_at AS next_tick

-- name: SCHEDULE_PUT --
-- The clock in VALUES, not in DO UPDATE SET: Citus takes only IMMUTABLE functions there (app/db/distribute.py).
INSERT INTO jobq.schedules AS s (name, queue_name, cron, timezone, payload, priority, max_attempts, job_group, missed,
                            paused, next_run_at, updated_at)
VALUES (%(name)s, %(queue)s, %(cron)s, %(timezone)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(group)s,
        %(missed)s, coalesce(%(paused)s::boolean, false), %(next)s, now())
ON CONFLICT (name) DO UPDATE SET
  queue_name = EXCLUDED.queue_name, cron = EXCLUDED.cron, timezone = EXCLUDED.timezone,
  payload = EXCLUDED.payload, priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
  job_group = EXCLUDED.job_group, missed = EXCLUDED.missed,
  paused = coalesce(%(paused)s::boolean, s.paused),
  -- The same cron in the same zone keeps its next tick: a definition applied again (a deploy script)
  -- neither skips a tick that is due nor repeats one. A new expression, or a resume, starts from now.
  next_run_at = CASE
    WHEN s.cron = EXCLUDED.cron AND s.timezone = EXCLUDED.timezone
         AND NOT (s.paused AND NOT coalesce(%(paused)s::boolean, true))
    THEN s.next_run_at ELSE EXCLUDED.next_run_at END,
  revision = s.revision + 1,
  updated_at = EXCLUDED.updated_at
-- A schedule of a queue the caller may not use stays as it is (the caller gets 403).
WHERE (%(allowed)s::text IS NULL OR split_part(s.queue_name, '#', 1) ~ %(allowed)s::text)
-- A row this statement inserted has no xmax; one it updated has this transaction's.
RETURNING (s.xmax = 0) AS created, 
  s.name, s.queue_name AS queue, s.cron, s.timezone, s.payload::text AS payload, s.priority, s.max_attempts,
  s.job_group AS group, s.missed, s.paused, CASE WHEN s.paused THEN NULL ELSE s.next_run_at END AS next_run_at,
  s.last_run_at, s.created_at, s.updated_at, s.revision, s.next_run_at AS next_tick

-- name: SCHEDULE_RESUME --
-- `next`: the first tick after now, computed from the revision read just before: the ticks of the pause
-- are not fired late. Resuming a schedule that is not paused changes nothing. The clock as a subquery: Citus
-- takes no stable function in a CASE of an UPDATE (app/db/distribute.py).
UPDATE jobq.schedules s
SET paused = false, next_run_at = CASE WHEN s.paused THEN %(next)s ELSE s.next_run_at END,
    revision = s.revision + CASE WHEN s.paused THEN 1 ELSE 0 END,
    updated_at = CASE WHEN s.paused THEN (SELECT now()) ELSE s.updated_at END
WHERE s.name = %(name)s AND s.revision = %(revision)s AND (%(allowed)s::text IS NULL OR split_part(s.queue_name, '#', 1) ~ %(allowed)s::text)
RETURNING 
  s.name, s.queue_name AS queue, s.cron, s.timezone, s.payload::text AS payload, s.priority, s.max_attempts,
  s.job_group AS group, s.missed, s.paused, CASE WHEN s.paused THEN NULL ELSE s.next_run_at END AS next_run_at,
  s.last_run_at, s.created_at, s.updated_at, s.revision, s.next_run_at AS next_tick

-- name: SCHEDULE_TICKS_INSERT --
-- The ticks of the schedules of one queue that SCHEDULES_ADVANCE advanced, in its transaction: one statement
-- per queue, so that on Citus each writes the one shard of its queue (app/db/distribute.py). What the schedule
-- leaves out comes from the queue's configuration (GET /queues/{queue}/config) as it is when the job is made,
-- else the service's defaults, as for any enqueue.
WITH ticks AS (
  SELECT * FROM json_to_recordset(%(ticks)s::json) AS t(name text, tick timestamptz)
)
INSERT INTO jobq.jobs (queue_name, payload, priority, max_attempts, group_key, schedule, scheduled_for)
SELECT s.queue_name, s.payload, coalesce(s.priority, q.default_priority, 0),
       coalesce(s.max_attempts, q.max_attempts, %(max_attempts)s), s.job_group, s.name, t.tick
FROM jobq.schedules s JOIN ticks t USING (name)
LEFT JOIN jobq.queue_state q ON q.queue_name = s.queue_name AND q.queue_name = %(queue)s
WHERE s.queue_name = %(queue)s
ORDER BY t.tick, s.name
-- One job per (schedule, tick), whatever else happened: the last word on duplicates.
ON CONFLICT DO NOTHING  -- jobs_schedule_tick_idx (no arbiter named: its columns differ on Citus, app/db/distribute.py)
RETURNING id, queue_name AS queue, schedule, scheduled_for
