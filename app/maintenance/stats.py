"""Statistics flush: this process's per-minute event counts go to queue_stats about once a second, so
that every replica's /queues/{queue}/stats agrees (app/observability/metrics.py counts them). A failed flush
keeps the counts for the next one; the last flush happens when the service stops.

And the application of the hot paths' tallied Prometheus counts (Metrics.apply, app/observability/metrics.py Tally)
once a second, so that in multi-process mode they reach /metrics within a second: a service of its own, which no
database wait holds up, started first and so stopped last (app/maintenance/base.py Supervisor stops in reverse
order), after every other service's last count."""

from __future__ import annotations

import contextlib

from app.db.operations import stats_writer
from app.db.pool import Database
from app.maintenance.base import Ticking
from app.observability.metrics import Metrics


class StatsFlush(Ticking):
    name = "stats"

    def __init__(self, metrics: Metrics, db: Database, interval: float = 1.0) -> None:
        super().__init__(interval, metrics)
        self.db = db
        self.write = stats_writer(db)

    async def run_once(self) -> None:
        await self.metrics.flush(self.write)

    async def stop(self) -> None:
        await super().stop()
        with contextlib.suppress(Exception):  # the database may be gone at shutdown: a second's counts
            await self.metrics.flush(self.write)


class TallyApply(Ticking):
    name = "tally"

    def __init__(self, metrics: Metrics, interval: float = 1.0) -> None:
        super().__init__(interval, metrics)

    async def run_once(self) -> None:
        self.metrics.apply()

    async def stop(self) -> None:
        await super().stop()
        self.metrics.apply()
