-- The dependency release leaves the triggers (issue 21, issue 19 item 4): the statement that finishes a job
-- with dependants records it in an outbox, dependency_releases, and the service releases or cancels the
-- dependants afterwards, in bounded batches (app/core/dependencies.py, app/db/releases.py,
-- app/maintenance/releaser.py). docs/workflows.md tells the whole story.
--
-- Cheap on a big table: the new columns are nullable without a default (metadata only), the new table starts
-- empty, and dropping the triggers and their functions takes a moment's lock. The indexes these statements
-- read are built without stopping writes by 0018.
--
-- Rolling upgrade: a process of the previous release keeps working on this schema. Its enqueues write
-- job_dependencies rows without the queue names, and the jobs it finishes write no outbox row; the release
-- service's reconciliation pass finds both (docs/workflows.md "Upgrading").

-- --- the triggers go ------------------------------------------------------------------------------------------
DROP TRIGGER IF EXISTS jobs_release_finished ON jobs;
DROP TRIGGER IF EXISTS jobs_release_dependants ON jobs;
DROP FUNCTION IF EXISTS jobs_release_finished();
DROP FUNCTION IF EXISTS jobs_release_dependants();

-- --- the queues of both ends of a dependency --------------------------------------------------------------------
-- Every statement of the release reaches one queue: the parent's edges by (parent_queue, parent_id), the
-- dependants by (job_queue, job_id). NULL: written by a previous release (filled in by the reconciliation).
ALTER TABLE job_dependencies
  ADD COLUMN parent_queue text,
  ADD COLUMN job_queue    text;

-- --- how deep a job is in its graph ----------------------------------------------------------------------------
-- 1 + the deepest of its dependencies; NULL (read as 0) for a job without any, and for jobs enqueued before
-- this migration. An enqueue that would make a job deeper than JOBQ_MAX_DEPENDENCY_DEPTH is refused.
ALTER TABLE jobs ADD COLUMN dependency_depth integer;

-- --- the outbox -----------------------------------------------------------------------------------------------------
-- One row per job that finished (completed, failed, cancelled) while it had dependants, written by the
-- statement that finished it (complete, fail for good, cancel, bulk cancel, purge, the lease rescuer's
-- terminal fail, and the release itself when it cancels a dependant that has dependants of its own).
-- Deleted once every job_dependencies row of that job is consumed. A row outlives a crash: whichever process
-- looks next (every replica's release service, FOR UPDATE SKIP LOCKED) carries on where it stopped.
CREATE TABLE dependency_releases (
  queue_name text        NOT NULL,  -- the finished job's queue
  id         bigint      GENERATED ALWAYS AS IDENTITY,
  job_id     bigint      NOT NULL,  -- the finished job
  status     text        NOT NULL CHECK (status IN ('completed', 'failed', 'cancelled')),  -- as it finished
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (queue_name, id)
);
-- The release a request runs for the jobs it just finished finds their rows by job id, within their queue.
CREATE INDEX dependency_releases_job_idx ON dependency_releases (queue_name, job_id);
