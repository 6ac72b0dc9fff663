"""Hard timeouts: jobs running longer than their timeout since their claim are failed with last_error
'timeout', whatever their heartbeats, and retried or not as any failure (app/db/timeouts.py). Runs in every
API process at the sweep interval; SKIP LOCKED lets replicas sweep at once without touching a row twice."""

from __future__ import annotations

import logging
from datetime import datetime

from app.core.dependencies import DependencyRelease
from app.core.effects import FAILED, RUNNING, SCHEDULED, Effects, Moves, Path
from app.core.workers import WorkerActivity
from app.db import timeouts as store_timeouts
from app.db.pool import Database
from app.maintenance.base import Ticking, between_batches
from app.observability.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("jobq.timeouts")


class TimeoutSweeper(Ticking):
    name = "timeouts"

    def __init__(
        self,
        settings: Settings,
        db: Database,
        metrics: Metrics,
        effects: Effects,
        activity: WorkerActivity,
        release: DependencyRelease,
    ) -> None:
        super().__init__(settings.sweep_interval_seconds, metrics)
        self.settings = settings
        self.db = db
        self.batch = settings.sweep_batch_size
        self.effects = effects
        self.activity = activity
        self.release = release

    async def run_once(self, now: datetime | None = None) -> int:
        """One full pass, a batch at a time until one comes back short; returns how many jobs it failed.
        `now` replaces the database clock for deciding which jobs ran too long (tests)."""
        total = 0
        while True:
            async with self.db.connection() as conn:
                timed_out = await store_timeouts.jobs_fail_timed_out(
                    conn, now, self.batch, self.settings.backoff_base_seconds, self.settings.backoff_cap_seconds
                )
            total += len(timed_out)
            moves = Moves(Path.TIMEOUT)
            for t in timed_out:
                # Back to pending after a backoff (scheduled), or failed for good.
                moves.add_jobs(t.queue, RUNNING, FAILED if t.status == FAILED else SCHEDULED, (t.id,))
                self.activity.finished(t.worker, t.queue, failed=1)
            self.effects.apply(moves)
            if any(t.has_dependants and t.status == FAILED for t in timed_out):
                self.release.backlog()  # their dependants: cancelled by the background release
            if len(timed_out) < self.batch:
                break
            await between_batches()
        if total:
            log.info("jobs past their timeout failed", extra={"timed_out": total})
        return total
