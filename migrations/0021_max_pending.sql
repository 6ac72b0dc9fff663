-- A queue's most jobs not yet started (issue 21): pending (due or delayed) and waiting for dependencies. An
-- enqueue past it is refused (429 queue-full); NULL: JOBQ_MAX_PENDING_JOBS. Checked by each API process from
-- a count it refreshes (app/core/quotas.py), not inside the statements: the claim never reads it, so
-- `limited` does not depend on it. A nullable column without a default: a catalog change only.
ALTER TABLE queue_state ADD COLUMN max_pending bigint CHECK (max_pending BETWEEN 1 AND 1000000000);
