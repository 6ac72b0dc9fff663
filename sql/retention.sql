-- Rendered from app/db/retention.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: DATABASE_HEALTH --
-- What keeps VACUUM from reclaiming the queue's dead rows: the oldest snapshot still held (xmin) by a
-- session of this database, a prepared transaction or a replication slot. While it is held, every row a
-- claim or complete made dead since stays, and claims walk over its index entries. From the statistics
-- views only: no scan.
WITH holders AS (
  SELECT age(backend_xmin) AS xids, now() - coalesce(xact_start, query_start) AS held
  FROM pg_stat_activity
  WHERE backend_xmin IS NOT NULL AND datname = current_database() AND pid <> pg_backend_pid()
  UNION ALL
  SELECT age(transaction), now() - prepared FROM pg_prepared_xacts WHERE database = current_database()
  UNION ALL
  SELECT age(xmin), NULL FROM pg_replication_slots WHERE xmin IS NOT NULL
)
SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jobq.jobs'::regclass), 0) AS jobs_dead_rows,
       coalesce(extract(epoch FROM (SELECT max(held) FROM holders))::float8, 0) AS oldest_xmin_age_seconds,
       coalesce((SELECT max(xids) FROM holders), 0) AS oldest_xmin_age_transactions

-- name: DATABASE_HEALTH_CITUS --
-- What keeps VACUUM from reclaiming the queue's dead rows: the oldest snapshot still held (xmin) by a
-- session of this database, a prepared transaction or a replication slot. While it is held, every row a
-- claim or complete made dead since stays, and claims walk over its index entries. From the statistics
-- views only: no scan.
WITH holders AS (
  SELECT age(backend_xmin) AS xids, now() - coalesce(xact_start, query_start) AS held
  FROM pg_stat_activity
  WHERE backend_xmin IS NOT NULL AND datname = current_database() AND pid <> pg_backend_pid()
  UNION ALL
  SELECT age(transaction), now() - prepared FROM pg_prepared_xacts WHERE database = current_database()
  UNION ALL
  SELECT age(xmin), NULL FROM pg_replication_slots WHERE xmin IS NOT NULL
)
SELECT coalesce((SELECT sum(r.result::bigint)::bigint FROM run_command_on_shards('jobq.jobs',
           $$SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = '%s'::regclass), 0)$$) r
         WHERE r.success), 0) AS jobs_dead_rows,
       coalesce(extract(epoch FROM (SELECT max(held) FROM holders))::float8, 0) AS oldest_xmin_age_seconds,
       coalesce((SELECT max(xids) FROM holders), 0) AS oldest_xmin_age_transactions

-- name: FINISHED_QUEUES --
SELECT queue_name FROM jobq.queue_counts GROUP BY queue_name HAVING sum(n) > 0

-- name: JOBS_DEAD_ROWS --
-- The cumulative statistics PostgreSQL keeps anyway: no scan. Rows inserted since the last vacuum (manual or auto):
-- pages no VACUUM has seen yet, whose rows each claim must still check and hint (PostgreSQL 13+).
SELECT coalesce(n_dead_tup, 0), coalesce(n_live_tup, 0), coalesce(n_ins_since_vacuum, 0)
FROM pg_stat_user_tables WHERE relid = 'jobq.jobs'::regclass

-- name: JOBS_DELETE_FINISHED --
WITH doomed AS (
  -- Oldest finished jobs of one queue and status past the retention age, via jobs_finished_idx.
  SELECT id FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = %(status)s AND finished_at IS NOT NULL
    AND finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(age)s)
    -- A failed or cancelled job that dependants still wait for stays until they are cancelled (or run): a
    -- parent gone is taken for completed (app/db/releases.py), and an SQL enqueue's dependants may meet their
    -- parent's failure only after it (PARENTS_MARK). A primary-key prefix probe per candidate.
    AND (%(status)s = 'completed' OR NOT EXISTS (SELECT FROM jobq.job_dependencies d WHERE d.parent_id = jobs.id))
  ORDER BY finished_at
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), deleted AS (
  DELETE FROM jobq.jobs j USING doomed WHERE j.queue_name = %(queue)s AND j.id = doomed.id RETURNING 1
)
-- Taken off the status's counter by a statement of its own in this transaction (app/db/finishing.py).
SELECT count(*) FROM deleted
