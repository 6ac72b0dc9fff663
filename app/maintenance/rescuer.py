"""Lease rescue: jobs whose lease lapsed go back to pending (an attempt spent), and those that were on
their last attempt go to failed, by a separate statement (the article's terminal path). Runs in every
API process; SKIP LOCKED lets replicas rescue at the same time without waiting on each other or touching
a row twice.

One queue at a time (app/db/rescue.py): a pass finds the queues with lapsed leases, then rescues each in
batches, every statement in a transaction of its own under JOBQ_MAINTENANCE_STATEMENT_TIMEOUT_MS. A queue
whose statement fails (an error, or past its budget) is logged, counted
(`jobq_maintenance_errors_total{service="rescuer"}`) and left for the next pass; the other queues' leases
are rescued and failed as usual. A job failed here that others depend on is recorded for the dependency
release in the same statement, and the background release is poked: the cascade never runs inside the
sweeper's statement."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from app.core.dependencies import DependencyRelease
from app.core.effects import FAILED, PENDING, RUNNING, Effects, Moves, Path
from app.db import rescue as store_rescue
from app.db.pool import Database
from app.maintenance.base import Ticking, between_batches
from app.observability.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("jobq.rescuer")

SCAN_FACTOR = 10  # the queues are looked for among the oldest SCAN_FACTOR x batch lapsed leases
BATCHES_PER_TURN = 10  # of one queue, before the other queues found with it get their turn


@dataclass(frozen=True)
class RescueResult:
    rescued: int
    failed: int
    errors: int = 0  # queues whose statements failed in this pass (left for the next)


class LeaseRescuer(Ticking):
    name = "rescuer"

    def __init__(
        self, settings: Settings, db: Database, metrics: Metrics, effects: Effects, release: DependencyRelease
    ) -> None:
        super().__init__(settings.sweep_interval_seconds, metrics)
        self.db = db
        self.batch = settings.sweep_batch_size
        self.budget_ms = settings.maintenance_statement_timeout_ms
        self.effects = effects
        self.release = release

    async def run_once(self, now: datetime | None = None) -> RescueResult:
        """One full pass over lapsed leases, queue by queue, each a batch at a time until one comes back
        short. `now` replaces the database clock for deciding which leases lapsed, so tests can move time
        forward instead of sleeping."""
        rescued = failed = errors = 0
        done: set[str] = set()  # drained, or failed, in this pass
        while True:
            async with self.db.connection() as conn:
                queues = await store_rescue.lapsed_queues(
                    conn, now, sorted(done), self.batch * SCAN_FACTOR, self.budget_ms
                )
            if not queues:
                break
            for queue in queues:
                try:
                    r, f, drained = await self._queue(queue, now)
                except Exception:
                    errors += 1
                    done.add(queue)
                    self.metrics.maintenance_errors.labels(self.name).inc()
                    log.exception("%s: queue %r failed; its leases are tried again on the next pass", self.name, queue)
                    continue
                rescued += r
                failed += f
                if drained:
                    done.add(queue)
        self.metrics.sweeps.inc()
        if rescued or failed:
            log.info("lapsed leases", extra={"rescued": rescued, "failed": failed})
        return RescueResult(rescued, failed, errors)

    async def _queue(self, queue: str, now: datetime | None) -> tuple[int, int, bool]:
        """Up to BATCHES_PER_TURN batches of each statement on one queue: (rescued, failed, drained)."""
        rescued = failed = 0
        drained = True
        for turn in range(BATCHES_PER_TURN):
            async with self.db.connection() as conn:
                n = await store_rescue.jobs_rescue_expired(conn, queue, now, self.batch, self.budget_ms)
            rescued += n
            if n:
                moves = Moves(Path.RESCUE)
                moves.add(queue, RUNNING, PENDING, n)
                self.effects.apply(moves)  # each batch at once: waiters wake now, not after the whole pass
            if n < self.batch:
                break
            drained = turn < BATCHES_PER_TURN - 1
            await between_batches()
        for turn in range(BATCHES_PER_TURN):
            async with self.db.connection() as conn:
                gone = await store_rescue.jobs_fail_exhausted(conn, queue, now, self.batch, self.budget_ms)
            failed += len(gone)
            if gone:
                moves = Moves(Path.RESCUE)
                moves.add_jobs(queue, RUNNING, FAILED, [job_id for job_id, _ in gone])
                self.effects.apply(moves)
            if any(parent for _, parent in gone):
                self.release.backlog()  # their dependants: cancelled by the background release
            if len(gone) < self.batch:
                break
            drained = drained and turn < BATCHES_PER_TURN - 1
            await between_batches()
        return rescued, failed, drained
