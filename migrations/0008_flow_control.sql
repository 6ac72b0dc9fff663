-- Queue configuration and flow control: per-queue defaults and limits (on queue_state, the row the claim
-- already reads for `paused`), groups on jobs, the claim ledger that rate limits count, and the counters of
-- claims held back by each limit.
--
-- Every column added to jobs is nullable without a default, and every column added elsewhere has a
-- constant default: metadata-only changes (PostgreSQL 11+), no rewrite of a big table. The two new indexes
-- are partial on a column no existing row has set (group_key) or on running jobs, so they are built from a
-- scan of jobs but hold few entries.

-- --- per-queue configuration ----------------------------------------------------------------------------
-- NULL everywhere means "the global setting" (JOBQ_*); PATCH /queues/{queue}/config sets and clears these.
ALTER TABLE queue_state
  ADD COLUMN max_attempts           integer          CHECK (max_attempts BETWEEN 1 AND 1000),
  ADD COLUMN backoff_base_seconds   double precision CHECK (backoff_base_seconds > 0 AND backoff_base_seconds <= 3600),
  ADD COLUMN backoff_max_seconds    double precision CHECK (backoff_max_seconds > 0 AND backoff_max_seconds <= 604800),
  ADD COLUMN lease_seconds          integer          CHECK (lease_seconds BETWEEN 1 AND 604800),
  ADD COLUMN default_priority       smallint,
  ADD COLUMN retention_completed_seconds integer   CHECK (retention_completed_seconds BETWEEN 0 AND 315360000),
  ADD COLUMN retention_failed_seconds    integer   CHECK (retention_failed_seconds BETWEEN 0 AND 315360000),
  ADD COLUMN retention_cancelled_seconds integer   CHECK (retention_cancelled_seconds BETWEEN 0 AND 315360000),
  -- Limits, enforced inside the claim (app/db/claim.py).
  ADD COLUMN concurrency            integer          CHECK (concurrency BETWEEN 1 AND 1000000),
  ADD COLUMN rate_limit             integer          CHECK (rate_limit BETWEEN 1 AND 1000000),
  ADD COLUMN rate_per_seconds       integer          CHECK (rate_per_seconds BETWEEN 1 AND 86400),
  ADD COLUMN group_concurrency      integer          CHECK (group_concurrency BETWEEN 1 AND 1000000),
  ADD COLUMN group_rate_limit       integer          CHECK (group_rate_limit BETWEEN 1 AND 1000000),
  ADD COLUMN group_rate_per_seconds integer          CHECK (group_rate_per_seconds BETWEEN 1 AND 86400),
  ADD COLUMN fair                   boolean,
  ADD COLUMN ordered                boolean,
  ADD CONSTRAINT queue_state_rate_whole CHECK ((rate_limit IS NULL) = (rate_per_seconds IS NULL)),
  ADD CONSTRAINT queue_state_group_rate_whole CHECK ((group_rate_limit IS NULL) = (group_rate_per_seconds IS NULL)),
  -- Strict order within a group means one job of the group at a time.
  ADD CONSTRAINT queue_state_ordered_one_at_a_time CHECK (ordered IS NOT TRUE OR coalesce(group_concurrency, 1) = 1),
  ADD CONSTRAINT queue_state_backoff_order CHECK (backoff_base_seconds <= backoff_max_seconds);

-- Derived, so it cannot drift: the claim of an unlimited queue checks this beside `paused`, in the same
-- row it reads anyway, and claims nothing from a limited queue (a process whose cached configuration is
-- behind then learns it and runs the limited claim). `grouped`: the limits need the per-group walk.
ALTER TABLE queue_state
  ADD COLUMN grouped boolean GENERATED ALWAYS AS (
    group_concurrency IS NOT NULL OR group_rate_limit IS NOT NULL OR coalesce(fair, false) OR coalesce(ordered, false)
  ) STORED,
  ADD COLUMN limited boolean GENERATED ALWAYS AS (
    concurrency IS NOT NULL OR rate_limit IS NOT NULL OR group_concurrency IS NOT NULL
    OR group_rate_limit IS NOT NULL OR coalesce(fair, false) OR coalesce(ordered, false)
  ) STORED;

-- --- groups --------------------------------------------------------------------------------------------------
ALTER TABLE jobs ADD COLUMN group_key text;

-- A group's pending jobs in its own order (priority, then enqueue order), run_at last so that "due" is
-- checked in the index: the claim walks groups (one probe per group) and takes each group's head. Only
-- jobs that have a group enter it: a job without one costs nothing more than before.
CREATE INDEX jobs_group_idx ON jobs (queue_name, group_key, priority DESC, id, run_at)
  WHERE status = 'pending' AND group_key IS NOT NULL;

-- Running jobs by queue and group: what a concurrency limit counts, in time proportional to the running
-- jobs of that queue (jobs_lease_idx leads with the lease expiry, so counting one queue there reads every
-- running job of every queue). Its predicate compares in the "C" collation, and only the statements that
-- are meant to read it say so (app/db/jobs.py RUNNING_C): with stale statistics this index, like any
-- partial index, can look empty, and the lease rescue (`status = 'running'`) would then read every
-- running job through it instead of jobs_lease_idx in lease order (tests/test_plans.py).
CREATE INDEX jobs_running_idx ON jobs (queue_name, group_key) WHERE status = 'running' COLLATE "C";

-- --- the claim ledger --------------------------------------------------------------------------------------
-- One row per claim statement and group (NULL: jobs without a group) of a rate-limited queue: how many
-- jobs it claimed, and when by the database clock. A rate limit counts the rows inside its window; the
-- retention service deletes rows older than any window of their queue.
CREATE TABLE queue_claims (
  queue_name text        NOT NULL,
  group_key  text,
  claimed_at timestamptz NOT NULL,
  n          integer     NOT NULL CHECK (n > 0)
);
CREATE INDEX queue_claims_queue_idx ON queue_claims (queue_name, claimed_at);
CREATE INDEX queue_claims_group_idx ON queue_claims (queue_name, group_key, claimed_at) WHERE group_key IS NOT NULL;
ALTER TABLE queue_claims SET (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0.05);

-- --- claims held back by each limit, per queue and minute (app/runtime/metrics.py) --------------------------
ALTER TABLE queue_stats
  ADD COLUMN held_concurrency       bigint NOT NULL DEFAULT 0,
  ADD COLUMN held_rate              bigint NOT NULL DEFAULT 0,
  ADD COLUMN held_group_concurrency bigint NOT NULL DEFAULT 0,
  ADD COLUMN held_group_rate        bigint NOT NULL DEFAULT 0,
  ADD COLUMN held_ordered           bigint NOT NULL DEFAULT 0;
