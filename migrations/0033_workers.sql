-- Workers (issue 25): who claimed from which queue, with what, from where, and when last seen; and what each
-- finished, per minute. Written by one statement per process about every second (app/maintenance/workers.py)
-- from what the claims, heartbeats, completes and fails of that process saw: no statement on the hot path.
-- Read by GET /workers and GET /workers/{name} (app/db/workers.py); the jobs a worker holds are read from jobs
-- (locked_by) at that moment, so they are never stale.
--
-- One row per worker and queue, so that a key limited to some queues sees, of a worker, only what it did on
-- those. New tables only: nothing here touches jobs.
CREATE TABLE workers (
  name        text        NOT NULL,
  queue_name  text        NOT NULL,
  sdk         text,                    -- from the User-Agent's first product (`jobq-client-python/1.2.0`)
  version     text,
  host        text,                    -- the User-Agent's `host=` comment, else the client's address
  first_seen  timestamptz NOT NULL,
  last_seen   timestamptz NOT NULL,
  PRIMARY KEY (queue_name, name)
);
-- The listing: most recently seen first, and the pruning of workers gone for longer than
-- JOBQ_WORKERS_KEEP_SECONDS.
CREATE INDEX workers_last_seen_idx ON workers (last_seen);
CREATE INDEX workers_name_idx ON workers (name);

-- Jobs completed and failed (a fail call, whether retried or not, and a hard timeout) per worker, queue and
-- minute; an hour is kept (the "last hour" figures).
CREATE TABLE worker_minutes (
  queue_name  text        NOT NULL,
  name        text        NOT NULL,
  minute      timestamptz NOT NULL CHECK (minute = date_trunc('minute', minute)),
  completed   bigint      NOT NULL DEFAULT 0,
  failed      bigint      NOT NULL DEFAULT 0,
  PRIMARY KEY (queue_name, name, minute)
);
CREATE INDEX worker_minutes_minute_idx ON worker_minutes (minute);
