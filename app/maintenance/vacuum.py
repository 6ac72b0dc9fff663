"""Vacuum: the jobs table is a queue, so dead row versions pile up several times faster than live rows,
and autovacuum starts at most once a minute per database (autovacuum_naptime, a server-wide setting),
which is too late here (docs/benchmarks-history.md has the measurement). This service VACUUMs `jobs` when it holds
more than JOBQ_VACUUM_DEAD_ROWS dead rows (or 20% of its live rows, whichever is more), or when as many rows
were inserted since its last vacuum: after a bulk load, until a VACUUM has seen the new pages, every claim
checks and hints the rows it meets one by one (a queue whose jobs are spread among other queues' in the heap
claimed 1.3-3.8x slower than one alone; the same once vacuumed: BENCHMARKS.md and its history; autovacuum's own
insert trigger looks at most once a minute). One replica vacuums at a time; the others skip that round."""

from __future__ import annotations

import logging
import time

import psycopg

from app.db import retention as store_retention
from app.db import schema
from app.db.pool import Database
from app.maintenance.base import Ticking
from app.observability.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("jobq.vacuum")

VACUUM_LOCK_KEY = 0x6A6F6276  # pg_try_advisory_lock key: one replica vacuums at a time


class Vacuum(Ticking):
    name = "vacuum"

    def __init__(self, settings: Settings, db: Database, metrics: Metrics) -> None:
        interval = settings.vacuum_interval_seconds  # 0: never
        super().__init__(interval, metrics, first_delay=interval * 0.75)
        self.db = db
        self.dead_rows = settings.vacuum_dead_rows

    async def run_once(self, force: bool = False) -> bool:
        """VACUUM jobq.jobs if it needs it (or `force`); returns whether it vacuumed. Runs on a connection of
        its own, without the API's statement timeout."""
        if not force:
            async with self.db.connection() as conn:
                dead, live, inserted = await store_retention.jobs_dead_rows(conn)
            if max(dead, inserted) < max(self.dead_rows, live // 5):
                return False
        maintenance = await psycopg.AsyncConnection.connect(
            self.db.url, autocommit=True, application_name="jobq-vacuum"
        )
        schema.use(maintenance, self.db.location)
        async with maintenance:
            cur = await maintenance.execute("SELECT pg_try_advisory_lock(%s)", (VACUUM_LOCK_KEY,))
            got = await cur.fetchone()
            if not got or not got[0]:
                return False
            started = time.monotonic()
            await maintenance.execute("VACUUM jobq.jobs")
        self.metrics.swept.labels("vacuums").inc()
        log.info("vacuumed jobs", extra={"seconds": round(time.monotonic() - started, 3)})
        return True
