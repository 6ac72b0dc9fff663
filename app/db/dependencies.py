"""Dependencies between jobs: the enqueue of jobs that run after others (`depends_on`), in one transaction
of a few statements. Jobs without dependencies never come here: their enqueue is the plain insert alone
(app/db/jobs.py jobs_insert).

The life of a dependant:
  * enqueued `waiting` with `pending_dependencies` = its parents not finished yet, one job_dependencies row
    (parent, dependant) for each; `pending` at once when every parent has completed already; `cancelled`
    at once when a parent has failed or was cancelled (unless on_dependency_failure = 'run', which counts
    such a parent as done);
  * released when its parents finish: the statement that finishes a parent records it in the outbox
    (app/db/jobs.py record_finished), and the release (app/db/releases.py, run by app/core/dependencies.py
    right after that statement and in the background) consumes the parent's rows, counts the dependant
    down, makes it `pending` at zero, or cancels it (and, a step later, that job's own dependants) when the
    parent did not complete.

The race this module must win: a dependant enqueued while a statement finishes its parent. The enqueue
first UPDATEs the parents (has_dependants = true): that row lock orders it with any finishing UPDATE of the
same row. If the enqueue locks first, the finishing statement waits until the enqueue commits, then updates
the row as the enqueue left it: has_dependants is set, so it records the parent in the outbox, and the
release, a later transaction, finds the new job_dependencies rows. If the finish locks first, the enqueue
waits (holding no parent: JOB_LOCK_PARENTS), then locks and reads the status the finish committed, and
counts that parent as done (or failed). Either way no dependant waits for a parent that has already
finished.

On Citus the enqueue first takes the lock by which Citus serialises writes to job_dependencies (a reference
table), before any job's row lock, as the release does (app/db/releases.py, lock order): an enqueue holding a
parent while it waited for that lock at JOB_EDGES_ADD made a cycle with a release holding it while it waited
for that parent, one of its dependants.

Depth: a job's `dependency_depth` is 1 + the deepest of its dependencies (0 without any); an enqueue that
would make one deeper than the limit (JOBQ_MAX_DEPENDENCY_DEPTH) raises TooDeep and writes nothing. It
bounds how many levels a cancellation cascades through, one release step each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from app.db import finishing
from app.db.jobs import JOB_COLUMNS, NewJob, as_json, jobs_insert
from app.db.rows import FINISHED, Inserted, JobRow, Status, rows_of
from app.db.scope import queue_allowed


@dataclass(slots=True, frozen=True)
class Parent:
    """One dependency of a job being enqueued: an existing job, or an earlier item of the same batch."""

    job_id: int | None = None
    item: int | None = None


class UnknownJobs(Exception):
    """Some parents named by id do not exist, or not in a queue the caller may use."""

    def __init__(self, ids: Sequence[int]) -> None:
        super().__init__(f"no such jobs: {list(ids)}")
        self.ids = list(ids)


_ALLOWED = queue_allowed("j.queue_name", "%(allowed)s::text")

JOB_LOCK_PARENTS = f"""
-- The parents in one queue of jobs being enqueued, locked until this enqueue commits (see the module docstring),
-- those free now only: a parent locked by another transaction is reported (locked = false), not waited for;
-- the enqueue then waits for it holding nothing (jobs_insert_dependent). Waiting while holding some
-- would deadlock with a statement finishing jobs, which locks the jobs it finishes before their
-- dependants: holding a waiting parent (a dependant there) and waiting for one that statement finishes
-- is a cycle; so is holding the parents named by id and waiting for one named by an item's key.
-- A job outside the caller's queues is not returned, exactly like a missing one. FOR UPDATE reads the
-- newest committed version, so RETURNING shows the status a statement that finished the job committed.
-- One queue per statement (on Citus a router query on its shard): the parents in other queues are found by
-- JOB_PARENT_QUEUES and locked by a statement per queue.
WITH free AS (
  SELECT j.id FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[]) AND {_ALLOWED}
  ORDER BY j.id
  FOR UPDATE SKIP LOCKED
), marked AS (
  UPDATE jobq.jobs AS j SET has_dependants = true
  FROM free WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM free)) AND j.id = free.id
  RETURNING j.id, j.status, j.queue_name, j.dependency_depth
)
SELECT id, status, true AS locked, queue_name, coalesce(dependency_depth, 0) AS depth FROM marked
UNION ALL
SELECT j.id, j.status, false, j.queue_name, coalesce(j.dependency_depth, 0) FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[]) AND {_ALLOWED}
  AND j.id <> ALL(ARRAY(SELECT id FROM free))
"""

JOB_PARENT_QUEUES = f"""
-- The queues of parents named by id that are not in the queue of the jobs being enqueued (the lock found them
-- not there): one lookup by primary key each; on Citus a read of every shard, once per such enqueue. A job
-- outside the caller's queues is not returned, exactly like a missing one.
SELECT j.id, j.queue_name FROM jobq.jobs j
WHERE j.id = ANY(%(ids)s::bigint[]) AND {_ALLOWED}
"""

JOB_WAIT_FOR = "SELECT FROM jobq.jobs WHERE queue_name = %(queue)s AND id = %(id)s FOR UPDATE"


class TooDeep(Exception):
    """An item of the enqueue would be deeper than the limit (`item`: its index; `depth`: its depth)."""

    def __init__(self, item: int, depth: int, limit: int) -> None:
        super().__init__(f"item {item} would be {depth} dependencies deep (at most {limit})")
        self.item = item
        self.depth = depth
        self.limit = limit


@dataclass(slots=True, frozen=True)
class Found:
    """A parent named by id, as locked: its status, queue and depth."""

    status: str
    queue: str
    depth: int


class _Busy(Exception):
    """A parent is locked by another transaction: the enqueue gives back everything and waits for it."""

    def __init__(self, job_id: int, queue: str) -> None:
        super().__init__(f"job {job_id} is locked")
        self.job_id = job_id
        self.queue = queue


async def _lock_parents(
    conn: psycopg.AsyncConnection[Any], ids: Sequence[int], allowed: str | None, home: dict[int, str] | str
) -> dict[int, Found]:
    """Lock the parents `ids` (those the caller may use) and return them as locked, by id; raises _Busy,
    without waiting, when one of them is locked by another transaction. `home`: the queue each is in (a job
    of this batch), or the queue to look in first (the enqueue's own); those not found there are looked up by
    id (JOB_PARENT_QUEUES) and locked queue by queue."""
    by_queue: dict[str, list[int]] = {}
    if isinstance(home, str):
        by_queue[home] = sorted(ids)
    else:
        for i in ids:
            by_queue.setdefault(home[i], []).append(i)
    rows: list[Any] = []
    for queue, of_queue in sorted(by_queue.items()):
        cur = await conn.execute(JOB_LOCK_PARENTS, {"queue": queue, "ids": sorted(of_queue), "allowed": allowed})
        rows += await cur.fetchall()
    if isinstance(home, str) and (elsewhere := sorted(set(ids) - {int(r[0]) for r in rows})):
        cur = await conn.execute(JOB_PARENT_QUEUES, {"ids": elsewhere, "allowed": allowed})
        others: dict[str, list[int]] = {}
        for job_id, queue in await cur.fetchall():
            if queue != home:  # in the home queue but not visible to the lock: gone meanwhile
                others.setdefault(str(queue), []).append(int(job_id))
        for queue, of_queue in sorted(others.items()):
            cur = await conn.execute(JOB_LOCK_PARENTS, {"queue": queue, "ids": sorted(of_queue), "allowed": allowed})
            rows += await cur.fetchall()
    busy = min(((int(r[0]), str(r[3])) for r in rows if not r[2]), default=None)
    if busy is not None:
        raise _Busy(*busy)
    return {int(r[0]): Found(str(r[1]), str(r[3]), int(r[4])) for r in rows}


JOB_SETTLE = f"""
WITH input AS (
  SELECT * FROM json_to_recordset(%(items)s::json)
    AS t(id bigint, status text, pending int, depends_on bigint[], policy text, error text, mark boolean,
         depth int)
), stamp AS (
  -- The database's clock, read here: on Citus an UPDATE may not call a VOLATILE function.
  SELECT clock_timestamp() AS now
), settled AS (
  -- The jobs of one queue this transaction inserted a moment ago (invisible to everyone else until it commits):
  -- each dependant's status and dependencies, and `mark` on those that have a dependant in the same batch.
  UPDATE jobq.jobs AS j
  SET status = coalesce(i.status, j.status),
      pending_dependencies = CASE WHEN i.status IS NULL THEN j.pending_dependencies ELSE i.pending END,
      depends_on = CASE WHEN i.status IS NULL THEN j.depends_on ELSE i.depends_on END,
      on_dependency_failure = CASE WHEN i.status IS NULL THEN j.on_dependency_failure ELSE i.policy END,
      finished_at = CASE WHEN i.status = 'cancelled' THEN st.now ELSE j.finished_at END,
      last_error = coalesce(i.error, j.last_error),
      has_dependants = CASE WHEN i.mark THEN true ELSE j.has_dependants END,
      dependency_depth = CASE WHEN i.status IS NULL THEN j.dependency_depth ELSE i.depth END
  FROM input i, stamp st
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id
  -- The answer's columns are computed below: Citus allows no STABLE function in RETURNING.
  RETURNING j.*, j.queue_name AS queue
)
-- The dependency rows (JOB_EDGES_ADD) and the count of jobs cancelled here (a parent had already failed) follow
-- as statements of their own: INSERTs in CTEs would make Citus split this one, which stays on one shard.
SELECT {JOB_COLUMNS} FROM settled j
"""

JOB_EDGES_ADD = """
-- A batch's dependency rows, with the queue of each end: the release reaches them queue by queue
-- (app/db/releases.py). On Citus job_dependencies is a reference table: written on every node.
INSERT INTO jobq.job_dependencies (parent_id, job_id, parent_queue, job_queue)
SELECT parent_id, job_id, parent_queue, job_queue
FROM json_to_recordset(%(edges)s::json) AS e(parent_id bigint, job_id bigint, parent_queue text, job_queue text)
ORDER BY parent_id, job_id
ON CONFLICT DO NOTHING
"""


async def jobs_insert_dependent(
    conn: psycopg.AsyncConnection[Any],
    jobs: Sequence[NewJob],
    parents: Sequence[Sequence[Parent]],
    policies: Sequence[str | None],
    allowed: str | None,
    max_depth: int = 1_000_000,
) -> list[Inserted]:
    """Insert jobs, some with dependencies (`parents[i]` of `jobs[i]`, items naming earlier items only), in
    one transaction; one Inserted per input. An item whose idempotency key already names a job returns that
    job unchanged: its dependencies are not touched. Raises UnknownJobs (and inserts nothing) when a parent
    id is not a job in the caller's queues (`allowed`), TooDeep (likewise) when a new job would be deeper
    than `max_depth`.

    A parent locked by another transaction is waited for holding nothing (JOB_LOCK_PARENTS tells why): the
    attempt is rolled back, the wait takes that parent's lock alone and lets it go, and the enqueue starts
    again."""
    while True:
        try:
            return await _insert_dependent(conn, jobs, parents, policies, allowed, max_depth)
        except _Busy as busy:
            async with conn.transaction():
                await conn.execute(JOB_WAIT_FOR, {"queue": busy.queue, "id": busy.job_id})  # until its holder commits
                raise psycopg.Rollback() from None


async def _insert_dependent(
    conn: psycopg.AsyncConnection[Any],
    jobs: Sequence[NewJob],
    parents: Sequence[Sequence[Parent]],
    policies: Sequence[str | None],
    allowed: str | None,
    max_depth: int,
) -> list[Inserted]:
    async with conn.transaction():
        if finishing.on_citus(conn):
            # On Citus first of all, before any job's row lock: the lock on job_dependencies that JOB_EDGES_ADD takes
            # (a reference table: Citus serialises its writers by a lock on its one shard, until commit; the
            # release's EDGES_TAKE holds it in a mode that excludes ours). Taken at JOB_EDGES_ADD only, it was
            # waited for while this enqueue held its parents: a release holding it and waiting for one of them
            # (a dependant it counts down) made a cycle across nodes, which Citus's deadlock detection breaks by
            # cancelling one side. The same statement with no rows takes the same lock (not one that excludes other
            # enqueues). Plain PostgreSQL locks the dependency rows one by one: nothing to take there.
            await conn.execute(JOB_EDGES_ADD, {"edges": as_json([])})
        named = {p.job_id for ps in parents for p in ps if p.job_id is not None}
        found = await _lock_parents(conn, list(named), allowed, jobs[0].queue) if named else {}
        if missing := sorted(named - found.keys()):
            raise UnknownJobs(missing)
        inserted = await jobs_insert(conn, jobs)
        # Items that are existing jobs (idempotency key) and that later items depend on: lock them too (not
        # those made by this very batch, when two items carry one key).
        made = {i.job.id for i in inserted if i.created}
        reused = {inserted[p.item].job.id for ps in parents for p in ps if p.item is not None} - made
        if reused:
            home = {i.job.id: i.job.queue for i in inserted}
            found |= await _lock_parents(conn, list(reused), None, home)
        items, edges = _settle(inserted, parents, policies, found, max_depth)  # TooDeep: all rolled back
        if not items:
            return inserted
        cur = conn.cursor(row_factory=rows_of(JobRow))
        queue_of = {i.job.id: i.job.queue for i in inserted}
        by_queue: dict[str, list[dict[str, Any]]] = {}
        for item in items:
            by_queue.setdefault(queue_of[item["id"]], []).append(item)
        settled: dict[int, JobRow] = {}
        for queue, of_queue in sorted(by_queue.items()):  # one statement per queue (one, in practice)
            await cur.execute(JOB_SETTLE, {"queue": queue, "items": as_json(of_queue)})
            rows = await cur.fetchall()
            settled |= {r.id: r for r in rows}
            await finishing.counts_add(conn, queue, "cancelled", sum(r.status == Status.cancelled for r in rows))
        if edges:
            await conn.execute(JOB_EDGES_ADD, {"edges": as_json(edges)})
    return [Inserted(i.created, settled.get(i.job.id, i.job)) for i in inserted]


def _settle(
    inserted: Sequence[Inserted],
    parents: Sequence[Sequence[Parent]],
    policies: Sequence[str | None],
    found: dict[int, Found],
    max_depth: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each new dependant's status from its parents' (existing ones as locked, earlier items of the batch as
    decided here, in order); returns the JOB_SETTLE items and the job_dependencies rows. Raises TooDeep
    when a new job would be deeper than `max_depth`."""
    status: dict[int, str] = {}  # job id -> its status after this enqueue (jobs created here)
    depth: dict[int, int] = {}  # job id -> its depth (jobs created here)
    queue: dict[int, str] = {i.job.id: i.job.queue for i in inserted}
    items: dict[int, dict[str, Any]] = {}  # job id -> JOB_SETTLE item
    edges: list[dict[str, Any]] = []
    for n, (ins, ps, policy) in enumerate(zip(inserted, parents, policies, strict=True)):
        if not ins.created:
            continue
        status[ins.job.id] = ins.job.status
        depth[ins.job.id] = 0
        if not ps:
            continue
        ids: list[int] = []
        unfinished: list[int] = []
        bad: tuple[int, str] | None = None
        for p in ps:
            pid = inserted[p.item].job.id if p.item is not None else p.job_id
            assert pid is not None
            if pid in ids:
                continue
            ids.append(pid)
            # A job made here (also when an earlier item's key named it again) as decided here; others as
            # locked (one gone since the insert found it was finished: retention deletes nothing else).
            known = found.get(pid)
            st = status.get(pid, known.status if known else Status.completed)
            depth[ins.job.id] = max(depth[ins.job.id], 1 + (depth.get(pid, known.depth if known else 0)))
            if st == Status.completed:
                continue
            if st in FINISHED:
                bad = bad or (pid, st)
                continue
            unfinished.append(pid)
        if depth[ins.job.id] > max_depth:
            raise TooDeep(n, depth[ins.job.id], max_depth)
        item: dict[str, Any] = {
            "id": ins.job.id,
            "depends_on": ids,
            "policy": policy,
            "pending": len(unfinished),
            "depth": depth[ins.job.id],
        }
        if bad is not None and policy != "run":
            item |= {"status": Status.cancelled, "error": f"dependency {bad[0]} {bad[1]}"}
        elif unfinished:
            item["status"] = Status.waiting
            for pid in unfinished:
                home = queue[pid] if pid in queue else found[pid].queue
                edges.append({"parent_id": pid, "job_id": ins.job.id, "parent_queue": home, "job_queue": ins.job.queue})
                if pid in status:  # made here: not marked by the lock
                    items.setdefault(pid, {"id": pid})["mark"] = True
        else:
            item["status"] = Status.pending
        items[ins.job.id] = items.get(ins.job.id, {}) | item
        status[ins.job.id] = item["status"]
    return list(items.values()), edges
