"""Backlog samples: once a minute, for the whole cluster, the number of ready jobs of each queue and the
age of its oldest go into that minute's statistics, so that the dashboard can draw the backlog over time.

Every replica tries a few times a minute; the first to claim the minute in stats_samples writes the
samples, in the same statement, and the others find the minute taken (one primary-key lookup). A minute
in which no replica ran has no sample, and the charts show a gap there rather than an empty queue."""

from __future__ import annotations

from datetime import datetime

from app.db import history as store_history
from app.db.history import Sampled
from app.db.pool import Database
from app.maintenance.base import Ticking
from app.observability.metrics import Metrics

SAMPLE_INTERVAL = 15.0  # a minute's sample is taken within about this long of its start


class BacklogSampler(Ticking):
    name = "samples"

    def __init__(self, db: Database, metrics: Metrics, interval: float = SAMPLE_INTERVAL) -> None:
        super().__init__(interval, metrics, first_delay=1.0)
        self.db = db

    async def run_once(self, now: datetime | None = None) -> Sampled:
        """Sample this minute unless another pass (here or on another replica) did; `now` replaces the
        database clock (tests)."""
        async with self.db.connection() as conn:
            return await store_history.backlog_sample(conn, now)
