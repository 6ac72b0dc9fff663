"""SQL for operators: queue statistics, listings, admin actions, retention. Like app/db/jobs.py, every
statement is one autocommit transaction, guarded by the job's status so that it cannot race a worker
into an impossible state, and keeps queue_counts exact in the same statement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from app.auth.policy import queue_allowed
from app.db.jobs import JOB_COLUMNS, RUNNING_C, as_json, count_finished, job_columns, job_get
from app.db.rows import (
    FINISHED,
    DatabaseHealthRow,
    GroupRow,
    JobRow,
    QueueRow,
    QueueStatsRow,
    Status,
    Written,
    outcome_rows,
    rows_of,
)

# --- statistics -------------------------------------------------------------------------------------------

STATS_ADD = """
-- Add one process's counts since its last flush (a second ago) to the current minute; concurrent flushes
-- from replicas add up. The minute is the database's: an API host whose clock is off files nothing under
-- a minute that the windows of /stats, which read now(), would never look at.
INSERT INTO queue_stats AS s (queue_name, minute, enqueued, claimed, completed, failed, retried, lease_expired,
                              cancelled, released, empty_claims, duration_max_ms, durations_ms, held_concurrency,
                              held_rate, held_group_concurrency, held_group_rate, held_ordered)
SELECT queue_name, date_trunc('minute', now()), enqueued, claimed, completed, failed, retried, lease_expired,
       cancelled, released, empty_claims, duration_max_ms, durations_ms, held_concurrency, held_rate,
       held_group_concurrency, held_group_rate, held_ordered
FROM json_to_recordset(%(rows)s::json) AS t(queue_name text, enqueued bigint, claimed bigint,
     completed bigint, failed bigint, retried bigint, lease_expired bigint, cancelled bigint, released bigint,
     empty_claims bigint, duration_max_ms float8, durations_ms bigint[], held_concurrency bigint,
     held_rate bigint, held_group_concurrency bigint, held_group_rate bigint, held_ordered bigint)
-- Rows in one global order, as the backlog sample (app/db/history.py) takes them: flushes of several
-- replicas, and a flush beside a sample, update the same rows without waiting on each other in a cycle.
-- (One flush files every row under the same minute: the queue name is the whole order.)
ORDER BY queue_name COLLATE "C"
ON CONFLICT (queue_name, minute) DO UPDATE SET
  held_concurrency = s.held_concurrency + EXCLUDED.held_concurrency,
  held_rate = s.held_rate + EXCLUDED.held_rate,
  held_group_concurrency = s.held_group_concurrency + EXCLUDED.held_group_concurrency,
  held_group_rate = s.held_group_rate + EXCLUDED.held_group_rate,
  held_ordered = s.held_ordered + EXCLUDED.held_ordered,
  enqueued = s.enqueued + EXCLUDED.enqueued,
  claimed = s.claimed + EXCLUDED.claimed,
  completed = s.completed + EXCLUDED.completed,
  failed = s.failed + EXCLUDED.failed,
  retried = s.retried + EXCLUDED.retried,
  lease_expired = s.lease_expired + EXCLUDED.lease_expired,
  cancelled = s.cancelled + EXCLUDED.cancelled,
  released = s.released + EXCLUDED.released,
  empty_claims = s.empty_claims + EXCLUDED.empty_claims,
  duration_max_ms = greatest(s.duration_max_ms, EXCLUDED.duration_max_ms),
  durations_ms = (SELECT array_agg(coalesce(a, 0) + coalesce(b, 0) ORDER BY i)
                  FROM unnest(s.durations_ms, EXCLUDED.durations_ms) WITH ORDINALITY AS x(a, b, i))
"""


async def stats_add(conn: psycopg.AsyncConnection[Any], rows: list[dict[str, Any]]) -> None:
    await conn.execute(STATS_ADD, {"rows": as_json(rows)})


QUEUE_STATS = """
WITH pending AS (
  -- Index-only over jobs_claim_idx: ready vs scheduled, and the oldest ready job.
  SELECT count(*) FILTER (WHERE run_at <= now()) AS ready,
         count(*) FILTER (WHERE run_at > now()) AS scheduled,
         min(run_at) FILTER (WHERE run_at <= now()) AS oldest_ready
  FROM jobs WHERE queue_name = %(queue)s AND status = 'pending'
), running AS (
  SELECT count(*) AS running FROM jobs WHERE queue_name = %(queue)s AND status = 'running'
), waiting AS (
  -- Index-only over jobs_waiting_idx: jobs waiting for their dependencies.
  SELECT count(*) AS waiting FROM jobs WHERE queue_name = %(queue)s AND status = 'waiting'
), finished AS (
  -- Kept exact by the statements that finish jobs (see app/db/jobs.py count_finished): no scan of history.
  SELECT coalesce(sum(n) FILTER (WHERE status = 'completed'), 0) AS completed,
         coalesce(sum(n) FILTER (WHERE status = 'failed'), 0) AS failed,
         coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0) AS cancelled
  FROM queue_counts WHERE queue_name = %(queue)s
), last_attempts AS (
  -- jobs_last_attempts_idx holds exactly these rows.
  SELECT count(*) FILTER (WHERE attempts >= max_attempts) AS on_last,
         count(*) FILTER (WHERE attempts = max_attempts - 1) AS one_left
  FROM jobs
  WHERE queue_name = %(queue)s AND status IN ('pending', 'running') AND attempts >= max_attempts - 1
), window_ AS (
  SELECT coalesce(sum(enqueued), 0) AS enqueued, coalesce(sum(claimed), 0) AS claimed,
         coalesce(sum(completed), 0) AS completed, coalesce(sum(failed), 0) AS failed,
         coalesce(sum(retried), 0) AS retried, coalesce(sum(lease_expired), 0) AS lease_expired,
         coalesce(sum(cancelled), 0) AS cancelled, coalesce(sum(released), 0) AS released,
         coalesce(sum(empty_claims), 0) AS empty_claims,
         coalesce(sum(held_concurrency), 0) AS held_concurrency, coalesce(sum(held_rate), 0) AS held_rate,
         coalesce(sum(held_group_concurrency), 0) AS held_group_concurrency,
         coalesce(sum(held_group_rate), 0) AS held_group_rate, coalesce(sum(held_ordered), 0) AS held_ordered,
         max(duration_max_ms) AS duration_max_ms,
         (SELECT array_agg(total ORDER BY i) FROM (
            SELECT i, sum(v)::bigint AS total FROM queue_stats q2, unnest(q2.durations_ms) WITH ORDINALITY AS u(v, i)
            WHERE q2.queue_name = %(queue)s AND q2.minute > now() - make_interval(secs => %(window)s)
            GROUP BY i) h) AS durations_ms
  FROM queue_stats
  WHERE queue_name = %(queue)s AND minute > now() - make_interval(secs => %(window)s)
)
SELECT p.ready, p.scheduled, extract(epoch FROM now() - p.oldest_ready)::float8 AS oldest_ready_age,
       r.running, f.completed::bigint, f.failed::bigint, f.cancelled::bigint, l.on_last, l.one_left,
       w.enqueued::bigint AS w_enqueued, w.claimed::bigint AS w_claimed, w.completed::bigint AS w_completed,
       w.failed::bigint AS w_failed, w.retried::bigint AS w_retried, w.lease_expired::bigint AS w_lease_expired,
       w.cancelled::bigint AS w_cancelled, w.released::bigint AS w_released,
       w.empty_claims::bigint AS w_empty_claims, w.duration_max_ms AS w_duration_max_ms,
       w.durations_ms AS w_durations_ms,
       coalesce((SELECT paused FROM queue_state WHERE queue_name = %(queue)s), false) AS paused,
       now() AS as_of,
       w.held_concurrency::bigint AS w_held_concurrency, w.held_rate::bigint AS w_held_rate,
       w.held_group_concurrency::bigint AS w_held_group_concurrency,
       w.held_group_rate::bigint AS w_held_group_rate, w.held_ordered::bigint AS w_held_ordered,
       wt.waiting
FROM pending p, running r, finished f, last_attempts l, window_ w, waiting wt
"""

QUEUE_GROUPS = f"""
-- The groups with the most ready jobs (index-only over jobs_group_idx, whose last key is run_at), with
-- their running jobs (jobs_running_idx).
SELECT t.group_key AS "group", t.ready,
       (SELECT count(*) FROM jobs r WHERE r.queue_name = %(queue)s AND r.status = {RUNNING_C}
                                      AND r.group_key = t.group_key) AS running
FROM (
  SELECT group_key, count(*) AS ready FROM jobs
  WHERE queue_name = %(queue)s AND status = 'pending' AND group_key IS NOT NULL AND run_at <= now()
  GROUP BY group_key
  ORDER BY ready DESC, group_key
  LIMIT %(top)s
) t
ORDER BY t.ready DESC, t.group_key
"""


# Counts of live jobs read the partial indexes, whose size is the backlog, never the table with all its
# history: with statistics older than the rows, the planner can take a table of finished jobs for a
# table of pending ones and prefer a sequential scan. These statements run with sequential scans off.
NO_SEQSCAN = "SET LOCAL enable_seqscan = off"


async def queue_stats(
    conn: psycopg.AsyncConnection[Any], queue: str, window_seconds: int, top_groups: int = 20
) -> tuple[QueueStatsRow, list[GroupRow]]:
    cur = conn.cursor(row_factory=rows_of(QueueStatsRow))
    groups = conn.cursor(row_factory=rows_of(GroupRow))
    async with conn.transaction():
        await conn.execute(NO_SEQSCAN)
        await cur.execute(QUEUE_STATS, {"queue": queue, "window": window_seconds})
        row = await cur.fetchone()
        await groups.execute(QUEUE_GROUPS, {"queue": queue, "top": top_groups})
        top = await groups.fetchall()
    assert row is not None
    return row, top


QUEUES_LIST = """
WITH pending AS (
  SELECT queue_name, count(*) FILTER (WHERE run_at <= now()) AS ready,
         count(*) FILTER (WHERE run_at > now()) AS scheduled,
         min(run_at) FILTER (WHERE run_at <= now()) AS oldest_ready
  FROM jobs WHERE status = 'pending' GROUP BY queue_name
), running AS (
  SELECT queue_name, count(*) AS running FROM jobs WHERE status = 'running' GROUP BY queue_name
), waiting AS (
  SELECT queue_name, count(*) AS waiting FROM jobs WHERE status = 'waiting' GROUP BY queue_name
), finished AS (
  SELECT queue_name, sum(n) FILTER (WHERE status = 'completed') AS completed,
         sum(n) FILTER (WHERE status = 'failed') AS failed,
         sum(n) FILTER (WHERE status = 'cancelled') AS cancelled
  FROM queue_counts GROUP BY queue_name
), names AS (
  SELECT queue_name FROM pending UNION SELECT queue_name FROM running UNION SELECT queue_name FROM waiting
  UNION SELECT queue_name FROM finished UNION SELECT queue_name FROM queue_state
)
SELECT n.queue_name AS queue, coalesce(p.ready, 0) AS ready, coalesce(p.scheduled, 0) AS scheduled,
       coalesce(r.running, 0) AS running, coalesce(f.completed, 0)::bigint AS completed,
       coalesce(f.failed, 0)::bigint AS failed, coalesce(f.cancelled, 0)::bigint AS cancelled,
       extract(epoch FROM now() - p.oldest_ready)::float8 AS oldest_ready_age,
       coalesce(s.paused, false) AS paused, coalesce(w.waiting, 0) AS waiting
FROM names n
LEFT JOIN pending p USING (queue_name)
LEFT JOIN running r USING (queue_name)
LEFT JOIN waiting w USING (queue_name)
LEFT JOIN finished f USING (queue_name)
LEFT JOIN queue_state s USING (queue_name)
ORDER BY n.queue_name
"""


async def queues_list(conn: psycopg.AsyncConnection[Any]) -> list[QueueRow]:
    cur = conn.cursor(row_factory=rows_of(QueueRow))
    async with conn.transaction():
        await conn.execute(NO_SEQSCAN)
        await cur.execute(QUEUES_LIST)
        return await cur.fetchall()


# --- listing (keyset pagination: a cursor, never an offset) ------------------------------------------------

# Each status is listed in the order its own index keeps, so every page is an index range scan and a
# page never shifts when jobs are inserted or change state elsewhere in the list. A listing is its WHERE
# (the cursor's keyset condition included) and its ORDER BY; search (app/db/search.py) walks the same.


@dataclass(frozen=True, slots=True)
class Listing:
    where: str
    order: str
    keys: tuple[str, ...]  # the sort key, in order: a page's cursor holds the last row's (JobRow fields)


LISTINGS: dict[str | None, Listing] = {
    Status.pending: Listing(
        """j.queue_name = %(queue)s AND j.status = 'pending'
  AND (%(after)s::boolean IS NOT TRUE
       OR j.priority < %(k1)s::int
       OR (j.priority = %(k1)s::int AND (j.run_at, j.id) > (%(k2)s::timestamptz, %(k3)s::bigint)))""",
        "j.priority DESC, j.run_at, j.id",
        ("priority", "run_at", "id"),
    ),
    # Waiting for dependencies: oldest first, through jobs_waiting_idx.
    Status.waiting: Listing(
        """j.queue_name = %(queue)s AND j.status = 'waiting'
  AND (%(after)s::boolean IS NOT TRUE OR j.id > %(k1)s::bigint)""",
        "j.id",
        ("id",),
    ),
    Status.running: Listing(
        """j.queue_name = %(queue)s AND j.status = 'running'
  AND (%(after)s::boolean IS NOT TRUE OR (j.lease_expires_at, j.id) > (%(k1)s::timestamptz, %(k2)s::bigint))""",
        "j.lease_expires_at, j.id",
        ("lease_expires_at", "id"),
    ),
    **{
        status: Listing(
            """j.queue_name = %(queue)s AND j.status = %(status)s AND j.finished_at IS NOT NULL
  AND (%(after)s::boolean IS NOT TRUE OR (j.finished_at, j.id) < (%(k1)s::timestamptz, %(k2)s::bigint))""",
            "j.finished_at DESC, j.id DESC",
            ("finished_at", "id"),
        )
        for status in FINISHED
    },
    None: Listing(
        "j.queue_name = %(queue)s AND (%(after)s::boolean IS NOT TRUE OR j.id < %(k1)s::bigint)",
        "j.id DESC",
        ("id",),
    ),
}


JOBS_LIST = {
    status: f"""
SELECT {JOB_COLUMNS} FROM jobs j
WHERE {listing.where}
ORDER BY {listing.order}
LIMIT %(limit)s
"""
    for status, listing in LISTINGS.items()
}


def list_statement(status: str | None) -> str:
    """The listing SQL for a status filter (None: every status)."""
    return JOBS_LIST[status]


async def jobs_list(
    conn: psycopg.AsyncConnection[Any], queue: str, status: str | None, limit: int, after: Sequence[Any] | None
) -> tuple[list[JobRow], list[Any] | None]:
    """One page; returns the rows and the sort key of the last one (None on the last page)."""
    names = LISTINGS[status].keys
    keys = list(after or [None] * len(names))
    params = {"queue": queue, "status": status, "limit": limit + 1, "after": after is not None}
    params.update({f"k{i + 1}": v for i, v in enumerate(keys)})
    cur = conn.cursor(row_factory=rows_of(JobRow))
    await cur.execute(list_statement(status), params)
    rows = await cur.fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    last = [getattr(rows[-1], name) for name in names] if more and rows else None
    return rows, last


# --- admin actions ----------------------------------------------------------------------------------------

# Each action is one template: for one job (by id, the whole row back) and for many (ids, the rows
# without payload and result), so that a bulk action is guarded exactly as the single one.


def _job_cancel(target: str, columns: str) -> str:
    """Cancel the jobs `target` (a condition on j.id) names, returning each as changed or as found."""
    return f"""
WITH target AS (
  SELECT j.id FROM jobs j
  WHERE {target} AND j.status IN ('pending', 'running', 'waiting')
    AND {queue_allowed("j.queue_name", "%(allowed)s::text")}  -- the caller's queues
  ORDER BY j.id  -- rows locked in one order: two bulk actions never wait on each other in a cycle
  FOR UPDATE
), cancelled AS (
  -- A running job is cancelled at once; its claim token stays so that the worker's next heartbeat
  -- learns of it (cancel_requested) and its complete or fail is refused with job-cancelled. The jobs
  -- that depend on a cancelled one are cancelled too, by the trigger jobs_release_dependants.
  UPDATE jobs AS j
  SET status = 'cancelled', finished_at = clock_timestamp(), lease_expires_at = NULL,
      last_error = coalesce(%(reason)s, j.last_error)
  FROM target t WHERE j.id = t.id
  RETURNING {columns}
), counted AS ({count_finished("cancelled")}
)
SELECT 0 AS ord, true AS written, * FROM cancelled
UNION ALL
SELECT 0, false, {columns} FROM jobs j
WHERE {target} AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  AND j.id NOT IN (SELECT id FROM cancelled)
"""


def _job_retry(target: str, columns: str) -> str:
    """Send the failed or cancelled jobs `target` names back to pending, returning each as changed or
    as found."""
    return f"""
WITH target AS (
  SELECT j.id, j.queue_name AS queue, j.status FROM jobs j
  WHERE {target} AND j.status IN ('failed', 'cancelled')
    AND {queue_allowed("j.queue_name", "%(allowed)s::text")}  -- the caller's queues
  ORDER BY j.id
  FOR UPDATE
), retried AS (
  -- Back to pending with a fresh set of attempts; result and token of the old run are dropped. A job
  -- cancelled because a dependency failed runs now, whatever its dependencies (docs/workflows.md).
  UPDATE jobs AS j
  SET status = 'pending', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL,
      lease_expires_at = NULL, result = NULL
  FROM target t WHERE j.id = t.id
  RETURNING {columns}
), counted AS ({count_finished("target", "status", "-1")}
)
SELECT 0 AS ord, true AS written, * FROM retried
UNION ALL
SELECT 0, false, {columns} FROM jobs j
WHERE {target} AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  AND j.id NOT IN (SELECT id FROM retried)
"""


ONE, MANY = "j.id = %(id)s", "j.id = ANY(%(ids)s::bigint[])"
BRIEF = job_columns("false")  # a bulk action's rows: no payload, no result
JOB_CANCEL, JOB_CANCEL_MANY = _job_cancel(ONE, JOB_COLUMNS), _job_cancel(MANY, BRIEF)
JOB_RETRY, JOB_RETRY_MANY = _job_retry(ONE, JOB_COLUMNS), _job_retry(MANY, BRIEF)
CANCELLABLE = (Status.pending, Status.running, Status.waiting)
RETRYABLE = (Status.failed, Status.cancelled)


async def job_cancel(
    conn: psycopg.AsyncConnection[Any], job_id: int, reason: str | None, allowed: str | None = None
) -> Written | None:
    """The outcome; None when there is no such job (or none in the caller's queues, `allowed`). Only
    pending, waiting and running jobs change."""
    return await _admin_write(conn, JOB_CANCEL, {"id": job_id, "reason": reason, "allowed": allowed}, CANCELLABLE)


async def job_retry(conn: psycopg.AsyncConnection[Any], job_id: int, allowed: str | None = None) -> Written | None:
    return await _admin_write(conn, JOB_RETRY, {"id": job_id, "allowed": allowed}, RETRYABLE)


async def jobs_cancel_many(
    conn: psycopg.AsyncConnection[Any], ids: Sequence[int], reason: str | None, allowed: str | None
) -> list[Written]:
    """One outcome per job found among `ids` (payload and result left out); the others do not exist for
    the caller."""
    params = {"ids": list(ids), "reason": reason, "allowed": allowed}
    return await _admin_write_many(conn, JOB_CANCEL_MANY, params, CANCELLABLE)


async def jobs_retry_many(conn: psycopg.AsyncConnection[Any], ids: Sequence[int], allowed: str | None) -> list[Written]:
    return await _admin_write_many(conn, JOB_RETRY_MANY, {"ids": list(ids), "allowed": allowed}, RETRYABLE)


async def _admin_write(
    conn: psycopg.AsyncConnection[Any], query: str, params: dict[str, Any], could: tuple[str, ...]
) -> Written | None:
    """The outcome of an admin action on one job (None: no such job). A refused row that still shows a
    status the action takes was read before a concurrent statement changed it (the action waited on the
    row lock, then found it changed): read it again, so that the refusal names the job's real state."""
    cur = conn.cursor(row_factory=outcome_rows(Written, JobRow))
    await cur.execute(query, params)
    row = await cur.fetchone()
    if row is None or row.job is None:
        return None
    if row.written or row.job.status not in could:
        return row
    now = await job_get(conn, params["id"], params["allowed"])
    return None if now is None else Written(0, False, now)


JOBS_GET_BRIEF = f"""
SELECT {BRIEF} FROM jobs j
WHERE {MANY} AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
ORDER BY j.id
"""


async def jobs_get_brief(conn: psycopg.AsyncConnection[Any], ids: Sequence[int], allowed: str | None) -> list[JobRow]:
    """The jobs among `ids` that the caller may see, without payload and result."""
    cur = conn.cursor(row_factory=rows_of(JobRow))
    await cur.execute(JOBS_GET_BRIEF, {"ids": list(ids), "allowed": allowed})
    return await cur.fetchall()


async def _admin_write_many(
    conn: psycopg.AsyncConnection[Any], query: str, params: dict[str, Any], could: tuple[str, ...]
) -> list[Written]:
    """The outcomes of a bulk action, each job's refusal naming its real state as in _admin_write."""
    cur = conn.cursor(row_factory=outcome_rows(Written, JobRow))
    await cur.execute(query, params)
    rows = [r for r in await cur.fetchall() if r.job is not None]
    stale = {r.job.id for r in rows if r.job is not None and not r.written and r.job.status in could}
    if not stale:
        return rows
    fresh = {j.id: j for j in await jobs_get_brief(conn, sorted(stale), params["allowed"])}
    out = []
    for r in rows:
        job_id = r.job.id if r.job is not None else 0
        if job_id not in stale:
            out.append(r)
        elif job_id in fresh:  # (gone meanwhile: deleted by retention, so not found)
            out.append(Written(0, False, fresh[job_id]))
    return out


REDRIVE_COUNT = """
SELECT count(*) FROM jobs
WHERE queue_name = %(queue)s AND status = 'failed' AND finished_at IS NOT NULL
  AND (%(contains)s::text IS NULL OR strpos(last_error, %(contains)s) > 0)
"""

REDRIVE_BATCH = f"""
WITH target AS (
  -- Failed jobs of one queue, oldest first, a batch at a time; SKIP LOCKED lets a concurrent redrive
  -- or retry proceed without waiting.
  SELECT id, queue_name AS queue, status FROM jobs
  WHERE queue_name = %(queue)s AND status = 'failed' AND finished_at IS NOT NULL
    AND (%(contains)s::text IS NULL OR strpos(last_error, %(contains)s) > 0)
  ORDER BY finished_at, id
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), redriven AS (
  UPDATE jobs AS j
  SET status = 'pending', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL,
      lease_expires_at = NULL
  FROM target t WHERE j.id = t.id
  RETURNING j.id
), counted AS ({count_finished("target", "status", "-1")}
)
SELECT count(*) FROM redriven
"""


async def jobs_redrive(
    conn: psycopg.AsyncConnection[Any], queue: str, contains: str | None, dry_run: bool, batch: int, limit: int | None
) -> int:
    """Failed jobs back to pending (or only counted, dry_run), in batches so that no transaction grows
    with the size of the dead-letter set."""
    params: dict[str, Any] = {"queue": queue, "contains": contains}
    if dry_run:
        cur = await conn.execute(REDRIVE_COUNT, params)
        found = await cur.fetchone()
        total = int(found[0]) if found else 0
        return min(total, limit) if limit is not None else total
    moved = 0
    while limit is None or moved < limit:
        size = batch if limit is None else min(batch, limit - moved)
        cur = await conn.execute(REDRIVE_BATCH, {**params, "batch": size})
        row = await cur.fetchone()
        n = int(row[0]) if row else 0
        moved += n
        if n < size:
            break
    return moved


QUEUE_SET_PAUSED = """
INSERT INTO queue_state (queue_name, paused) VALUES (%(queue)s, %(paused)s)
ON CONFLICT (queue_name) DO UPDATE SET paused = EXCLUDED.paused, changed_at = now()
RETURNING paused
"""


async def queue_set_paused(conn: psycopg.AsyncConnection[Any], queue: str, paused: bool) -> None:
    await conn.execute(QUEUE_SET_PAUSED, {"queue": queue, "paused": paused})


# --- retention ----------------------------------------------------------------------------------------------

FINISHED_QUEUES = "SELECT queue_name FROM queue_counts GROUP BY queue_name HAVING sum(n) > 0"

JOBS_DELETE_FINISHED = f"""
WITH doomed AS (
  -- Oldest finished jobs of one queue and status past the retention age, via jobs_finished_idx.
  SELECT id FROM jobs
  WHERE queue_name = %(queue)s AND status = %(status)s AND finished_at IS NOT NULL
    AND finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(age)s)
  ORDER BY finished_at
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), deleted AS (
  DELETE FROM jobs j USING doomed WHERE j.id = doomed.id RETURNING j.queue_name AS queue, j.status
), counted AS ({count_finished("deleted", "status", "-1")}
)
SELECT count(*) FROM deleted
"""


async def finished_queues(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    cur = await conn.execute(FINISHED_QUEUES)
    return [r[0] for r in await cur.fetchall()]


async def jobs_delete_finished(
    conn: psycopg.AsyncConnection[Any], queue: str, status: str, age_seconds: float, batch: int, now: datetime | None
) -> int:
    cur = await conn.execute(
        JOBS_DELETE_FINISHED, {"queue": queue, "status": status, "age": age_seconds, "batch": batch, "now": now}
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


# --- vacuum ---------------------------------------------------------------------------------------------------

JOBS_DEAD_ROWS = """
-- The cumulative statistics PostgreSQL keeps anyway: no scan.
SELECT coalesce(n_dead_tup, 0), coalesce(n_live_tup, 0) FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass
"""


async def jobs_dead_rows(conn: psycopg.AsyncConnection[Any]) -> tuple[int, int]:
    cur = await conn.execute(JOBS_DEAD_ROWS)
    row = await cur.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


# --- what holds vacuum back -----------------------------------------------------------------------------------

DATABASE_HEALTH = """
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
SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass), 0) AS jobs_dead_rows,
       coalesce(extract(epoch FROM (SELECT max(held) FROM holders))::float8, 0) AS oldest_xmin_age_seconds,
       coalesce((SELECT max(xids) FROM holders), 0) AS oldest_xmin_age_transactions
"""


async def database_health(conn: psycopg.AsyncConnection[Any]) -> DatabaseHealthRow:
    cur = conn.cursor(row_factory=rows_of(DatabaseHealthRow))
    await cur.execute(DATABASE_HEALTH)
    row = await cur.fetchone()
    assert row is not None
    return row
