"""The read replica's lag, measured every second (app/db/replica.py decides from it where reads go), and the
primary's replication for /metrics."""

from __future__ import annotations

import math

from app.db.pool import Database
from app.db.replica import Reads
from app.maintenance.base import Ticking
from app.observability.metrics import Metrics

INTERVAL_SECONDS = 1.0


class ReplicaWatch(Ticking):
    name = "replica"

    def __init__(self, db: Database, reads: Reads, metrics: Metrics, interval: float = INTERVAL_SECONDS) -> None:
        super().__init__(interval, metrics, first_delay=0.0)
        self.db = db
        self.reads = reads

    async def run_once(self) -> None:
        if (replication := self.db.replication) is not None:
            self.metrics.standbys.set(replication.standbys)
            self.metrics.asynchronous.set(1 if replication.asynchronous else 0)
        if self.reads.replica is None:
            return
        await self.reads.check()
        lag = self.reads.state.lag_seconds
        self.metrics.replica_lag.set(math.nan if lag is None else lag)
        self.metrics.replica_serving.set(1 if self.reads.state.serving else 0)
