-- The jobs table: the article's queue table, extended with priority, leases, results, idempotency keys
-- and a cancelled status. The CHECK constraints are the state machine; every UPDATE in app/db/jobs.py
-- also guards on status, so a write that would break the machine fails loudly instead of corrupting.

CREATE TABLE jobs (
  id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue_name       text        NOT NULL CHECK (queue_name ~ '^[A-Za-z0-9_.:-]{1,128}$'),
  payload          jsonb       NOT NULL,
  status           text        NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
  priority         smallint    NOT NULL DEFAULT 0,
  run_at           timestamptz NOT NULL DEFAULT now(),
  attempts         integer     NOT NULL DEFAULT 0,
  max_attempts     integer     NOT NULL DEFAULT 5,
  claimed_at       timestamptz,          -- start of the latest claim
  lease_expires_at timestamptz,          -- set exactly while running
  lease_seconds    integer,              -- the lease the claim asked for; a bare heartbeat renews by it
  locked_by        text,                 -- worker of the latest claim (diagnostics only)
  claim_token      text,                 -- the latest claim's token; kept after complete/fail so that
                                         -- a retried complete/fail with the same token is recognised
  finished_at      timestamptz,          -- set exactly in the terminal states
  last_error       text,
  result           jsonb,
  idempotency_key  text,
  created_at       timestamptz NOT NULL DEFAULT now(),

  CONSTRAINT jobs_attempts_range CHECK (attempts >= 0 AND max_attempts BETWEEN 1 AND 1000
                                        AND attempts <= max_attempts),
  -- pending always has an attempt left, so the claim query needs no attempts filter
  CONSTRAINT jobs_pending_shape CHECK (status <> 'pending'
      OR (attempts < max_attempts AND lease_expires_at IS NULL AND finished_at IS NULL)),
  CONSTRAINT jobs_running_shape CHECK (status <> 'running'
      OR (attempts >= 1 AND claim_token IS NOT NULL AND claimed_at IS NOT NULL
          AND lease_expires_at IS NOT NULL AND lease_seconds > 0 AND finished_at IS NULL)),
  CONSTRAINT jobs_finished_shape CHECK (status NOT IN ('completed', 'failed', 'cancelled')
      OR (finished_at IS NOT NULL AND lease_expires_at IS NULL)),
  CONSTRAINT jobs_result_only_completed CHECK (result IS NULL OR status = 'completed')
);

-- Claim: equality on queue, then the claim query's exact ORDER BY. Partial on the literal 'pending'
-- (the claim query repeats that literal so the planner can prove the predicate).
CREATE INDEX jobs_claim_idx ON jobs (queue_name, priority DESC, run_at, id) WHERE status = 'pending';

-- Sweeper: running jobs by lease expiry, nothing else.
CREATE INDEX jobs_lease_idx ON jobs (lease_expires_at) WHERE status = 'running';

-- Idempotency: at most one job per (queue, key) for as long as the job row exists.
CREATE UNIQUE INDEX jobs_idempotency_idx ON jobs (queue_name, idempotency_key)
  WHERE idempotency_key IS NOT NULL;
