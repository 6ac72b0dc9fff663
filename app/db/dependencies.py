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

Depth: a job's `dependency_depth` is 1 + the deepest of its dependencies (0 without any); an enqueue that
would make one deeper than the limit (JOBQ_MAX_DEPENDENCY_DEPTH) raises TooDeep and writes nothing. It
bounds how many levels a cancellation cascades through, one release step each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from app.db.jobs import JOB_COLUMNS, NewJob, as_json, count_finished, jobs_insert
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


JOB_LOCK_PARENTS = f"""
-- The parents of jobs being enqueued, locked until this enqueue commits (see the module docstring), those
-- free now only: a parent locked by another transaction is reported (locked = false), not waited for;
-- the enqueue then waits for it holding nothing (jobs_insert_dependent). Waiting while holding some
-- would deadlock with a statement finishing jobs, which locks the jobs it finishes before their
-- dependants: holding a waiting parent (a dependant there) and waiting for one that statement finishes
-- is a cycle; so is holding the parents named by id and waiting for one named by an item's key.
-- A job outside the caller's queues is not returned, exactly like a missing one. FOR UPDATE reads the
-- newest committed version, so RETURNING shows the status a statement that finished the job committed.
WITH free AS (
  SELECT j.id FROM jobq.jobs j
  WHERE j.id = ANY(%(ids)s::bigint[]) AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  ORDER BY j.id
  FOR UPDATE SKIP LOCKED
), marked AS (
  UPDATE jobq.jobs AS j SET has_dependants = true
  FROM free WHERE j.id = ANY(ARRAY(SELECT id FROM free)) AND j.id = free.id
  RETURNING j.id, j.status, j.queue_name, j.dependency_depth
)
SELECT id, status, true AS locked, queue_name, coalesce(dependency_depth, 0) AS depth FROM marked
UNION ALL
SELECT j.id, j.status, false, j.queue_name, coalesce(j.dependency_depth, 0) FROM jobq.jobs j
WHERE j.id = ANY(%(ids)s::bigint[]) AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  AND j.id <> ALL(ARRAY(SELECT id FROM free))
"""

JOB_WAIT_FOR = "SELECT FROM jobq.jobs WHERE id = %(id)s FOR UPDATE"


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

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} is locked")
        self.job_id = job_id


async def _lock_parents(
    conn: psycopg.AsyncConnection[Any], ids: Sequence[int], allowed: str | None
) -> dict[int, Found]:
    """Lock the parents `ids` (those the caller may use) and return them as locked, by id; raises _Busy,
    without waiting, when one of them is locked by another transaction."""
    cur = await conn.execute(JOB_LOCK_PARENTS, {"ids": sorted(ids), "allowed": allowed})
    rows = await cur.fetchall()
    if (busy := min((int(r[0]) for r in rows if not r[2]), default=None)) is not None:
        raise _Busy(busy)
    return {int(r[0]): Found(str(r[1]), str(r[3]), int(r[4])) for r in rows}


JOB_SETTLE = f"""
WITH input AS (
  SELECT * FROM json_to_recordset(%(items)s::json)
    AS t(id bigint, status text, pending int, depends_on bigint[], policy text, error text, mark boolean,
         depth int)
), settled AS (
  -- The jobs this transaction inserted a moment ago (invisible to everyone else until it commits): each
  -- dependant's status and dependencies, and `mark` on those that have a dependant in the same batch.
  UPDATE jobq.jobs AS j
  SET status = coalesce(i.status, j.status),
      pending_dependencies = CASE WHEN i.status IS NULL THEN j.pending_dependencies ELSE i.pending END,
      depends_on = CASE WHEN i.status IS NULL THEN j.depends_on ELSE i.depends_on END,
      on_dependency_failure = CASE WHEN i.status IS NULL THEN j.on_dependency_failure ELSE i.policy END,
      finished_at = CASE WHEN i.status = 'cancelled' THEN clock_timestamp() ELSE j.finished_at END,
      last_error = coalesce(i.error, j.last_error),
      has_dependants = CASE WHEN i.mark THEN true ELSE j.has_dependants END,
      dependency_depth = CASE WHEN i.status IS NULL THEN j.dependency_depth ELSE i.depth END
  FROM input i
  WHERE j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id
  RETURNING {JOB_COLUMNS}
), counted AS ({count_finished("settled")}
), edges AS (
  -- With the queue of each end: the release reaches them queue by queue (app/db/releases.py).
  INSERT INTO jobq.job_dependencies (parent_id, job_id, parent_queue, job_queue)
  SELECT parent_id, job_id, parent_queue, job_queue
  FROM json_to_recordset(%(edges)s::json) AS e(parent_id bigint, job_id bigint, parent_queue text, job_queue text)
  ORDER BY parent_id, job_id
  ON CONFLICT DO NOTHING
)
SELECT * FROM settled
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
                await conn.execute(JOB_WAIT_FOR, {"id": busy.job_id})  # until its holder commits
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
        named = {p.job_id for ps in parents for p in ps if p.job_id is not None}
        found = await _lock_parents(conn, list(named), allowed) if named else {}
        if missing := sorted(named - found.keys()):
            raise UnknownJobs(missing)
        inserted = await jobs_insert(conn, jobs)
        # Items that are existing jobs (idempotency key) and that later items depend on: lock them too (not
        # those made by this very batch, when two items carry one key).
        made = {i.job.id for i in inserted if i.created}
        reused = {inserted[p.item].job.id for ps in parents for p in ps if p.item is not None} - made
        if reused:
            found |= await _lock_parents(conn, list(reused), None)
        items, edges = _settle(inserted, parents, policies, found, max_depth)  # TooDeep: all rolled back
        if not items:
            return inserted
        cur = conn.cursor(row_factory=rows_of(JobRow))
        await cur.execute(JOB_SETTLE, {"items": as_json(items), "edges": as_json(edges)})
        settled = {r.id: r for r in await cur.fetchall()}
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
