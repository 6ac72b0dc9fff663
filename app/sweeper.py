"""The sweeper: returns jobs whose lease lapsed to pending, and fails those that were on their last
attempt. Runs in every API process; SKIP LOCKED lets replicas sweep at the same time without waiting on
each other or touching a row twice."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from app import store
from app.db import Database
from app.settings import Settings

log = logging.getLogger("jobq.sweeper")


@dataclass(frozen=True)
class SweepResult:
    rescued: int
    failed: int


class Sweeper:
    def __init__(self, settings: Settings, db: Database, on_rescued: Callable[[set[str]], None] | None = None) -> None:
        self.settings = settings
        self.db = db
        self.on_rescued = on_rescued or (lambda _queues: None)
        self.runs = 0
        self._task: asyncio.Task[None] | None = None

    async def sweep_once(self, now: datetime | None = None) -> SweepResult:
        """One full pass. `now` replaces the database clock for deciding which leases lapsed, so tests
        can move time forward instead of sleeping. Works in batches until a batch comes back short."""
        batch = self.settings.sweep_batch_size
        rescued: list[str] = []
        failed = 0
        async with self.db.connection() as conn:
            while True:
                queues = await store.jobs_rescue_expired(conn, now, batch)
                rescued.extend(queues)
                if queues:
                    self.on_rescued(set(queues))  # wake waiters now, not after the whole pass
                if len(queues) < batch:
                    break
            while True:
                n = len(await store.jobs_fail_exhausted(conn, now, batch))
                failed += n
                if n < batch:
                    break
        self.runs += 1
        if rescued or failed:
            log.info("sweeper: %d lapsed lease(s) back to pending, %d failed", len(rescued), failed)
        return SweepResult(len(rescued), failed)

    async def run(self) -> None:
        while True:
            # Jitter keeps replicas started together from sweeping in lockstep.
            await asyncio.sleep(self.settings.sweep_interval_seconds * random.uniform(0.8, 1.2))
            try:
                await self.sweep_once()
            except Exception as exc:
                log.warning("sweep failed: %s", exc)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
