-- The dashboard's history (charts over an hour, a day, a week) and job search (issue 14).
--
-- Every statement here is cheap on a running system: new columns without defaults are metadata-only,
-- the new tables start empty, and queue_stats holds at most two hours of minutes when this runs. The
-- GIN index is built on the failed and cancelled jobs only (see below), under the runner's transaction:
-- enqueues, claims and completes wait while it is built, which takes about a second per 100,000 such jobs.

-- The ready backlog, sampled once a minute for the whole cluster (app/maintenance/samples.py): the
-- number of ready jobs and the age of the oldest, written into the queue's row of that minute. A queue
-- without ready jobs gets no sample: in a minute listed in stats_samples, a missing sample reads 0.
ALTER TABLE queue_stats ADD COLUMN ready bigint, ADD COLUMN oldest_ready_seconds double precision;

-- The minutes that were sampled. Also the sampler's once-per-minute claim: of the replicas that try to
-- sample a minute, the one whose INSERT of the minute succeeds writes the samples; the others find the
-- row and do nothing.
CREATE TABLE stats_samples (
  minute timestamptz PRIMARY KEY CHECK (minute = date_trunc('minute', minute))
);

-- Per-minute rows older than a day are rolled up into hours here (app/maintenance/retention.py), kept
-- for eight days: a week of charts at one row per queue and hour instead of sixty.
CREATE TABLE queue_stats_hourly (
  queue_name           text        NOT NULL,
  hour                 timestamptz NOT NULL CHECK (hour = date_trunc('hour', hour)),
  enqueued             bigint      NOT NULL DEFAULT 0,
  claimed              bigint      NOT NULL DEFAULT 0,
  completed            bigint      NOT NULL DEFAULT 0,
  failed               bigint      NOT NULL DEFAULT 0,
  retried              bigint      NOT NULL DEFAULT 0,
  lease_expired        bigint      NOT NULL DEFAULT 0,
  cancelled            bigint      NOT NULL DEFAULT 0,
  released             bigint      NOT NULL DEFAULT 0,
  empty_claims         bigint      NOT NULL DEFAULT 0,
  duration_max_ms      double precision NOT NULL DEFAULT 0,
  durations_ms         bigint[]    NOT NULL DEFAULT '{}',
  ready_sum            bigint      NOT NULL DEFAULT 0,  -- the hour's per-minute ready samples, added up
  oldest_ready_seconds double precision,                -- the largest of the hour's samples
  PRIMARY KEY (queue_name, hour)
);

-- Roll-ups, and the all-queue charts, read minutes by time across queues. An entry is added once per
-- queue and minute; the flush's updates of a row do not change `minute`, so they stay HOT.
CREATE INDEX queue_stats_minute_idx ON queue_stats (minute);

-- Search by payload (`payload @> '{...}'`) on the jobs operators look for: the dead-letter set and the
-- cancelled. Partial, so enqueues, claims and completes never write it. Measured (bench/payload_index.py,
-- BENCHMARKS.md): an index on every job's payload added 43% to the WAL of an enqueue and 43% to that of
-- a claim + complete with a two-key payload (51% and 79% with a ten-key one), because every claim and
-- complete writes a new row version, and every row version needs its own index entries; this partial
-- one changed neither. Payload searches on other statuses scan a bounded number of jobs per page
-- (app/db/search.py).
CREATE INDEX jobs_payload_idx ON jobs USING gin (payload jsonb_path_ops) WHERE status IN ('failed', 'cancelled');
