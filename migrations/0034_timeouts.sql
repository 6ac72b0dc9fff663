-- Hard timeouts (issue 25): a job running longer than its timeout since its claim is failed by the sweeper
-- (app/db/timeouts.py) with last_error 'timeout', whatever its heartbeats, and retried or not as any failure.
--
-- The job's own timeout (enqueue `timeout_seconds`), else its queue's (PATCH /queues/{queue}/config),
-- read when the sweeper looks, so a queue's change applies to its running jobs too. NULL: none.
-- The column on jobs is nullable without a default and without a CHECK (the API checks the range): a
-- metadata-only change, no scan of a big table under its lock. queue_state is small.
ALTER TABLE jobs ADD COLUMN timeout_seconds integer;
ALTER TABLE queue_state ADD COLUMN timeout_seconds integer CHECK (timeout_seconds BETWEEN 1 AND 604800);
