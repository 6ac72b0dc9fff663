-- jobq: no-transaction
-- Indexes for the dependency release and the per-queue sweeper (0017), built without stopping writes.

-- The reconciliation pass walks each parent queue's dependencies (app/db/releases.py EDGES_FINISHED_PARENTS);
-- rows a previous release wrote, without queue names, are found through the second one.
CREATE INDEX CONCURRENTLY IF NOT EXISTS job_dependencies_parent_queue_idx
  ON job_dependencies (parent_queue, parent_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS job_dependencies_legacy_idx
  ON job_dependencies (parent_id) WHERE parent_queue IS NULL OR job_queue IS NULL;

-- The sweeper works one queue at a time (app/db/rescue.py): that queue's lapsed leases, oldest first, without
-- walking another queue's. Only running jobs have an entry.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_queue_lease_idx
  ON jobs (queue_name, lease_expires_at) WHERE status = 'running';
