"""Worker registry flush: what this process saw of its workers (app/core/workers.py) goes to the workers
tables about once a second, in one statement; about once a minute, workers gone for longer than
JOBQ_WORKERS_KEEP_SECONDS and per-minute counts older than an hour are deleted, queue by queue. A failed
flush keeps what it had for the next one; the last flush happens when the service stops."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from app.core.workers import WorkerActivity
from app.db import workers as store_workers
from app.db.pool import Database
from app.maintenance.base import Ticking
from app.observability.metrics import Metrics
from app.settings import Settings

PRUNE_EVERY_SECONDS = 60.0
PRUNE_SCAN = 1000  # the queues to prune are looked for among this many of the oldest rows of each table


class WorkersFlush(Ticking):
    name = "workers"

    def __init__(self, settings: Settings, activity: WorkerActivity, db: Database, metrics: Metrics) -> None:
        super().__init__(settings.workers_flush_interval_seconds, metrics)
        self.activity = activity
        self.db = db
        self.keep = settings.workers_keep_seconds
        self._next_prune = 0.0

    async def _write(self, rows: list[dict[str, Any]]) -> None:
        async with self.db.connection() as conn:
            await store_workers.workers_flush(conn, rows)

    async def run_once(self) -> int:
        """Write what was seen since the last pass; returns how many (worker, queue) rows it wrote."""
        written = await self.activity.flush(self._write)
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + PRUNE_EVERY_SECONDS
            await self._prune()
        return written

    async def _prune(self) -> None:
        """Queue by queue (app/db/workers.py): the queues with something to prune, then each on its own."""
        done: set[str] = set()
        while True:
            async with self.db.connection() as conn:
                queues = await store_workers.workers_stale_queues(conn, self.keep, sorted(done), PRUNE_SCAN)
            if not queues:
                return
            for queue in queues:
                async with self.db.connection() as conn:
                    await store_workers.workers_prune(conn, queue, self.keep)
                done.add(queue)

    async def stop(self) -> None:
        await super().stop()
        with contextlib.suppress(Exception):  # the database may be gone at shutdown: a second's sightings
            await self.activity.flush(self._write)
