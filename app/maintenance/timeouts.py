"""Hard timeouts: jobs running longer than their timeout since their claim are failed with last_error
'timeout', whatever their heartbeats, and retried or not as any failure (app/db/timeouts.py). Runs in every
API process at the sweep interval; SKIP LOCKED lets replicas sweep at once without touching a row twice.
One queue at a time, as the lease rescue (app/maintenance/rescuer.py): a queue whose statement fails stops no
other queue's sweep."""

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

SCAN_FACTOR = 10  # the queues are looked for among the oldest SCAN_FACTOR x batch jobs past their timeout
BATCHES_PER_TURN = 10  # of one queue, before the other queues found with it get their turn


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
        """One full pass, queue by queue (app/db/timeouts.py), each a batch at a time until one comes back short;
        returns how many jobs it failed. A queue whose statement fails is logged, counted and left for the next
        pass; the other queues are swept as usual. `now` replaces the database clock for deciding which jobs
        ran too long (tests)."""
        total = 0
        done: set[str] = set()  # drained, or failed, in this pass
        while True:
            async with self.db.connection() as conn:
                queues = await store_timeouts.timeout_queues(conn, now, sorted(done), self.batch * SCAN_FACTOR)
            if not queues:
                break
            for queue in queues:
                try:
                    n, drained = await self._queue(queue, now)
                except Exception:
                    done.add(queue)
                    self.metrics.maintenance_errors.labels(self.name).inc()
                    log.exception("%s: queue %r failed; its jobs are tried again on the next pass", self.name, queue)
                    continue
                total += n
                if drained:
                    done.add(queue)
        if total:
            log.info("jobs past their timeout failed", extra={"timed_out": total})
        return total

    async def _queue(self, queue: str, now: datetime | None) -> tuple[int, bool]:
        """Up to BATCHES_PER_TURN batches of one queue: (jobs failed, drained)."""
        total = 0
        for _ in range(BATCHES_PER_TURN):
            async with self.db.connection() as conn:
                timed_out = await store_timeouts.jobs_fail_timed_out(
                    conn, queue, now, self.batch, self.settings.backoff_base_seconds, self.settings.backoff_cap_seconds
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
                return total, True
            await between_batches()
        return total, False
