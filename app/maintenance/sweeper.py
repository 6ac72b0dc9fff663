"""The sweeper: returns jobs whose lease lapsed to pending, fails those that were on their last attempt,
and deletes finished jobs past their retention age. Runs in every API process; SKIP LOCKED lets replicas
sweep at the same time without waiting on each other or touching a row twice."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import psycopg

from app.db import jobs as store
from app.db import operations as store_ops
from app.db.pool import Database
from app.runtime.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("jobq.sweeper")

STATS_KEEP_SECONDS = 2 * 3600  # per-minute statistics outlive the longest stats window (1 h)
VACUUM_LOCK_KEY = 0x6A6F6276  # one replica vacuums at a time; the others skip that round


@dataclass(frozen=True)
class SweepResult:
    rescued: int
    failed: int


@dataclass
class RetentionResult:
    deleted: dict[str, int] = field(default_factory=dict)  # status -> rows


class Sweeper:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        metrics: Metrics,
        on_rescued: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.metrics = metrics
        self.on_rescued = on_rescued or (lambda _queues: None)
        self.runs = 0
        self._task: asyncio.Task[None] | None = None

    async def sweep_once(self, now: datetime | None = None) -> SweepResult:
        """One full pass over lapsed leases. `now` replaces the database clock for deciding which leases
        lapsed, so tests can move time forward instead of sleeping. Batches until one comes back short."""
        batch = self.settings.sweep_batch_size
        rescued: list[str] = []
        failed: list[str] = []
        async with self.db.connection() as conn:
            while True:
                queues = await store.jobs_rescue_expired(conn, now, batch)
                rescued.extend(queues)
                if queues:
                    self.on_rescued(set(queues))  # wake waiters now, not after the whole pass
                if len(queues) < batch:
                    break
            while True:
                queues = await store.jobs_fail_exhausted(conn, now, batch)
                failed.extend(queues)
                if len(queues) < batch:
                    break
        self.runs += 1
        self.metrics.sweeps.inc()
        self.metrics.count_many("lease_expired", rescued + failed)
        self.metrics.count_many("failed", failed)
        if rescued or failed:
            self.metrics.swept.labels("rescued").inc(len(rescued))
            self.metrics.swept.labels("failed").inc(len(failed))
            log.info("sweeper: lapsed leases", extra={"rescued": len(rescued), "failed": len(failed)})
        return SweepResult(len(rescued), len(failed))

    def _policy(self) -> dict[str, int]:
        s = self.settings
        ages = {
            "completed": s.retention_completed_seconds,
            "failed": s.retention_failed_seconds,
            "cancelled": s.retention_cancelled_seconds,
        }
        return {status: age for status, age in ages.items() if age > 0}

    async def retain_once(self, now: datetime | None = None) -> RetentionResult:
        """Delete finished jobs older than their status's retention age, queue by queue, in batches (each
        its own short transaction), and per-minute statistics older than any stats window."""
        batch = self.settings.sweep_batch_size
        result = RetentionResult()
        async with self.db.connection() as conn:
            for queue in await store_ops.finished_queues(conn):
                for status, age in self._policy().items():
                    while True:
                        n = await store_ops.jobs_delete_finished(conn, queue, status, age, batch, now)
                        result.deleted[status] = result.deleted.get(status, 0) + n
                        if n < batch:
                            break
            await store_ops.stats_delete_old(conn, STATS_KEEP_SECONDS)
        total = sum(result.deleted.values())
        if total:
            self.metrics.swept.labels("deleted").inc(total)
            log.info("retention: finished jobs deleted", extra={"deleted": result.deleted})
        return result

    async def vacuum_once(self, force: bool = False) -> bool:
        """VACUUM the jobs table when it holds more than JOBQ_VACUUM_DEAD_ROWS dead rows (or 20% of its
        live rows, whichever is more). A queue table makes dead rows several times faster than live ones,
        and autovacuum starts at most once a minute per database (autovacuum_naptime, a server-wide
        setting), which is too late here: BENCHMARKS.md has the measurement. Runs on its own
        connection, without the API's statement timeout, and skips the round when another replica is
        already vacuuming. Returns whether it vacuumed."""
        if not force:
            async with self.db.connection() as conn:
                dead, live = await store_ops.jobs_dead_rows(conn)
            if dead < max(self.settings.vacuum_dead_rows, live // 5):
                return False
        maintenance = await psycopg.AsyncConnection.connect(
            self.db.url, autocommit=True, application_name="jobq-vacuum"
        )
        async with maintenance:
            cur = await maintenance.execute("SELECT pg_try_advisory_lock(%s)", (VACUUM_LOCK_KEY,))
            got = await cur.fetchone()
            if not got or not got[0]:
                return False
            started = time.monotonic()
            await maintenance.execute("VACUUM jobs")
        self.metrics.swept.labels("vacuums").inc()
        log.info("vacuumed jobs", extra={"seconds": round(time.monotonic() - started, 3)})
        return True

    async def run(self) -> None:
        next_retention = time.monotonic() + self.settings.retention_interval_seconds * random.uniform(0.1, 1.0)
        interval = self.settings.vacuum_interval_seconds
        next_vacuum = time.monotonic() + interval * random.uniform(0.5, 1.0)
        while True:
            # Jitter keeps replicas started together from sweeping in lockstep.
            await asyncio.sleep(self.settings.sweep_interval_seconds * random.uniform(0.8, 1.2))
            try:
                await self.sweep_once()
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + self.settings.retention_interval_seconds
                    await self.retain_once()
                if interval and time.monotonic() >= next_vacuum:
                    next_vacuum = time.monotonic() + interval
                    await self.vacuum_once()
            except Exception as exc:
                log.warning("sweep failed: %s", exc)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
