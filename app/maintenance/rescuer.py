"""Lease rescue: jobs whose lease lapsed go back to pending (an attempt spent), and those that were on
their last attempt go to failed, by a separate statement (the article's terminal path). Runs in every
API process; SKIP LOCKED lets replicas rescue at the same time without waiting on each other or touching
a row twice."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from app.core.wakeups import Wakeups
from app.db import jobs as store
from app.db.pool import Database
from app.maintenance.base import Ticking, between_batches
from app.runtime.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("jobq.rescuer")


@dataclass(frozen=True)
class RescueResult:
    rescued: int
    failed: int


class LeaseRescuer(Ticking):
    name = "rescuer"

    def __init__(self, settings: Settings, db: Database, metrics: Metrics, wakeups: Wakeups) -> None:
        super().__init__(settings.sweep_interval_seconds, metrics)
        self.db = db
        self.batch = settings.sweep_batch_size
        self.wakeups = wakeups

    async def run_once(self, now: datetime | None = None) -> RescueResult:
        """One full pass over lapsed leases, a batch at a time until one comes back short. `now` replaces
        the database clock for deciding which leases lapsed, so tests can move time forward instead of
        sleeping."""
        rescued: list[str] = []
        failed: list[str] = []
        while True:
            async with self.db.connection() as conn:
                queues = await store.jobs_rescue_expired(conn, now, self.batch)
            rescued.extend(queues)
            if queues:
                self.wakeups.jobs_available(set(queues))  # wake waiters now, not after the whole pass
            if len(queues) < self.batch:
                break
            await between_batches()
        while True:
            async with self.db.connection() as conn:
                gone = await store.jobs_fail_exhausted(conn, now, self.batch)
            failed.extend(queue for queue, _ in gone)
            self.wakeups.jobs_finished([job_id for _, job_id in gone])  # requests waiting for their result
            if gone:
                self.wakeups.jobs_available({queue for queue, _ in gone})  # a slot freed under a concurrency limit
            if len(gone) < self.batch:
                break
            await between_batches()
        self.metrics.sweeps.inc()
        self.metrics.count_many("lease_expired", rescued + failed)
        self.metrics.count_many("failed", failed)
        if rescued or failed:
            self.metrics.swept.labels("rescued").inc(len(rescued))
            self.metrics.swept.labels("failed").inc(len(failed))
            log.info("lapsed leases", extra={"rescued": len(rescued), "failed": len(failed)})
        return RescueResult(len(rescued), len(failed))
