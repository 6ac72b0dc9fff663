-- Operations: queue state (pause), counters kept without counting big tables, per-minute statistics,
-- and the indexes for listing, retention and "close to max_attempts".

-- One row per queue that an operator has touched (paused/resumed). A queue without a row is active.
CREATE TABLE queue_state (
  queue_name text PRIMARY KEY CHECK (queue_name ~ '^[A-Za-z0-9_.:-]{1,128}$'),
  paused     boolean     NOT NULL DEFAULT false,
  changed_at timestamptz NOT NULL DEFAULT now()
);

-- Exact counts of finished jobs (completed, failed, cancelled) per queue: counting them would mean
-- scanning millions of rows. Every statement that moves a job into or out of a finished state updates
-- these rows in the same statement, so they never drift. Each backend writes its own shard, so two
-- concurrent completes never wait on one counter row; a count is the sum over shards.
CREATE TABLE queue_counts (
  queue_name text     NOT NULL,
  status     text     NOT NULL CHECK (status IN ('completed', 'failed', 'cancelled')),
  shard      smallint NOT NULL,
  n          bigint   NOT NULL,
  PRIMARY KEY (queue_name, status, shard)
) WITH (fillfactor = 50);  -- room for HOT updates: n is not indexed

-- Per-queue, per-minute event statistics, flushed by every API process about once a second from its
-- own counters (app/observability/metrics.py). Windowed figures in /queues/{queue}/stats sum these rows, so every
-- replica answers the same. durations_ms holds a histogram of claim-to-completion times over
-- app/observability/metrics.py's bucket bounds.
CREATE TABLE queue_stats (
  queue_name      text        NOT NULL,
  minute          timestamptz NOT NULL,
  enqueued        bigint      NOT NULL DEFAULT 0,
  claimed         bigint      NOT NULL DEFAULT 0,
  completed       bigint      NOT NULL DEFAULT 0,
  failed          bigint      NOT NULL DEFAULT 0,  -- terminal failures
  retried         bigint      NOT NULL DEFAULT 0,  -- failed attempts sent back to pending
  lease_expired   bigint      NOT NULL DEFAULT 0,  -- lapsed leases recovered by the sweeper
  cancelled       bigint      NOT NULL DEFAULT 0,
  empty_claims    bigint      NOT NULL DEFAULT 0,  -- claims answered empty while ready jobs existed
  duration_max_ms double precision NOT NULL DEFAULT 0,
  durations_ms    bigint[]    NOT NULL DEFAULT '{}',
  PRIMARY KEY (queue_name, minute)
) WITH (fillfactor = 70);

-- Finished jobs by queue, status and age: retention deletes, listings of finished jobs, recent
-- completions. Partial, so claims and heartbeats never touch it; a job enters it once, when it ends.
CREATE INDEX jobs_finished_idx ON jobs (queue_name, status, finished_at, id) WHERE finished_at IS NOT NULL;

-- Live jobs with at most one attempt left: small by nature, so counting them is cheap.
CREATE INDEX jobs_last_attempts_idx ON jobs (queue_name)
  WHERE status IN ('pending', 'running') AND attempts >= max_attempts - 1;

-- The sweeper's index gains the queue so that per-queue running counts and listings need no heap scan.
DROP INDEX jobs_lease_idx;
CREATE INDEX jobs_lease_idx ON jobs (lease_expires_at, queue_name) WHERE status = 'running';
