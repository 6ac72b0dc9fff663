-- Releases in the per-minute statistics: a claimed job handed back untried (POST /jobs/{id}/release)
-- gets its attempt back, so a job that every worker keeps releasing never fails and would loop unseen
-- in /queues/{queue}/stats. Counted like the other events by app/observability/metrics.py's flush.
--
-- A column with a constant default is metadata-only on PostgreSQL 11+ (jobq needs 13+): no table
-- rewrite, existing rows read 0 from the catalog, so this is cheap however big queue_stats is. The
-- ACCESS EXCLUSIVE lock is held only for the catalog change; flushes and stats queries meanwhile wait
-- that long. Processes still running the previous release keep flushing without the column (0).
ALTER TABLE queue_stats ADD COLUMN released bigint NOT NULL DEFAULT 0;
