-- Each queue's jobs not yet finished, as the background last counted them (issue 22; app/maintenance/counts.py,
-- app/db/live_counts.py). GET /queues/{queue}/stats, GET /queues and the depth gauges count a queue's live jobs
-- themselves only up to JOBQ_STATS_EXACT_MAX of each kind, a read that does not grow with the backlog; past it
-- they answer from this row, marked as estimated. One replica refreshes every row every
-- JOBQ_LIVE_COUNTS_INTERVAL_SECONDS (live_counts_clock says which and when); a queue with no live job has no row.
CREATE TABLE queue_live_counts (
  queue_name   text        PRIMARY KEY,
  ready        bigint      NOT NULL,  -- pending and due
  scheduled    bigint      NOT NULL,  -- pending, due later
  running      bigint      NOT NULL,
  waiting      bigint      NOT NULL,  -- waiting for dependencies
  on_last      bigint      NOT NULL,  -- pending or running with no attempt left after this one
  one_left     bigint      NOT NULL,  -- pending or running one attempt short of max_attempts
  oldest_ready timestamptz,           -- run_at of the oldest ready job
  counted_at   timestamptz NOT NULL
) WITH (fillfactor = 70);  -- rewritten whole at every refresh: room for HOT updates

-- One row: when the counts were last refreshed, and how long that count took. A replica refreshes only when it is
-- older than the interval (or ten times the last count's duration, whichever is longer: counting takes at most
-- about a tenth of one core) and no other replica is counting (an advisory lock, tried), so one replica counts per
-- interval however many run.
CREATE TABLE live_counts_clock (
  id           boolean     PRIMARY KEY DEFAULT true CHECK (id),
  counted_at   timestamptz NOT NULL,
  took_seconds float8      NOT NULL DEFAULT 0
);
INSERT INTO live_counts_clock (id, counted_at) VALUES (true, '-infinity');

ALTER TABLE queue_live_counts SET (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0.0);
ALTER TABLE live_counts_clock SET (autovacuum_vacuum_threshold = 100, autovacuum_vacuum_scale_factor = 0.0);
