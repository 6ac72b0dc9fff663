"""Gauges for /metrics: pool, waiting claims and waits for results every second, queue depths every
JOBQ_GAUGES_INTERVAL_SECONDS from GET /queues's pages (each queue's live jobs counted up to
JOBQ_STATS_EXACT_MAX, past it the background's count: app/db/live_counts.py; never a count per scrape), and
with them the scaling signal (claimable jobs, jobs in flight): for a queue without limits its ready jobs, for
one with limits or paused the statement of GET /queues/{queue}/scale. A scrape only reads what the last
refresh left, so scraping often costs PostgreSQL nothing."""

from __future__ import annotations

import time

from app.core.dispatcher import ClaimDispatcher
from app.core.results import ResultWaiters
from app.core.scale import DEFAULT_CAP, scale_of
from app.db import operations as store_ops
from app.db import retention as store_retention
from app.db import scale as store_scale
from app.db.pool import Database
from app.db.spread import key_names
from app.maintenance.base import Ticking
from app.observability.metrics import Metrics


class Gauges(Ticking):
    name = "gauges"

    def __init__(
        self,
        metrics: Metrics,
        db: Database,
        dispatcher: ClaimDispatcher,
        results: ResultWaiters,
        depth_interval: float,
        exact_max: int,
        trust: float,
    ) -> None:
        super().__init__(1.0, metrics, first_delay=0.0)
        self.db = db
        self.dispatcher = dispatcher
        self.results = results
        self.depth_interval = depth_interval
        self.exact_max = exact_max  # live jobs of a kind counted per queue; past it the background's count
        self.trust = trust  # how old that count may be and still stand without a read (live_counts.trusted_seconds)
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
                queues = await store_ops.all_queues(conn, self.exact_max, self.trust)
                health = await store_retention.database_health(conn)
                held = await store_scale.queues_held(conn)
                scale: list[tuple[str, float, float]] = []
                for q in queues:
                    if q.queue in held and (q.ready or q.running):
                        names = key_names(q.queue, q.keys_used)  # a spread queue's keys (app/db/spread.py)
                        row = await store_scale.queue_scale(conn, names, DEFAULT_CAP)
                        scale.append((q.queue, scale_of(q.queue, row).claimable, row.running))
                    else:
                        scale.append((q.queue, 0 if q.queue in held else q.ready, q.running))
            self.metrics.dead_rows.set(health.jobs_dead_rows)
            self.metrics.xmin_age.set(health.oldest_xmin_age_seconds)
            self.metrics.set_depths(
                (q.queue, q.ready, q.scheduled, q.oldest_ready_age or 0.0, q.waiting) for q in queues
            )
            self.metrics.set_scale(scale)
        self.metrics.forget_idle_queues()
