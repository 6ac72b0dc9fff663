-- Each queue's groups with the most ready jobs, as the background last counted them (issue 22; app/db/live_counts.py,
-- written with queue_live_counts in the same transaction). GET /queues/{queue}/stats reads a queue's pending jobs
-- that have a group itself only up to JOBQ_STATS_EXACT_MAX; past it its `groups` come from these rows, marked as
-- estimated. Only the top groups of each queue are kept (as many as the stats show); a queue with no ready job in
-- a group has no row. On Citus distributed by queue_name, co-located with jobs (app/db/distribute.py).
CREATE TABLE queue_live_groups (
  queue_name text        NOT NULL,
  group_key  text        NOT NULL,
  ready      bigint      NOT NULL,  -- pending and due
  running    bigint      NOT NULL,
  counted_at timestamptz NOT NULL,
  PRIMARY KEY (queue_name, group_key)
) WITH (fillfactor = 70);  -- rewritten whole at every refresh: room for HOT updates

ALTER TABLE queue_live_groups SET (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0.0);
