"""What the jobs table keeps: finished jobs deleted past their retention age, its dead rows, what holds vacuum back."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from app.db.finishing import counts_add, on_citus
from app.db.rows import DatabaseHealthRow, rows_of

# --- retention ----------------------------------------------------------------------------------------------

# The queues with finished jobs (their counters). On Citus a read of every shard, once per retention pass (not
# a hot path); each queue is then pruned by statements on its own shard.
FINISHED_QUEUES = "SELECT queue_name FROM jobq.queue_counts GROUP BY queue_name HAVING sum(n) > 0"

JOBS_DELETE_FINISHED = """
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
"""


async def finished_queues(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    cur = await conn.execute(FINISHED_QUEUES)
    return [r[0] for r in await cur.fetchall()]


async def jobs_delete_finished(
    conn: psycopg.AsyncConnection[Any], queue: str, status: str, age_seconds: float, batch: int, now: datetime | None
) -> int:
    params = {"queue": queue, "status": status, "age": age_seconds, "batch": batch, "now": now}
    async with conn.transaction():
        cur = await conn.execute(JOBS_DELETE_FINISHED, params)
        row = await cur.fetchone()
        n = int(row[0]) if row else 0
        await counts_add(conn, queue, status, -n)
    return n


# --- vacuum ---------------------------------------------------------------------------------------------------

JOBS_DEAD_ROWS = """
-- The cumulative statistics PostgreSQL keeps anyway: no scan. Rows inserted since the last vacuum (manual or auto):
-- pages no VACUUM has seen yet, whose rows each claim must still check and hint (PostgreSQL 13+).
SELECT coalesce(n_dead_tup, 0), coalesce(n_live_tup, 0), coalesce(n_ins_since_vacuum, 0)
FROM pg_stat_user_tables WHERE relid = 'jobq.jobs'::regclass
"""


async def jobs_dead_rows(conn: psycopg.AsyncConnection[Any]) -> tuple[int, int, int]:
    """(dead row versions, live rows, rows inserted since the table's last vacuum)."""
    cur = await conn.execute(JOBS_DEAD_ROWS)
    row = await cur.fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)


# --- what holds vacuum back -----------------------------------------------------------------------------------


def _database_health(dead_rows: str) -> str:
    return f"""
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
SELECT {dead_rows} AS jobs_dead_rows,
       coalesce(extract(epoch FROM (SELECT max(held) FROM holders))::float8, 0) AS oldest_xmin_age_seconds,
       coalesce((SELECT max(xids) FROM holders), 0) AS oldest_xmin_age_transactions
"""


DATABASE_HEALTH = _database_health(
    "coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jobq.jobs'::regclass), 0)"
)

# On Citus the jobs are in the shards of `jobs` on the worker nodes (the coordinator's table holds none): their dead
# rows are the sum of the shards' own statistics, one command per shard run on its node by Citus (a fan-out, read
# by the gauges once an interval and by the stats). Sent without parameters: psycopg leaves the `%s`, which Citus
# replaces by each shard's name. The holders are still the coordinator's sessions, where jobq's transactions and a
# forgotten one of an application (pinning the snapshots of its connections to the workers as well) begin.
DATABASE_HEALTH_CITUS = _database_health(
    """coalesce((SELECT sum(r.result::bigint)::bigint FROM run_command_on_shards('jobq.jobs',
           $$SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = '%s'::regclass), 0)$$) r
         WHERE r.success), 0)"""
)


async def database_health(conn: psycopg.AsyncConnection[Any]) -> DatabaseHealthRow:
    cur = conn.cursor(row_factory=rows_of(DatabaseHealthRow))
    await cur.execute(DATABASE_HEALTH_CITUS if on_citus(conn) else DATABASE_HEALTH)
    row = await cur.fetchone()
    assert row is not None
    return row
