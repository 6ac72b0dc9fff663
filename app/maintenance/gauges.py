"""Gauges for /metrics: pool, waiting claims and waits for results every second, queue depths every
JOBQ_GAUGES_INTERVAL_SECONDS from the same index-only aggregation as GET /queues (never a count per
scrape)."""

from __future__ import annotations

import time

from app.core.dispatcher import ClaimDispatcher
from app.core.results import ResultWaiters
from app.db import operations as store_ops
from app.db import retention as store_retention
from app.db.pool import Database
from app.maintenance.base import Ticking
from app.observability.metrics import Metrics


class Gauges(Ticking):
    name = "gauges"

    def __init__(
        self, metrics: Metrics, db: Database, dispatcher: ClaimDispatcher, results: ResultWaiters, depth_interval: float
    ) -> None:
        super().__init__(1.0, metrics, first_delay=0.0)
        self.db = db
        self.dispatcher = dispatcher
        self.results = results
        self.depth_interval = depth_interval
        self._next_depth = 0.0

    async def run_once(self) -> None:
        stats = self.db.pool.get_stats()
        self.metrics.pool_size.set(stats.get("pool_size", 0))
        self.metrics.pool_busy.set(stats.get("pool_size", 0) - stats.get("pool_available", 0))
        self.metrics.pool_waiting.set(stats.get("requests_waiting", 0))
        self.metrics.waiting.set(self.dispatcher.parked)
        self.metrics.waiting_results.set(self.results.parked)
        if time.monotonic() >= self._next_depth:
            self._next_depth = time.monotonic() + self.depth_interval
            async with self.db.connection() as conn:
                queues = await store_ops.queues_list(conn)
                health = await store_retention.database_health(conn)
            self.metrics.dead_rows.set(health.jobs_dead_rows)
            self.metrics.xmin_age.set(health.oldest_xmin_age_seconds)
            self.metrics.set_depths(
                (q.queue, q.ready, q.scheduled, q.oldest_ready_age or 0.0, q.waiting) for q in queues
            )
        self.metrics.forget_idle_queues()
