"""SQL for operators' actions: cancel, retry (one job or many), redrive, pause. Every action is guarded by the
job's status so that it cannot race a worker into an impossible state, and keeps queue_counts exact in the same
transaction.

One queue per statement: an action addressed by job id finds the job's queue first (app/db/tokens.py
queue_of_job; for many jobs, JOBS_QUEUES, one read), then names it in every reference to `jobs`, so that on
Citus the statement runs on that queue's one shard (app/db/distribute.py); a bulk action over jobs of several
queues runs once per queue. The finished-job counters and the dependency release's outbox rows are written by
a second statement of the same transaction, from the rows the action returns (COUNT_ADD, RELEASE_RECORD):
Citus runs an INSERT ... SELECT from a CTE's rows through the coordinator, never as part of a one-shard
statement."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from app.db.constraints import constraint_of
from app.db.jobs import JOB_COLUMNS, job_columns, job_get
from app.db.rows import FINISHED, JobRow, Moved, Status, outcome_rows, rows_of
from app.db.scope import queue_allowed
from app.db.tokens import queue_of_job
from app.errors import InvalidState

# --- admin actions ----------------------------------------------------------------------------------------

# Each action is one template: for one job (by id, the whole row back) and for many (ids, the rows
# without payload and result), so that a bulk action is guarded exactly as the single one.


def _job_cancel(target: str, columns: str) -> str:
    """Cancel the jobs `target` (a condition on j.id, in the queue %(queue)s) names, returning each as changed or
    as found."""
    return f"""
WITH stamp AS (
  SELECT clock_timestamp() AS now  -- here, not in the UPDATE: Citus refuses a VOLATILE function there
), target AS (
  SELECT j.id, j.status AS was FROM jobq.jobs j
  WHERE {target} AND j.status IN ('pending', 'running', 'waiting')
    AND {queue_allowed("j.queue_name", "%(allowed)s::text")}  -- the caller's queues
  ORDER BY j.id  -- rows locked in one order: two bulk actions never wait on each other in a cycle
  FOR UPDATE
), cancelled AS (
  -- A running job is cancelled at once; its claim token stays so that the worker's next heartbeat
  -- learns of it (cancel_requested) and its complete or fail is refused with job-cancelled. The jobs
  -- that depend on a cancelled one are cancelled too, by the release (RELEASE_RECORD, app/db/releases.py).
  UPDATE jobq.jobs AS j
  SET status = 'cancelled', finished_at = st.now, lease_expires_at = NULL,
      last_error = coalesce(%(reason)s, j.last_error)
  FROM target t CROSS JOIN stamp st WHERE j.queue_name = %(queue)s AND j.id = t.id
  -- The row itself; its columns as the API shows them are computed below (Citus refuses functions that are
  -- not IMMUTABLE in RETURNING).
  RETURNING t.was, j.queue_name AS queue, j.*
  -- Counted and recorded for the release by the caller, in the same transaction (see above).
)
SELECT 0 AS ord, true AS written, j.was, {columns} FROM cancelled j
UNION ALL
SELECT 0, false, NULL, {columns} FROM jobq.jobs j
WHERE {target} AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  AND j.id NOT IN (SELECT id FROM cancelled)
"""


# A job whose unique key another job holds now (jobs_unique_idx: the same queue, key, window start and
# length, in one of its own states) is left out of a redrive and a bulk retry by filter: it stays as it
# is, and the others move.
_KEY_FREE = """(j.unique_key IS NULL OR NOT EXISTS (
      SELECT FROM jobq.jobs h
      WHERE h.queue_name = %(queue)s AND h.queue_name = j.queue_name
        AND h.unique_key = j.unique_key AND h.unique_from = j.unique_from
        AND coalesce(h.unique_for_seconds, 0) = coalesce(j.unique_for_seconds, 0)
        AND h.unique_key IS NOT NULL AND h.status = ANY(h.unique_states) AND h.id <> j.id))"""


def _job_retry(target: str, columns: str, skip_held: bool = False) -> str:
    """Send the failed, cancelled or completed jobs `target` names (all in the queue %(queue)s) back to pending,
    returning each as changed or as found. `skip_held`: a job whose unique key another job holds is left as it
    is (found, not changed), and of jobs sharing a key only the first (by id) moves, rather than the whole
    statement refused."""
    if not skip_held:
        head = f"""
WITH target AS (
  SELECT j.id, j.queue_name AS queue, j.status FROM jobq.jobs j
  WHERE {target} AND j.status IN ('failed', 'cancelled', 'completed')
    AND {queue_allowed("j.queue_name", "%(allowed)s::text")}  -- the caller's queues
  ORDER BY j.id
  FOR UPDATE
)"""
    else:
        head = f"""
WITH locked AS (
  SELECT j.id, j.queue_name AS queue, j.status, j.unique_key, j.unique_from, j.unique_for_seconds FROM jobq.jobs j
  WHERE {target} AND j.status IN ('failed', 'cancelled', 'completed')
    AND {queue_allowed("j.queue_name", "%(allowed)s::text")}  -- the caller's queues
    AND {_KEY_FREE}
  ORDER BY j.id
  FOR UPDATE
), target AS (
  SELECT id, queue, status FROM (
    SELECT l.*, row_number() OVER (PARTITION BY l.unique_key, l.unique_from, coalesce(l.unique_for_seconds, 0)
                                   ORDER BY l.id) AS nth
    FROM locked l
  ) x
  WHERE x.unique_key IS NULL OR x.nth = 1
)"""
    return f"""{head}, retried AS (
  -- Back to pending with a fresh set of attempts; result and token of the old run are dropped. A job
  -- cancelled because a dependency failed runs now, whatever its dependencies (docs/workflows.md). A
  -- completed job runs again (a replay): the same job, with its id, payload, creation time and what its
  -- last run left (last_error, worker, claimed_at, progress) until its next claim.
  UPDATE jobq.jobs AS j
  SET status = 'pending', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL,
      lease_expires_at = NULL, result = NULL
  FROM target t WHERE j.queue_name = %(queue)s AND j.id = t.id
  RETURNING t.status AS was, j.*  -- its columns computed below, as in _job_cancel; counted by the caller
)
SELECT 0 AS ord, true AS written, j.was, {columns} FROM retried j
UNION ALL
SELECT 0, false, NULL, {columns} FROM jobq.jobs j
WHERE {target} AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  AND j.id NOT IN (SELECT id FROM retried)
"""


# Every statement addressed by job id names the job's queue too (resolved first by the caller, app/db/tokens.py
# queue_of_job), so that on Citus it runs on that queue's one shard (app/db/distribute.py); a bulk action runs
# once per queue of its jobs. On plain PostgreSQL the primary key is still the way in.
ONE = "j.queue_name = %(queue)s AND j.id = %(id)s"
MANY = "j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[])"
BRIEF = job_columns("false")  # a bulk action's rows: no payload, no result
JOB_CANCEL, JOB_CANCEL_MANY = _job_cancel(ONE, JOB_COLUMNS), _job_cancel(MANY, BRIEF)
JOB_RETRY, JOB_RETRY_MANY = _job_retry(ONE, JOB_COLUMNS), _job_retry(MANY, BRIEF)
JOB_RETRY_MANY_SKIP_HELD = _job_retry(MANY, BRIEF, skip_held=True)
CANCELLABLE = (Status.pending, Status.running, Status.waiting)
RETRYABLE = (Status.failed, Status.cancelled, Status.completed)
# What a bulk retry by filter takes when the filter names no status: a completed job is replayed only when
# asked for by name (an id, or `status: completed`), never swept up by a broad filter.
RETRYABLE_BY_DEFAULT = (Status.failed, Status.cancelled)


# A finished-job counter moved by an action (as count_finished in app/db/jobs.py: a row per backend, so that
# concurrent statements do not queue on one row), in the action's transaction; VALUES, which Citus routes to
# the queue's shard.
COUNT_ADD = """
INSERT INTO jobq.queue_counts AS c (queue_name, status, shard, n)
VALUES (%(queue)s, %(status)s, mod(pg_backend_pid(), 64), %(n)s)
ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n
"""

# A job this action finished while some job depends on it: the dependency release's outbox row (as
# record_finished in app/db/jobs.py), in the action's transaction, in the finished job's queue.
RELEASE_RECORD = """
INSERT INTO jobq.dependency_releases (queue_name, job_id, status) VALUES (%(queue)s, %(id)s, %(status)s)
"""

# The queues of jobs known by id alone (a bulk action by ids): the primary key on plain PostgreSQL; on Citus a
# read of every shard, once per action, before each queue's statement goes to its one shard.
JOBS_QUEUES = "SELECT id, queue_name FROM jobq.jobs WHERE id = ANY(%(ids)s::bigint[])"


async def _record(conn: psycopg.AsyncConnection[Any], queue: str, moved: Iterable[Moved], retry: bool) -> None:
    """What the written rows of an action in `queue` change beside the jobs: a cancel adds its jobs to the
    cancelled counter and records those some job depends on; a retry takes its jobs off the counter of the
    status each had (a redrive: see jobs_redrive)."""
    written = [m for m in moved if m.written and m.job is not None]
    if retry:
        counts = Counter(m.was for m in written if m.was in FINISHED)
        params = [{"queue": queue, "status": status, "n": -n} for status, n in sorted(counts.items())]
        released = []
    else:
        params = [{"queue": queue, "status": str(Status.cancelled), "n": len(written)}] if written else []
        released = [
            {"queue": queue, "id": m.job.id, "status": str(m.job.status)}
            for m in written
            if m.job is not None and m.job.has_dependants
        ]
    async with conn.cursor() as cur:
        if params:
            await cur.executemany(COUNT_ADD, params)
        if released:
            await cur.executemany(RELEASE_RECORD, released)


async def job_cancel(
    conn: psycopg.AsyncConnection[Any], job_id: int, reason: str | None, allowed: str | None = None
) -> Moved | None:
    """The outcome; None when there is no such job (or none in the caller's queues, `allowed`). Only
    pending, waiting and running jobs change."""
    queue = await queue_of_job(conn, job_id)
    if queue is None:
        return None
    params = {"id": job_id, "queue": queue, "reason": reason, "allowed": allowed}
    return await _admin_write(conn, JOB_CANCEL, params, CANCELLABLE, retry=False)


@contextmanager
def unique_key_held() -> Iterator[None]:
    """A retried or redriven unique job whose key another job holds now (migrations/0041_jobs_unique_idx.sql):
    the job was failed or cancelled (or completed, where its `while` leaves completed out), which freed its
    key, and a later enqueue took it. Refused, with nothing changed: two jobs would hold one key."""
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        if constraint_of(exc, ("jobs_unique_idx",)) != "jobs_unique_idx":  # on Citus, from the message
            raise
        raise InvalidState(
            "Another job holds this job's unique key (in its window) now; the job is left as it was. Cancel "
            "that job first, or enqueue a new one."
        ) from exc


async def job_retry(conn: psycopg.AsyncConnection[Any], job_id: int, allowed: str | None = None) -> Moved | None:
    queue = await queue_of_job(conn, job_id)
    if queue is None:
        return None
    with unique_key_held():
        return await _admin_write(conn, JOB_RETRY, {"id": job_id, "queue": queue, "allowed": allowed}, RETRYABLE)


async def jobs_queues(
    conn: psycopg.AsyncConnection[Any], ids: Sequence[int], known: Mapping[int, str] | None = None
) -> dict[str, list[int]]:
    """The jobs among `ids` that exist, by queue (queues in name order, ids in the order given): `known` (the
    queues a search found them in) or else looked up by id, in one read."""
    if known is None:
        cur = await conn.execute(JOBS_QUEUES, {"ids": list(ids)})
        known = {int(i): str(q) for i, q in await cur.fetchall()}
    out: dict[str, list[int]] = {}
    for job_id in ids:
        if (queue := known.get(job_id)) is not None:
            out.setdefault(queue, []).append(job_id)
    return {q: out[q] for q in sorted(out)}


async def jobs_cancel_many(
    conn: psycopg.AsyncConnection[Any],
    ids: Sequence[int],
    reason: str | None,
    allowed: str | None,
    queues: Mapping[int, str] | None = None,
) -> list[Moved]:
    """One outcome per job found among `ids` (payload and result left out); the others do not exist for
    the caller. `queues`: the jobs' queues when known (else looked up); one statement per queue."""
    out = []
    for queue, some in (await jobs_queues(conn, ids, queues)).items():
        params = {"ids": some, "queue": queue, "reason": reason, "allowed": allowed}
        out += await _admin_write_many(conn, JOB_CANCEL_MANY, params, CANCELLABLE, retry=False)
    return out


async def jobs_retry_many(
    conn: psycopg.AsyncConnection[Any],
    ids: Sequence[int],
    allowed: str | None,
    skip_held: bool = False,
    queues: Mapping[int, str] | None = None,
) -> list[Moved]:
    """`skip_held` (a bulk retry by filter): a job whose unique key is held is left as it is, and comes
    back as found, not changed; otherwise (by ids) it refuses the action with 409 (the jobs of queues done
    before stay retried). `queues`: as jobs_cancel_many."""
    query = JOB_RETRY_MANY_SKIP_HELD if skip_held else JOB_RETRY_MANY
    out = []
    for queue, some in (await jobs_queues(conn, ids, queues)).items():
        with unique_key_held():
            params = {"ids": some, "queue": queue, "allowed": allowed}
            out += await _admin_write_many(conn, query, params, RETRYABLE)
    return out


async def _admin_write(
    conn: psycopg.AsyncConnection[Any],
    query: str,
    params: dict[str, Any],
    could: tuple[str, ...],
    retry: bool = True,
) -> Moved | None:
    """The outcome of an admin action on one job (None: no such job). A refused row that still shows a
    status the action takes was read before a concurrent statement changed it (the action waited on the
    row lock, then found it changed): read it again, so that the refusal names the job's real state."""
    cur = conn.cursor(row_factory=outcome_rows(Moved, JobRow))
    async with conn.transaction():
        await cur.execute(query, params)
        row = await cur.fetchone()
        if row is not None and row.written:
            await _record(conn, params["queue"], [row], retry)
    if row is None or row.job is None:
        return None
    if row.written or row.job.status not in could:
        return row
    now = await job_get(conn, params["id"], params["allowed"], params["queue"])
    return None if now is None else Moved(0, False, None, now)


JOBS_GET_BRIEF = f"""
SELECT {BRIEF} FROM jobq.jobs j
WHERE {MANY} AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
ORDER BY j.id
"""


async def jobs_get_brief(
    conn: psycopg.AsyncConnection[Any], ids: Sequence[int], allowed: str | None, queues: Mapping[int, str] | None = None
) -> list[JobRow]:
    """The jobs among `ids` that the caller may see, without payload and result, by queue (then id).
    `queues`: as jobs_cancel_many."""
    cur = conn.cursor(row_factory=rows_of(JobRow))
    out = []
    for queue, some in (await jobs_queues(conn, ids, queues)).items():
        await cur.execute(JOBS_GET_BRIEF, {"ids": some, "queue": queue, "allowed": allowed})
        out += await cur.fetchall()
    return out


async def _admin_write_many(
    conn: psycopg.AsyncConnection[Any],
    query: str,
    params: dict[str, Any],
    could: tuple[str, ...],
    retry: bool = True,
) -> list[Moved]:
    """The outcomes of a bulk action in one queue, each job's refusal naming its real state as in _admin_write."""
    cur = conn.cursor(row_factory=outcome_rows(Moved, JobRow))
    async with conn.transaction():
        await cur.execute(query, params)
        rows = [r for r in await cur.fetchall() if r.job is not None]
        await _record(conn, params["queue"], rows, retry)
    stale = {r.job.id for r in rows if r.job is not None and not r.written and r.job.status in could}
    if not stale:
        return rows
    queue = params["queue"]
    fresh = {j.id: j for j in await jobs_get_brief(conn, sorted(stale), params["allowed"], dict.fromkeys(stale, queue))}
    out = []
    for r in rows:
        job_id = r.job.id if r.job is not None else 0
        if job_id not in stale:
            out.append(r)
        elif job_id in fresh:  # (gone meanwhile: deleted by retention, so not found)
            out.append(Moved(0, False, None, fresh[job_id]))
    return out


REDRIVE_COUNT = f"""
-- What a redrive would move: jobs whose unique key is held are left out, and of failed jobs sharing a key
-- one only.
SELECT count(*) FILTER (WHERE j.unique_key IS NULL)
       + count(DISTINCT (j.unique_key, j.unique_from, coalesce(j.unique_for_seconds, 0)))
           FILTER (WHERE j.unique_key IS NOT NULL)
FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.status = 'failed' AND j.finished_at IS NOT NULL
  AND (%(contains)s::text IS NULL OR strpos(j.last_error, %(contains)s) > 0)
  AND {_KEY_FREE}
"""

REDRIVE_BATCH = f"""
WITH selected AS (
  -- Failed jobs of one queue, oldest first, a batch at a time; SKIP LOCKED lets a concurrent redrive
  -- or retry proceed without waiting. A job whose unique key another job holds is not selected.
  SELECT j.id, j.queue_name AS queue, j.status, j.unique_key, j.unique_from, j.unique_for_seconds,
         j.finished_at
  FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.status = 'failed' AND j.finished_at IS NOT NULL
    AND (%(contains)s::text IS NULL OR strpos(j.last_error, %(contains)s) > 0)
    AND {_KEY_FREE}
  ORDER BY j.finished_at, j.id
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), target AS (
  -- Of selected jobs sharing a unique key, the oldest only: the others stay failed (the next batch finds
  -- their key held by it, and selects them no more).
  SELECT id, queue, status FROM (
    SELECT s.*, row_number() OVER (PARTITION BY s.unique_key, s.unique_from, coalesce(s.unique_for_seconds, 0)
                                   ORDER BY s.finished_at, s.id) AS nth
    FROM selected s
  ) x
  WHERE x.unique_key IS NULL OR x.nth = 1
), redriven AS (
  UPDATE jobq.jobs AS j
  SET status = 'pending', attempts = 0, run_at = now(), finished_at = NULL, claim_token = NULL,
      lease_expires_at = NULL
  FROM target t WHERE j.queue_name = %(queue)s AND j.id = t.id
  RETURNING j.id  -- counted by the caller, in the same transaction (all were failed)
)
SELECT (SELECT count(*) FROM redriven) AS moved, (SELECT count(*) FROM selected) AS selected
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
        with unique_key_held():  # the batches before it stay redriven
            async with conn.transaction():
                cur = await conn.execute(REDRIVE_BATCH, {**params, "batch": size})
                row = await cur.fetchone()
                n, selected = (int(row[0]), int(row[1])) if row else (0, 0)
                if n:  # every job redriven was failed
                    await conn.execute(COUNT_ADD, {"queue": queue, "status": str(Status.failed), "n": -n})
        moved += n
        if selected < size:  # rows selected, not moved: a batch may leave some (a shared key) and go on
            break
    return moved


QUEUE_SET_PAUSED = """
-- The time in VALUES, taken over by EXCLUDED: Citus refuses a function that is not IMMUTABLE in DO UPDATE SET.
INSERT INTO jobq.queue_state (queue_name, paused, changed_at) VALUES (%(queue)s, %(paused)s, now())
ON CONFLICT (queue_name) DO UPDATE SET paused = EXCLUDED.paused, changed_at = EXCLUDED.changed_at
RETURNING paused
"""


async def queue_set_paused(conn: psycopg.AsyncConnection[Any], names: Sequence[str], paused: bool) -> None:
    """Pause or resume a queue under every name it keeps jobs under (a spread queue's keys: app/db/spread.py), each
    on its own shard, in the caller's transaction."""
    async with conn.cursor() as cur:
        await cur.executemany(QUEUE_SET_PAUSED, [{"queue": q, "paused": paused} for q in names])
