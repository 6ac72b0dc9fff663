-- Schedules: jobs enqueued by cron. Every replica runs a scheduler (app/maintenance/scheduler.py) that
-- fires the ticks that are due, by the database clock; the rows below are its whole state, so replicas
-- agree and a restart resumes where the last pass left off.

CREATE TABLE schedules (
  name         text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.:-]{1,128}$'),
  queue_name   text        NOT NULL CHECK (queue_name ~ '^[A-Za-z0-9_.:-]{1,128}$'),
  cron         text        NOT NULL,                   -- parsed by app/cron.py, checked on the way in
  timezone     text        NOT NULL,                   -- IANA name
  -- The job each tick enqueues. NULL priority and max_attempts: the defaults when the job is made.
  payload      jsonb       NOT NULL,
  priority     smallint,
  max_attempts integer     CHECK (max_attempts BETWEEN 1 AND 1000),
  job_group    text,                                   -- the job's `group`, where jobs have groups
  missed       text        NOT NULL CHECK (missed IN ('skip', 'catch_up')),
  paused       boolean     NOT NULL DEFAULT false,
  -- The next tick to fire, in UTC; NULL when the expression fires no more (past year 9999). Kept while
  -- paused; resume moves it past the pause.
  next_run_at  timestamptz,
  last_run_at  timestamptz,                            -- the latest tick that made a job
  -- Bumped by every change through the API: a firing computed from an older revision changes nothing.
  revision     bigint      NOT NULL DEFAULT 1,
  created_at   timestamptz NOT NULL DEFAULT now(),
  updated_at   timestamptz NOT NULL DEFAULT now()
);

-- The scheduler's question: which active schedules are due, and when is the next one.
CREATE INDEX schedules_due_idx ON schedules (next_run_at) WHERE NOT paused;

-- A job made by a schedule names it and the tick it stands for. At most one job per (schedule, tick),
-- whatever the number of replicas firing that tick at once: the scheduler inserts ON CONFLICT DO
-- NOTHING against this index in the same statement that advances the schedule.
--
-- Adding nullable columns without a default is a catalog change only. The index build reads the whole
-- table once while holding a SHARE lock (writes to jobs wait for it: about a second per million rows
-- on the reference machine); it holds no entries until schedules make jobs, since it is partial.
ALTER TABLE jobs ADD COLUMN schedule text, ADD COLUMN scheduled_for timestamptz;
CREATE UNIQUE INDEX jobs_schedule_tick_idx ON jobs (schedule, scheduled_for) WHERE schedule IS NOT NULL;
