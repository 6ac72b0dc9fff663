"""The worker registry: what this process's claims, heartbeats, completes and fails saw of each worker,
gathered in memory and written about once a second by app/maintenance/workers.py (one statement per process,
never one per request), and the reads behind GET /workers and GET /workers/{name}.

A worker is named by the `worker` of its claims (the SDKs send `<host>-<pid>`, the same for every claim of a
process). Its SDK and version come from the User-Agent's first product (`jobq-client-python/1.2.0`), its
host from a `host=` comment in the User-Agent (`jobq-client-python/1.2.0 (host=web-1)`), else from the
address the request came from."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.db import workers as store_workers
from app.db.replica import Conn, Reads
from app.db.spread import is_key, logical
from app.db.workers import HeldJob, WorkerRow
from app.errors import WorkerNotFound
from app.settings import Settings

_PRODUCT = re.compile(r"^\s*([A-Za-z0-9._-]{1,64})/([A-Za-z0-9._+-]{1,64})")
_HOST = re.compile(r"\bhost=([A-Za-z0-9._:-]{1,255})")
MAX_TRACKED = 100_000  # workers and queues remembered between two flushes; past it, new ones wait for the next


@dataclass(slots=True, frozen=True)
class Agent:
    """What a request tells of the program that sent it."""

    sdk: str | None = None
    version: str | None = None
    host: str | None = None


def agent_of(user_agent: str | None, address: str | None) -> Agent:
    sdk = version = host = None
    if user_agent:
        if m := _PRODUCT.match(user_agent):
            sdk, version = m.group(1), m.group(2)
        if m := _HOST.search(user_agent):
            host = m.group(1)
    return Agent(sdk, version, host or address)


@dataclass(slots=True)
class _Seen:
    agent: Agent | None = None
    seen: bool = False
    completed: int = 0
    failed: int = 0


@dataclass(slots=True)
class WorkerActivity:
    """This process's sightings since the last flush, by (worker, queue)."""

    _pending: dict[tuple[str, str], _Seen] = field(default_factory=dict)

    def _entry(self, worker: str, queue: str) -> _Seen | None:
        # A worker of a spread queue works the queue, whichever key a job of it was under (app/db/spread.py).
        key = (worker, logical(queue))
        entry = self._pending.get(key)
        if entry is None:
            if len(self._pending) >= MAX_TRACKED:
                return None
            entry = self._pending[key] = _Seen()
        return entry

    def seen(self, worker: str, queue: str, agent: Agent | None = None) -> None:
        """A request of this worker on this queue (a claim, a heartbeat)."""
        entry = self._entry(worker, queue)
        if entry is not None:
            entry.seen = True
            if agent is not None:
                entry.agent = agent

    def finished(self, worker: str | None, queue: str, *, completed: int = 0, failed: int = 0) -> None:
        """Jobs of this worker's claims completed or failed (by the worker itself, or timed out)."""
        if worker is None:
            return
        entry = self._entry(worker, queue)
        if entry is not None:
            entry.seen = entry.seen or completed > 0 or failed > 0
            entry.completed += completed
            entry.failed += failed

    def take(self) -> list[dict[str, Any]]:
        """The rows of the next flush; they are forgotten here (put them back with `restore` if it fails)."""
        pending, self._pending = self._pending, {}
        return [
            {
                "name": worker,
                "queue": queue,
                "sdk": s.agent.sdk if s.agent else None,
                "version": s.agent.version if s.agent else None,
                "host": s.agent.host if s.agent else None,
                "seen": s.seen,
                "completed": s.completed,
                "failed": s.failed,
            }
            for (worker, queue), s in pending.items()
        ]

    def restore(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            entry = self._entry(r["name"], r["queue"])
            if entry is None:
                continue
            entry.seen = entry.seen or r["seen"]
            entry.completed += r["completed"]
            entry.failed += r["failed"]
            if entry.agent is None and (r["sdk"] or r["host"]):
                entry.agent = Agent(r["sdk"], r["version"], r["host"])

    async def flush(self, write: Callable[[list[dict[str, Any]]], Awaitable[None]]) -> int:
        rows = self.take()
        if not rows:
            return 0
        try:
            await write(rows)
        except BaseException:
            self.restore(rows)  # kept for the next flush rather than lost
            raise
        return len(rows)


@dataclass(slots=True, frozen=True)
class WorkerDetail:
    worker: WorkerRow
    jobs: list[HeldJob]


MAX_HELD_LISTED = 1000


class WorkerService:
    """Reads that may lag a little (the registry itself is written once a second per process): the read
    replica when there is one (app/db/replica.py)."""

    def __init__(self, settings: Settings, reads: Reads) -> None:
        self.settings = settings
        self.reads = reads

    async def list(self, allowed: str | None, limit: int) -> list[WorkerRow]:
        s = self.settings

        async def read(conn: Conn) -> list[WorkerRow]:
            return await store_workers.workers_list(conn, allowed, s.worker_gone_seconds, s.workers_keep_seconds, limit)

        return await self.reads.run(read)

    async def get(self, name: str, allowed: str | None) -> WorkerDetail:
        async def read(conn: Conn) -> tuple[WorkerRow | None, list[HeldJob]]:
            row = await store_workers.worker_get(conn, name, allowed, self.settings.worker_gone_seconds)
            if row is None:
                return None, []
            return row, await store_workers.worker_jobs(conn, name, allowed, MAX_HELD_LISTED)

        row, jobs = await self.reads.run(read)
        if row is None:
            raise WorkerNotFound(f"No worker named {name!r} was seen (in a queue this key may use).")
        # A job held under a key of a spread queue is a job of the queue (app/db/spread.py).
        return WorkerDetail(
            row, [dataclasses.replace(j, queue=logical(j.queue)) if is_key(j.queue) else j for j in jobs]
        )
