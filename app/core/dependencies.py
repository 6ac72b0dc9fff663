"""The dependency release: what the jobs waiting for a job do once it has finished, done by the service in
bounded steps (the statements and their guarantees: app/db/releases.py).

When: every write path that finishes jobs (complete, fail, cancel, bulk cancel) hands the jobs it finished
to `after_finish()` once its statement has committed. Those that have dependants are released right away,
before the request answers, within one batch (JOBQ_DEPENDENCY_BATCH_SIZE dependency rows in all) and
INLINE_LEVELS levels of a cancellation cascade: their dependants are `pending` or cancelled when the answer
arrives, so that an ordinary workflow looks as it always has. Whatever is left (a wider fan-out, a deeper
cascade) is the background service's (app/maintenance/releaser.py), which `after_finish()` pokes; so do the
paths that finish jobs in bulk in the background (the lease rescuer, an SQS purge).

A step (`step()`) is one transaction on one queue's outbox rows, of at most `batch` dependency rows (one
level of a cascade: its commit makes the level's work durable, so a dependant locked by someone else holds
up only the step that waits for it), each statement under JOBQ_MAINTENANCE_STATEMENT_TIMEOUT_MS. After each
commit the moves go through app/core/effects.py (path DEPENDENCY): claims parked on a released job's
queue and requests waiting for a cancelled job's result are woken here and, through app/core/wakeups.py, in
the other processes; nothing is sent from inside a statement."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.effects import CANCELLED, PENDING, WAITING, Effects, Moves, Path
from app.db import releases as store
from app.db.pool import Database
from app.db.rows import FINISHED, JobRow, Status
from app.settings import Settings

log = logging.getLogger("jobq.dependencies")

# Levels of a cancellation the request that finished the job follows before it answers (within one batch of
# rows in all): a workflow of ordinary depth looks as it always has; a deeper one goes on in the background.
INLINE_LEVELS = 4


@dataclass(slots=True)
class Step:
    """What one step did, and whether it stopped with work left on its queue."""

    released: int = 0
    cancelled: int = 0
    edges: int = 0
    more: bool = False
    parents: dict[str, list[int]] = field(default_factory=dict)  # cancelled here, with dependants of their own


@dataclass(slots=True)
class _Dependant:
    queue: str
    n: int = 0
    bad: tuple[int, str] | None = None


@dataclass(slots=True)
class _Level:
    """One level's work within a step: outbox rows done, and what the dependants did."""

    done: list[int] = field(default_factory=list)
    edges: int = 0
    exhausted: bool = True


# Dependants of SQL enqueues marked per statement, and the most waiting to be marked in a process.
MARK_CHUNK = 1_000
MARK_PENDING_MAX = 100_000


class DependencyRelease:
    """Built once per process; `backlog` is the background service's poke (set when it is built)."""

    def __init__(self, settings: Settings, db: Database, effects: Effects) -> None:
        self.db = db
        self.effects = effects
        self.batch = settings.dependency_batch_size
        self.budget_ms = settings.maintenance_statement_timeout_ms
        self.backlog: Callable[[], None] = lambda: None
        # Dependants named by SQL enqueues' messages, by queue, marked by one task at a time (messages merge):
        # bounded, so that no flood of messages (anyone who may connect may NOTIFY) makes unbounded work here.
        self._to_mark: dict[str, set[int]] = {}
        self._to_mark_count = 0
        self._marker: asyncio.Task[None] | None = None
        effects.wakeups.dependants_enqueued = self.enqueued

    # -- dependants an SQL enqueue committed -------------------------------------------------------------------

    def enqueued(self, queue: str, jobs: list[int]) -> None:
        """The message of an SQL enqueue that committed dependants (migrations/0045_sql_enqueue.sql): their
        parents are marked and, finished ones, released, in the background of this process (every process
        does it; it is idempotent). Past MARK_PENDING_MAX ids waiting here, more are left to the reconciliation."""
        pending = self._to_mark.setdefault(queue, set())
        for job in jobs:
            if self._to_mark_count >= MARK_PENDING_MAX:
                log.warning("dependants of SQL enqueues in %r left to the reconciliation (too many waiting)", queue)
                break
            if job not in pending:
                pending.add(job)
                self._to_mark_count += 1
        if self._marker is None or self._marker.done():
            self._marker = asyncio.get_running_loop().create_task(self._mark_pending())

    async def _mark_pending(self) -> None:
        while self._to_mark:
            queue, ids = self._to_mark.popitem()
            self._to_mark_count -= len(ids)
            ordered = sorted(ids)
            for start in range(0, len(ordered), MARK_CHUNK):
                await self.mark_parents(queue, ordered[start : start + MARK_CHUNK])

    async def mark_parents(self, queue: str, jobs: Sequence[int]) -> None:
        """The SQL path writes a dependant and its dependency rows without touching its parents (no lock on
        them for the caller's transaction); here, right after its commit, each parent is marked has_dependants
        in a short transaction, so that its finish records it, and one that finished before that (its finish
        recorded nothing) is recorded here and released at once. A parent locked by a finishing statement is
        waited for alone, holding nothing (as app/db/dependencies.py does). Never raises: what fails here
        (and a message never received) is the periodic reconciliation's (JOBQ_DEPENDENCY_RECONCILE_SECONDS)."""
        try:
            async with self.db.connection() as conn:
                async with conn.transaction():
                    await store.set_budget(conn, self.budget_ms)
                    marked = await store.parents_mark(conn, queue, jobs)
                for parent, parent_queue in [(m.parent_id, m.parent_queue) for m in marked if m.busy]:
                    async with conn.transaction():
                        await store.set_budget(conn, self.budget_ms)
                        await store.parent_wait_for(conn, parent_queue, parent)  # until the finish holding it commits
                    async with conn.transaction():
                        await store.set_budget(conn, self.budget_ms)
                        again = await store.parents_mark(conn, queue, jobs, only=parent)
                    if any(m.busy for m in again):
                        log.warning("parent %d of dependants in %r locked again; left to the reconciliation",
                                    parent, queue)  # fmt: skip
                    marked += again
        except Exception:
            log.warning("parents of %d dependant(s) in %r left to the reconciliation", len(jobs), queue,
                        exc_info=True)  # fmt: skip
            return
        frontier: dict[str, list[int]] = {}
        for m in marked:
            if m.recorded:
                frontier.setdefault(m.parent_queue, []).append(m.parent_id)
        await self._release(frontier)

    async def after_finish(self, jobs: Iterable[JobRow | None]) -> None:
        """Jobs a write path just finished (its statement committed): the direct dependants of those that
        have any, released or cancelled now (one step per queue); the rest left to the background. Never
        raises: the finish has committed, and its outbox rows let the background do whatever fails here."""
        frontier: dict[str, list[int]] = {}
        for job in jobs:
            if job is not None and job.has_dependants and job.status in FINISHED:
                frontier.setdefault(job.queue, []).append(job.id)
        await self._release(frontier)

    async def _release(self, frontier: dict[str, list[int]]) -> None:
        """The first steps for finished jobs recorded in the outbox (by queue); the rest to the background."""
        more = False
        edges = 0
        for _ in range(INLINE_LEVELS):
            if not frontier or edges >= self.batch:
                break
            below: dict[str, list[int]] = {}
            for queue, ids in sorted(frontier.items()):
                try:
                    step = await self.step(queue, ids, levels=1, room=max(self.batch - edges, 1))
                except Exception:
                    log.warning("dependency release of %d job(s) in %r left to the background", len(ids), queue,
                                exc_info=True)  # fmt: skip
                    more = True
                    continue
                edges += step.edges
                more |= step.more
                for q, cancelled in step.parents.items():
                    below.setdefault(q, []).extend(cancelled)
            frontier = below
        if more or frontier:
            self.backlog()

    async def step(
        self, queue: str, jobs: Sequence[int] | None = None, levels: int = 1, room: int | None = None
    ) -> Step:
        """One transaction on `queue`'s outbox rows (those of `jobs`, or any): at most `room` (by default
        `batch`) dependency rows consumed, following cancelled dependants of this queue `levels` levels
        down. `more`: work may be left on this queue (the rows ran out, or a level below was not
        followed); `parents`: the dependants it cancelled that have dependants of their own."""
        out = Step()
        room = self.batch if room is None else room
        moves = Moves(Path.DEPENDENCY)
        deadline = time.monotonic() + self.budget_ms / 1000 / 2
        async with self.db.connection() as conn, conn.transaction():
            await store.set_budget(conn, self.budget_ms)
            level = 0
            while True:
                # The first level always runs (a slow connection or a busy machine must not make a request
                # answer with nothing released); the deadline bounds the levels after it.
                if level >= levels or out.edges >= room or (level > 0 and time.monotonic() > deadline):
                    out.more = level < levels or out.edges >= room
                    break
                claimed = await store.releases_claim(conn, queue, jobs if level == 0 else None, self.batch)
                if not claimed:
                    break
                level += 1
                done = await self._level(conn, queue, claimed, room - out.edges, moves, out)
                if not done.exhausted:
                    out.more = True
                    break
        self.effects.apply(moves)
        return out

    async def _level(
        self, conn: Any, queue: str, claimed: list[store.Release], room: int, moves: Moves, out: Step
    ) -> _Level:
        level = _Level()
        now = claimed[0].now
        finished: dict[int, str] = {}
        for r in claimed:
            if r.status is None:  # gone: deleted by retention, so it had finished, as recorded
                finished[r.job_id] = r.recorded
            elif r.status in FINISHED:
                finished[r.job_id] = r.status
            # else retried since it finished: its rows wait for its next finish, which records it again
        edges = await store.edges_take(conn, queue, list(finished), room) if finished else []
        out.edges += len(edges)
        last = edges[-1].parent_id if len(edges) >= room else None  # its rows may go on past the batch
        level.exhausted = last is None
        level.done = [r.id for r in claimed if r.job_id not in finished or last is None or r.job_id < last]
        # Per dependant: how many of its dependencies finished here, and the first that did not complete.
        dependants: dict[int, _Dependant] = {}
        for e in edges:
            d = dependants.setdefault(e.job_id, _Dependant(e.job_queue))
            d.n += 1
            st = finished[e.parent_id]
            if st != Status.completed and d.bad is None:
                d.bad = (e.parent_id, st)
        # Locked in id order across queues: one statement per run of consecutive ids in one queue.
        run: list[dict[str, Any]] = []
        run_queue = ""
        for job_id in sorted(dependants):
            d = dependants[job_id]
            if run and d.queue != run_queue:
                await self._settle(conn, run_queue, run, now, moves, out)
                run = []
            run_queue = d.queue
            bad_id, bad_status = d.bad if d.bad else (None, None)
            run.append({"id": job_id, "n": d.n, "bad_id": bad_id, "bad_status": bad_status})
        if run:
            await self._settle(conn, run_queue, run, now, moves, out)
        await store.releases_done(conn, queue, level.done)
        return level

    async def _settle(
        self, conn: Any, queue: str, items: list[dict[str, Any]], now: Any, moves: Moves, out: Step
    ) -> None:
        changed = await store.dependants_settle(conn, queue, items, now)
        released = [s.id for s in changed if s.status == PENDING]
        cancelled = [s.id for s in changed if s.status == CANCELLED]
        out.parents.setdefault(queue, []).extend(s.id for s in changed if s.status == CANCELLED and s.has_dependants)
        if released:
            moves.add_jobs(queue, WAITING, PENDING, released)
            out.released += len(released)
        if cancelled:
            moves.add_jobs(queue, WAITING, CANCELLED, cancelled)
            out.cancelled += len(cancelled)

    # -- what the background service runs ---------------------------------------------------------------------

    async def queues_with_work(self, after: str, limit: int) -> list[str]:
        async with self.db.connection() as conn:
            return await store.release_queues(conn, after, limit)

    async def reconcile_queue(self, queue: str, after: int) -> tuple[int, int | None, int]:
        """One page of `queue`'s dependency rows looked at: finished parents without a record recorded."""
        async with self.db.connection() as conn, conn.transaction():
            await store.set_budget(conn, self.budget_ms)
            return await store.edges_finished_parents(conn, queue, after, self.batch)

    async def next_parent_queue(self, after: str) -> str | None:
        async with self.db.connection() as conn:
            return await store.edges_next_queue(conn, after)

    async def fill_legacy(self) -> int:
        """One batch of dependency rows a previous release wrote given their queue names."""
        async with self.db.connection() as conn, conn.transaction():
            await store.set_budget(conn, self.budget_ms)
            return await store.edges_fill_queues(conn, self.batch)
