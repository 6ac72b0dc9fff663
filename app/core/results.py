"""Waiting for a job's result: GET /jobs/{id}?wait_seconds=N answers as soon as the job is finished
(completed, failed or cancelled), or at the deadline with the job as it is then.

A waiting request holds no database connection: it is a future parked under its job id. The statement
that finishes a job is followed by Wakeups.jobs_finished() (app/core/wakeups.py), which wakes the
requests parked here and, over NOTIFY, those of the processes that announced a waiter on that very job.
A wake-up makes one statement read every job woken at once (JOBS_GET_WAITED), however many requests wait
for each (the jobs' queues, known since each wait began, route it: on Citus to those queues' shards only); a
job still running (a wake-up that was not for it: a re-announcement, a reconnect) leaves its
waiters parked. The fallback poll (app/maintenance/poll.py) looks at every waited job now and then, for
finishes whose wake-up was lost.

Parked requests count against JOBQ_MAX_WAITERS together with waiting claims, and against the share of
their client (JOBQ_MAX_WAITERS_PER_CLIENT) like them (WaiterCap)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from app.core.dispatcher import WaiterCap
from app.core.wakeups import Wakeups
from app.db import jobs as store
from app.db.pool import Database
from app.db.rows import FINISHED, JobRow
from app.errors import JobNotFound, Unauthorized

log = logging.getLogger("jobq.results")

# A parked request's future: the job's row once finished, None to look again itself (the job is gone, or
# the process is shutting down).
Parked = asyncio.Future[JobRow | None]


class ResultWaiters:
    def __init__(self, db: Database, wakeups: Wakeups, cap: WaiterCap) -> None:
        self.db = db
        self.wakeups = wakeups
        self.cap = cap
        self.closing = False
        self._parked: dict[int, list[Parked]] = {}  # job id -> requests waiting for it
        self._queues: dict[int, str] = {}  # job id -> its queue (a job never changes queue), while parked
        self._woken: set[int] = set()  # job ids to look at
        self._early: set[int] = set()  # woken before their first read told their queue: looked at after it
        self._reader: asyncio.Task[None] | None = None

    @property
    def parked(self) -> int:
        return sum(len(f) for f in self._parked.values())

    async def wait(
        self,
        job_id: int,
        allowed: str | None,
        wait_seconds: float,
        disconnected: Callable[[], Awaitable[Any]] | None = None,
        *,
        client: str | None = None,
        still_authorized: Callable[[], Awaitable[bool]] | None = None,
    ) -> JobRow:
        """The job once finished, or as it is after `wait_seconds`. 404 for a job the caller may not see.
        `client`: whose share of the waiting places (JOBQ_MAX_WAITERS_PER_CLIENT) the wait takes, as a
        long-poll claim's does; `still_authorized`, when given, is asked before a request that waited
        receives the job (its key may have been revoked meanwhile: 401)."""
        if wait_seconds <= 0 or self.closing:
            return await self._read(job_id, allowed)
        if not self.cap.take(client):
            # No waiting place, but none is needed to say 404, nor to answer a job already finished.
            job = await self._read(job_id, allowed)
            if job.status in FINISHED:
                return job
            raise self.cap.refusal(client)
        parked: Parked = asyncio.get_running_loop().create_future()
        self._parked.setdefault(job_id, []).append(parked)
        watch: asyncio.Future[Any] | None = None
        try:
            # Parked before the first read: a finish from now on wakes it, one before shows in the read.
            self.wakeups.job_waiter_parked(job_id)
            job = await self._read(job_id, allowed)
            if job.status in FINISHED:
                return job
            self._queues[job_id] = job.queue
            if job_id in self._early:  # a finish after that read may have woken it already
                self._early.discard(job_id)
                self.wake_jobs([job_id])
            waiters: set[asyncio.Future[Any]] = {parked}
            if disconnected is not None:
                watch = asyncio.ensure_future(disconnected())
                waiters.add(watch)
            await asyncio.wait(waiters, timeout=wait_seconds, return_when=asyncio.FIRST_COMPLETED)
            finished = parked.result() if parked.done() else None
            if finished is None and watch is not None and watch.done():
                return job  # the client went away: nobody reads the answer
            if still_authorized is not None and not await still_authorized():
                raise Unauthorized("The API key was revoked while this request waited.", invalid=True)
            if finished is not None:
                return finished
            # The deadline (or shutting down): the job as it is.
            return await self._read(job_id, allowed, job.queue)
        finally:
            if watch is not None:
                watch.cancel()
            waiting = self._parked.get(job_id)
            if waiting is not None:
                waiting.remove(parked)
                if not waiting:
                    del self._parked[job_id]
                    self._queues.pop(job_id, None)
                    self._early.discard(job_id)
            self.cap.give(client)

    async def _read(self, job_id: int, allowed: str | None, queue: str | None = None) -> JobRow:
        """The job as it is now; `queue`: its queue when known (otherwise looked up by id first)."""
        async with self.db.connection() as conn:
            job = await store.job_get(conn, job_id, allowed, queue)
        if job is None:
            raise JobNotFound()
        return job

    # -- wake-ups (app/core/wakeups.py LocalResultWaiters) ------------------------------------------------------

    def wake_jobs(self, ids: Iterable[int] | None = None) -> None:
        """These jobs may have finished (None: any waited job): look at the ones waited for here."""
        if not self._parked:
            return
        self._woken.update(self._parked if ids is None else (i for i in ids if i in self._parked))
        if self._woken and (self._reader is None or self._reader.done()):
            self._reader = asyncio.get_running_loop().create_task(self._read_woken())

    def waited_jobs(self) -> list[int]:
        return list(self._parked)

    def poll_once(self) -> None:
        """The fallback: every waited job once more (app/maintenance/poll.py)."""
        self.wake_jobs(None)

    async def _read_woken(self) -> None:
        while self._woken:
            woken, self._woken = self._woken, set()
            # A job parked whose first read has not answered yet has no queue known: looked at once it has.
            self._early.update(i for i in woken if i not in self._queues)
            ids = sorted(i for i in woken if i in self._queues)
            if not ids:
                continue
            try:
                async with self.db.connection() as conn:
                    rows = await store.jobs_get_waited(conn, ids, [self._queues[i] for i in ids])
            except Exception:
                # The waiters stay parked: the next wake-up, the fallback poll or the deadline answers them.
                log.warning("could not read %d waited job(s)", len(ids), exc_info=True)
                return
            found = {r.id: r for r in rows}
            for job_id in ids:
                row = found.get(job_id)
                if row is not None and row.status not in FINISHED:
                    continue
                for parked in self._parked.get(job_id, ()):
                    if not parked.done():
                        parked.set_result(row)

    async def drain(self) -> None:
        """Shutting down: every waiting request answers now, with its job as it is."""
        self.closing = True
        for waiting in self._parked.values():
            for parked in waiting:
                if not parked.done():
                    parked.set_result(None)
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
