"""Lease rescue: jobs whose lease lapsed go back to pending (an attempt spent), and those that were on
their last attempt go to failed, by a separate statement (the article's terminal path). Runs in every
API process; SKIP LOCKED lets replicas rescue at the same time without waiting on each other or touching
a row twice."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from app.core.effects import FAILED, PENDING, RUNNING, Effects, Moves, Path
from app.db import rescue as store_rescue
from app.db.pool import Database
from app.maintenance.base import Ticking, between_batches
from app.observability.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("jobq.rescuer")


@dataclass(frozen=True)
class RescueResult:
    rescued: int
    failed: int


class LeaseRescuer(Ticking):
    name = "rescuer"

    def __init__(self, settings: Settings, db: Database, metrics: Metrics, effects: Effects) -> None:
        super().__init__(settings.sweep_interval_seconds, metrics)
        self.db = db
        self.batch = settings.sweep_batch_size
        self.effects = effects

    async def run_once(self, now: datetime | None = None) -> RescueResult:
        """One full pass over lapsed leases, a batch at a time until one comes back short. `now` replaces
        the database clock for deciding which leases lapsed, so tests can move time forward instead of
        sleeping."""
        rescued = failed = 0
        while True:
            async with self.db.connection() as conn:
                queues = await store_rescue.jobs_rescue_expired(conn, now, self.batch)
            rescued += len(queues)
            moves = Moves(Path.RESCUE)
            for queue in queues:
                moves.add(queue, RUNNING, PENDING)
            self.effects.apply(moves)  # each batch at once: waiters wake now, not after the whole pass
            if len(queues) < self.batch:
                break
            await between_batches()
        while True:
            async with self.db.connection() as conn:
                gone = await store_rescue.jobs_fail_exhausted(conn, now, self.batch)
            failed += len(gone)
            moves = Moves(Path.RESCUE)
            for queue, job_id in gone:
                moves.add_jobs(queue, RUNNING, FAILED, (job_id,))
            self.effects.apply(moves)
            if len(gone) < self.batch:
                break
            await between_batches()
        self.metrics.sweeps.inc()
        if rescued or failed:
            log.info("lapsed leases", extra={"rescued": rescued, "failed": failed})
        return RescueResult(rescued, failed)
