"""Live counts: every JOBQ_LIVE_COUNTS_INTERVAL_SECONDS one replica counts every queue's live jobs into
queue_live_counts and its top groups into queue_live_groups (app/db/live_counts.py), what the stats, GET /queues
and the gauges answer from for a kind past JOBQ_STATS_EXACT_MAX. Every replica looks; the one that takes the
advisory lock and finds the clock's row old enough counts, the others find the lock taken or the row fresh and do
nothing. The count reads the partial indexes of live jobs: its cost grows with the backlog, but it is paid once
per interval (or ten times the last count's duration, if longer) for the whole cluster."""

from __future__ import annotations

from app.db import live_counts as store_live
from app.db.pool import Database
from app.maintenance.base import Ticking
from app.observability.metrics import Metrics


class LiveCounts(Ticking):
    name = "live_counts"

    def __init__(self, db: Database, metrics: Metrics, interval: float) -> None:
        # Looks a little more often than the interval, so that a replica's count follows soon after the last.
        super().__init__(interval / 2, metrics, first_delay=0.5)
        self.db = db
        self.every = interval

    async def run_once(self) -> int | None:
        """Count now unless another pass (here or on another replica) did within the interval; the queues counted,
        or None."""
        async with self.db.connection() as conn:
            return await store_live.refresh(conn, self.every)
