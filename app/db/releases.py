"""The dependency release's statements: what happens to the jobs waiting for a job once it has finished.

The statement that finishes a job with dependants (complete, fail for good, cancel, bulk cancel, purge, the
lease rescuer's terminal fail) records it in the outbox `dependency_releases`, in that statement
(app/db/jobs.py record_finished). Everything else happens here, afterwards, in transactions of a few
statements each, driven by app/core/dependencies.py (right after the finish, and by the background service
app/maintenance/releaser.py):

  RELEASES_CLAIM      a batch of one queue's outbox rows, locked (SKIP LOCKED: one process per row), with
                      the finished job as it is now and the database's clock;
  EDGES_TAKE          a bounded batch of those jobs' job_dependencies rows, consumed;
  DEPENDANTS_SETTLE   the dependants of one queue counted down: `pending` at zero, or cancelled when the
                      finished job did not complete (on_dependency_failure = run: counted as done). A
                      dependant it cancels that has dependants of its own gets an outbox row in its queue:
                      the cascade's next level, done by a later step;
  RELEASES_DONE       the outbox rows whose job has no job_dependencies row left.

Bounded: a step touches at most `batch` dependency rows and as many dependants; each statement runs under
the step's own statement_timeout. Crash-safe: a step is one transaction, so a process that dies mid-step
leaves the outbox row (and the dependency rows) as they were, and the next process to look carries on.

One queue per statement: every statement names the queue whose rows it reads or writes (the outbox and the
dependency rows by the finished job's queue, the dependants by their own), so each would be a single-shard
statement with the tables distributed by queue name; no VOLATILE function in an UPDATE (the time comes from
RELEASES_CLAIM, as a parameter). The statements that span queues only read, without locks, to find work:
RELEASE_QUEUES and EDGES_PARENT_QUEUES. The one exception is JOBS_QUEUES, which finds the queues of rows written
by a previous release (without queue names) by looking their jobs up by id; a fresh installation never has
such rows.

Lock order (no deadlock): an outbox row, then its job's dependency rows, then dependants in id order across
queues (app/core/dependencies.py runs DEPENDANTS_SETTLE per run of consecutive ids in one queue), then the
outbox rows it inserts (new rows). Statements finishing jobs lock only the jobs they finish, and an enqueue
waits for a locked parent holding nothing (app/db/dependencies.py): no cycle. On Citus EDGES_TAKE also takes
the lock by which Citus serialises the writers of job_dependencies, a reference table (one shard: in effect a
lock on the whole table, on the first worker node, until commit); an enqueue with dependencies takes its own
mode of that lock before any job's row lock (app/db/dependencies.py _insert_dependent), so the same order
holds: that lock, then jobs.

The same reconciliation also releases what a process of the previous release left: its finishes record
nothing, so EDGES_FINISHED_PARENTS, a bounded walk of each queue's dependency rows, records every finished
(or deleted) job that still has some."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from app.db import finishing
from app.db.jobs import FINISHED_SQL, as_json
from app.db.rows import rows_of

# --- the outbox ----------------------------------------------------------------------------------------------

RELEASE_QUEUES = """
-- The queues with outbox rows, in name order after `after` (a pass goes round them all). The outbox holds
-- only cascades in progress: a few rows. A read without locks.
SELECT DISTINCT queue_name FROM jobq.dependency_releases
WHERE queue_name > %(after)s
ORDER BY 1
LIMIT %(limit)s
"""


async def release_queues(conn: psycopg.AsyncConnection[Any], after: str, limit: int) -> list[str]:
    cur = await conn.execute(RELEASE_QUEUES, {"after": after, "limit": limit})
    return [str(r[0]) for r in await cur.fetchall()]


RELEASES_CLAIM = """
-- A batch of one queue's outbox rows, oldest first (or those of the jobs `jobs`: the ones a request just
-- finished), locked until the step commits; rows another step holds are skipped (by the background; the
-- request's own step waits for them instead: RELEASES_CLAIM_OWN). With each, the job as it
-- is now: finished (its dependants are released by how it finished), not finished (retried since: its
-- rows wait for its next finish), or gone (deleted by retention: as recorded). And the database's clock,
-- which the step's writes use.
SELECT r.id, r.job_id, r.status AS recorded, p.status AS status, clock_timestamp() AS now
FROM (
  SELECT d.id, d.job_id, d.status FROM jobq.dependency_releases d
  WHERE d.queue_name = %(queue)s AND (%(jobs)s::bigint[] IS NULL OR d.job_id = ANY(%(jobs)s::bigint[]))
  ORDER BY d.id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
) r
LEFT JOIN LATERAL (
  -- One lookup by primary key per row (OFFSET 0: kept a lookup whatever the statistics say).
  SELECT j.status FROM jobq.jobs j WHERE j.id = r.job_id AND j.queue_name = %(queue)s OFFSET 0
) p ON true
ORDER BY r.id
"""

# The request's own step (the jobs it just finished): a row the background holds is waited for, not skipped,
# so that the answer still comes after the first batch of dependants is released, by one or the other (the
# background's step is one transaction under the statement budget; a row it consumed is gone, not returned).
RELEASES_CLAIM_OWN = RELEASES_CLAIM.replace("FOR UPDATE SKIP LOCKED", "FOR UPDATE")
assert RELEASES_CLAIM_OWN != RELEASES_CLAIM


@dataclass(slots=True, frozen=True)
class Release:
    """An outbox row: the job `job_id` finished (`recorded`), and its status now (None: gone)."""

    id: int
    job_id: int
    recorded: str
    status: str | None
    now: datetime


async def releases_claim(
    conn: psycopg.AsyncConnection[Any], queue: str, jobs: Sequence[int] | None, limit: int
) -> list[Release]:
    cur = conn.cursor(row_factory=rows_of(Release))
    await cur.execute(
        RELEASES_CLAIM if jobs is None else RELEASES_CLAIM_OWN,
        {"queue": queue, "jobs": list(jobs) if jobs is not None else None, "limit": limit},
    )
    return await cur.fetchall()


RELEASES_DONE = """
-- Outbox rows whose job has no dependency row left (or was retried since: its next finish records it again).
DELETE FROM jobq.dependency_releases WHERE queue_name = %(queue)s AND id = ANY(%(ids)s::bigint[])
"""


async def releases_done(conn: psycopg.AsyncConnection[Any], queue: str, ids: Sequence[int]) -> None:
    if ids:
        await conn.execute(RELEASES_DONE, {"queue": queue, "ids": list(ids)})


# --- the dependency rows --------------------------------------------------------------------------------------

EDGES_TAKE = """
-- At most `limit` dependency rows of the finished jobs `parents` (all in `queue`), in (parent, dependant) order,
-- locked, consumed; a row a previous release wrote without queue names waits for the reconciliation. By primary
-- key (on Citus job_dependencies is a reference table, whose copies share no ctid): one task.
DELETE FROM jobq.job_dependencies d
WHERE (d.parent_id, d.job_id) IN (
  SELECT parent_id, job_id FROM jobq.job_dependencies
  WHERE parent_queue = %(queue)s AND parent_id = ANY(%(parents)s::bigint[])
  ORDER BY parent_id, job_id
  LIMIT %(limit)s
  FOR UPDATE
)
RETURNING d.parent_id, d.job_id, d.job_queue
"""


@dataclass(slots=True, frozen=True)
class Edge:
    parent_id: int
    job_id: int
    job_queue: str


async def edges_take(conn: psycopg.AsyncConnection[Any], queue: str, parents: Sequence[int], limit: int) -> list[Edge]:
    """The dependency rows consumed, sorted by (parent, dependant)."""
    cur = conn.cursor(row_factory=rows_of(Edge))
    await cur.execute(EDGES_TAKE, {"queue": queue, "parents": sorted(parents), "limit": limit})
    return sorted(await cur.fetchall(), key=lambda e: (e.parent_id, e.job_id))


# --- the dependants ----------------------------------------------------------------------------------------------

# A dependant is cancelled when one of the finished jobs counted here did not complete, unless it runs anyway.
_CANCEL = "i.bad_id IS NOT NULL AND j.on_dependency_failure IS DISTINCT FROM 'run'"

DEPENDANTS_SETTLE = f"""
WITH input AS (
  -- Per dependant: how many of its dependencies finished (n), and the first of them that did not complete.
  SELECT * FROM json_to_recordset(%(items)s::json) AS t(id bigint, n int, bad_id bigint, bad_status text)
), changed AS (
  -- Only waiting dependants change: one cancelled meanwhile (or retried since) is left alone. Reached by
  -- primary key in id order (the ids come sorted): the status is compared with a value the planner cannot
  -- see (as app/db/jobs.py RUNNING), so jobs_waiting_idx, which stale statistics can make look empty, is
  -- never the way in.
  UPDATE jobq.jobs AS j
  SET status = CASE WHEN {_CANCEL} THEN 'cancelled'
                    WHEN j.pending_dependencies > i.n THEN 'waiting' ELSE 'pending' END,
      pending_dependencies = CASE WHEN {_CANCEL} THEN j.pending_dependencies
                                  ELSE greatest(j.pending_dependencies - i.n, 0) END,
      -- Released: due now, or at its own run_at if that is later (a delay counts from the enqueue). Claim
      -- order then puts it after the jobs that were ready before it.
      run_at = CASE WHEN {_CANCEL} OR j.pending_dependencies > i.n THEN j.run_at
                    ELSE greatest(j.run_at, %(now)s::timestamptz) END,
      finished_at = CASE WHEN {_CANCEL} THEN %(now)s::timestamptz END,
      -- bad_id cast to text: text || bigint is STABLE (any type's output function), and Citus would then
      -- read the input through the coordinator.
      last_error = CASE WHEN {_CANCEL} THEN 'dependency ' || i.bad_id::text || ' ' || i.bad_status ELSE j.last_error END
  FROM input i
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id
    AND j.status = (SELECT 'waiting'::text)
  RETURNING j.id, j.status, coalesce(j.has_dependants, false) AS has_dependants
)
-- The ones it cancelled are counted, and those others depend on recorded (the cascade's next level, released
-- by a later step), by dependants_settle's own statements in the same transaction (app/db/finishing.py): an
-- INSERT in a CTE would make Citus split this statement. Most settles cancel nothing and send neither.
SELECT id, status, has_dependants FROM changed
"""


@dataclass(slots=True, frozen=True)
class Settled:
    id: int
    status: str
    has_dependants: bool


async def dependants_settle(
    conn: psycopg.AsyncConnection[Any], queue: str, items: Sequence[dict[str, Any]], now: datetime
) -> list[Settled]:
    """Count down the dependants `items` of one queue ({id, n, bad_id, bad_status}, sorted by id); the ones
    that changed (still waiting, pending, or cancelled)."""
    cur = conn.cursor(row_factory=rows_of(Settled))
    await cur.execute(DEPENDANTS_SETTLE, {"queue": queue, "items": as_json(list(items)), "now": now})
    settled = await cur.fetchall()
    cancelled = [s for s in settled if s.status == "cancelled"]
    await finishing.counts_add(conn, queue, "cancelled", len(cancelled))
    await finishing.releases_written(conn, queue, [(s.id, s.status) for s in cancelled if s.has_dependants])
    return settled


# --- the reconciliation ------------------------------------------------------------------------------------------

EDGES_LEGACY = """
-- Dependency rows a previous release wrote (no queue names), a batch at a time, locked.
SELECT parent_id, job_id FROM jobq.job_dependencies
WHERE parent_queue IS NULL OR job_queue IS NULL
ORDER BY parent_id, job_id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

JOBS_QUEUES = """
-- The queues of jobs known by id alone (the one lookup across queues here, for rows only a previous release
-- writes): by primary key; on Citus a read of every shard, once per batch.
SELECT id, queue_name FROM jobq.jobs WHERE id = ANY(%(ids)s::bigint[])
"""

EDGES_FILL_QUEUES = """
-- Those rows given their queue names (a reference table on Citus: its rows are joined only with the input).
UPDATE jobq.job_dependencies AS d SET parent_queue = f.parent_queue, job_queue = f.job_queue
FROM unnest(%(parents)s::bigint[], %(jobs)s::bigint[], %(parent_queues)s::text[], %(job_queues)s::text[])
  AS f(parent_id, job_id, parent_queue, job_queue)
WHERE d.parent_id = f.parent_id AND d.job_id = f.job_id
"""


async def edges_fill_queues(conn: psycopg.AsyncConnection[Any], limit: int) -> int:
    """Within a transaction: one batch of legacy dependency rows given their queue names. A parent gone (deleted
    by retention, so finished) files the row under its dependant's queue, where the reconciliation finds no such
    job, and so releases the dependant as if it had completed; a dependant gone leaves a row that the release
    consumes and that changes nothing."""
    cur = await conn.execute(EDGES_LEGACY, {"limit": limit})
    rows = [(int(r[0]), int(r[1])) for r in await cur.fetchall()]
    if not rows:
        return 0
    cur = await conn.execute(JOBS_QUEUES, {"ids": sorted({i for r in rows for i in r})})
    queue = {int(r[0]): str(r[1]) for r in await cur.fetchall()}
    parent_queues = [queue.get(p, queue.get(j, "")) for p, j in rows]
    await conn.execute(
        EDGES_FILL_QUEUES,
        {
            "parents": [p for p, _ in rows],
            "jobs": [j for _, j in rows],
            "parent_queues": parent_queues,
            "job_queues": [queue.get(j, "") for _, j in rows],
        },
    )
    return len(rows)


EDGES_PARENT_QUEUES = """
-- The next queue (in name order) whose jobs others wait for: one probe of job_dependencies_parent_queue_idx.
SELECT min(parent_queue) FROM jobq.job_dependencies WHERE parent_queue > %(after)s
"""


async def edges_next_queue(conn: psycopg.AsyncConnection[Any], after: str) -> str | None:
    cur = await conn.execute(EDGES_PARENT_QUEUES, {"after": after})
    row = await cur.fetchone()
    return None if row is None or row[0] is None else str(row[0])


# Finished (or gone: deleted by retention) and without a record: one the release holds right now has its row,
# and is not recorded twice.
_UNRECORDED = (
    f"(f.status IS NULL OR f.status IN {FINISHED_SQL}) AND NOT EXISTS "
    "(SELECT FROM jobq.dependency_releases r WHERE r.queue_name = %(queue)s AND r.job_id = f.parent_id)"
)

EDGES_FINISHED_PARENTS = f"""
WITH page AS (
  -- A page of one queue's dependency rows, in parent order after `after`.
  SELECT parent_id FROM jobq.job_dependencies
  WHERE parent_queue = %(queue)s AND parent_id > %(after)s
  ORDER BY parent_id
  LIMIT %(limit)s
), found AS (
  -- Each parent as it is now (one lookup by primary key each); gone: deleted by retention, so finished.
  SELECT pa.parent_id, p.status
  FROM (SELECT DISTINCT parent_id FROM page) pa
  LEFT JOIN LATERAL (SELECT j.status FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.id = pa.parent_id OFFSET 0) p
    ON true
)
-- The finished (or gone) ones without a record, for RELEASES_RECORD. A read of one queue's shard
-- (job_dependencies is a reference table, on every node): one task on Citus.
SELECT (SELECT count(*) FROM page) AS seen, (SELECT max(parent_id) FROM page) AS last,
       ARRAY(SELECT f.parent_id FROM found f WHERE {_UNRECORDED} ORDER BY f.parent_id) AS ids,
       ARRAY(SELECT coalesce(f.status, 'completed') FROM found f WHERE {_UNRECORDED} ORDER BY f.parent_id) AS statuses
"""

RELEASES_RECORD = """
-- Parents finished without a record (finished by a previous release's process, or a record lost some other way),
-- as EDGES_FINISHED_PARENTS found them: recorded now. (One recorded meanwhile by the release gets a second row,
-- which is consumed like the first.)
INSERT INTO jobq.dependency_releases (queue_name, job_id, status)
SELECT %(queue)s::text, f.id, f.status FROM unnest(%(ids)s::bigint[], %(statuses)s::text[]) AS f(id, status)
RETURNING job_id
"""


async def edges_finished_parents(
    conn: psycopg.AsyncConnection[Any], queue: str, after: int, limit: int
) -> tuple[int, int | None, int]:
    """(dependency rows read, the last parent id read, outbox rows written) for one page of `queue`. Within a
    transaction: a read, then (when a parent has finished) the records."""
    cur = await conn.execute(EDGES_FINISHED_PARENTS, {"queue": queue, "after": after, "limit": limit})
    row = await cur.fetchone()
    assert row is not None
    seen, last, ids, statuses = int(row[0]), (int(row[1]) if row[1] is not None else None), row[2], row[3]
    recorded = 0
    if ids:
        cur = await conn.execute(RELEASES_RECORD, {"queue": queue, "ids": ids, "statuses": statuses})
        recorded = len(await cur.fetchall())
    return seen, last, recorded


# --- dependants enqueued from SQL ------------------------------------------------------------------------------

PARENT_EDGES = """
-- The dependency rows of dependants of one queue that an SQL enqueue just committed (migrations/0045_sql_enqueue.sql,
-- which writes them without touching the parents), each by its primary key: a dependant's depends_on names its
-- parents. `only`: one parent, after waiting for its lock. One primary-key lookup per dependant and per dependency
-- row (OFFSET 0 keeps each a lookup: a join of the id list with job_dependencies, whose key starts with the
-- parent, would read it whole). A read of the dependants' shard (job_dependencies is a reference table).
SELECT DISTINCT d.parent_id, d.parent_queue
FROM unnest(%(jobs)s::bigint[]) AS i(id)
CROSS JOIN LATERAL (
  SELECT c.id, c.depends_on FROM jobq.jobs c WHERE c.queue_name = %(queue)s AND c.id = i.id OFFSET 0
) c
CROSS JOIN LATERAL unnest(c.depends_on) AS u(parent_id)
CROSS JOIN LATERAL (
  SELECT d.parent_id, d.parent_queue FROM jobq.job_dependencies d
  WHERE d.parent_id = u.parent_id AND d.job_id = c.id AND d.parent_queue IS NOT NULL OFFSET 0
) d
WHERE %(only)s::bigint IS NULL OR d.parent_id = %(only)s::bigint
ORDER BY d.parent_id
"""

PARENTS_MARK = f"""
WITH free AS (
  -- The parents (all in `queue`) locked free now, in id order (one locked by a finishing statement is waited for
  -- alone, holding nothing: parent_wait_for). FOR NO KEY UPDATE reads the newest committed version: the status a
  -- finish that committed meanwhile wrote.
  SELECT p.id, p.status, p.has_dependants FROM jobq.jobs p
  WHERE p.queue_name = %(queue)s AND p.id = ANY(%(parents)s::bigint[])
  ORDER BY p.id
  FOR NO KEY UPDATE SKIP LOCKED
), marked AS (
  -- Marked: a finish from now on records the parent in the outbox itself (app/db/jobs.py record_finished).
  UPDATE jobq.jobs AS p SET has_dependants = true
  FROM free f WHERE p.queue_name = %(queue)s AND p.id = f.id AND NOT coalesce(f.has_dependants, false)
)
-- Each parent: busy (locked by someone else: not marked yet), or finished before it was marked (its finish recorded
-- nothing, or recorded it and was released before these rows were visible), or gone (deleted by retention, so
-- finished: as completed): the caller records those (RELEASES_RECORD) and releases them. One task on Citus.
SELECT e.id AS parent_id,
       f.id IS NULL AND EXISTS (SELECT FROM jobq.jobs x WHERE x.queue_name = %(queue)s AND x.id = e.id) AS busy,
       CASE WHEN f.status IN {FINISHED_SQL} THEN f.status
            WHEN f.id IS NULL AND NOT EXISTS (SELECT FROM jobq.jobs x WHERE x.queue_name = %(queue)s AND x.id = e.id)
            THEN 'completed' END AS finished
FROM unnest(%(parents)s::bigint[]) AS e(id)
LEFT JOIN free f ON f.id = e.id
ORDER BY e.id
"""

PARENT_WAIT_FOR = "SELECT FROM jobq.jobs WHERE queue_name = %(queue)s AND id = %(id)s FOR NO KEY UPDATE"


@dataclass(slots=True, frozen=True)
class MarkedParent:
    parent_id: int
    parent_queue: str
    busy: bool  # locked by another transaction: not marked yet
    recorded: bool  # finished: recorded in the outbox


async def parents_mark(
    conn: psycopg.AsyncConnection[Any], queue: str, jobs: Sequence[int], only: int | None = None
) -> list[MarkedParent]:
    """Within a transaction: the parents of the dependants `jobs` (of `queue`) marked and, finished ones,
    recorded; those locked by someone else reported busy, not waited for. A statement per parents' queue."""
    cur = await conn.execute(PARENT_EDGES, {"queue": queue, "jobs": sorted(jobs), "only": only})
    by_queue: dict[str, list[int]] = {}
    for parent_id, parent_queue in await cur.fetchall():
        by_queue.setdefault(str(parent_queue), []).append(int(parent_id))
    out: list[MarkedParent] = []
    for parent_queue, parents in sorted(by_queue.items()):
        cur = await conn.execute(PARENTS_MARK, {"queue": parent_queue, "parents": sorted(parents)})
        rows = await cur.fetchall()
        finished = [(int(r[0]), str(r[2])) for r in rows if r[2] is not None]
        if finished:
            ids, statuses = [f[0] for f in finished], [f[1] for f in finished]
            await conn.execute(RELEASES_RECORD, {"queue": parent_queue, "ids": ids, "statuses": statuses})
        out += [MarkedParent(int(r[0]), parent_queue, bool(r[1]), r[2] is not None) for r in rows]
    return sorted(out, key=lambda m: m.parent_id)


async def parent_wait_for(conn: psycopg.AsyncConnection[Any], queue: str, parent: int) -> None:
    """Within a transaction of its own: until whoever holds the parent's row lock lets it go."""
    await conn.execute(PARENT_WAIT_FOR, {"queue": queue, "id": parent})


# --- a step's budget ----------------------------------------------------------------------------------------------


async def set_budget(conn: psycopg.AsyncConnection[Any], ms: int) -> None:
    """Within a transaction: each of its statements is cancelled past `ms` (statement_timeout, until it ends)."""
    await conn.execute("SELECT set_config('statement_timeout', %s, true)", (str(ms),))
