"""The scheduler: enqueues the jobs of schedules whose ticks are due, by the database clock. Runs in every
API process (JOBQ_SCHEDULE_INTERVAL_SECONDS=0 turns it off in one); replicas that fire the same tick at
once make one job (app/db/schedules.py). After a pass it sleeps until the earliest next tick, or at most
the interval (which bounds how long a schedule changed through another replica waits to be seen); a
change through this process wakes it at once."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import timedelta

from app.core.effects import NEW, PENDING, Effects, Moves, Path
from app.core.schedules import plan, zoned
from app.cron import CronError
from app.db import schedules as store
from app.db.pool import Database
from app.db.schedules import Firing
from app.maintenance.base import Ticking, between_batches
from app.observability.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("jobq.scheduler")

BATCH = 100  # due schedules per statement
SLACK = 0.005  # wake this much after a tick is due, so that it is due by the database's clock too


@dataclass(frozen=True)
class SchedulerResult:
    enqueued: int  # jobs made by this pass (another replica may have made the rest)
    due_in: float | None  # seconds until the earliest next tick (None: no active schedule)


class Scheduler(Ticking):
    name = "scheduler"

    def __init__(self, settings: Settings, db: Database, metrics: Metrics, effects: Effects) -> None:
        super().__init__(settings.schedule_interval_seconds, metrics, first_delay=0.0)
        self.db = db
        self.effects = effects
        self.grace = timedelta(seconds=settings.schedule_grace_seconds)
        self.max_attempts = settings.default_max_attempts
        self.due_in: float | None = None
        # name -> (cron, timezone) of the schedules this process cannot read: left out while they hold that
        # text (another replica may read them), or they would be due again at once, pass after pass.
        self.unreadable: dict[str, tuple[str, str]] = {}

    def next_delay(self) -> float:
        longest = self.interval * random.uniform(0.8, 1.0)
        return longest if self.due_in is None else min(longest, max(self.due_in, 0.0) + SLACK)

    async def run_once(self) -> SchedulerResult:
        enqueued = 0
        while True:
            async with self.db.connection() as conn:
                due = await store.schedules_due(conn, BATCH, self.unreadable)
            firings = []
            for s in due:
                try:
                    ticks, nxt = plan(
                        zoned(s.cron, s.timezone), s.next_run_at, s.now, self.grace, s.missed == "catch_up"
                    )
                except CronError as exc:  # stored by a release that read it differently: leave it be, say so
                    log.error("schedule %s: cannot read its cron %r in %s: %s", s.name, s.cron, s.timezone, exc)
                    self.unreadable[s.name] = (s.cron, s.timezone)
                    continue
                if s.next_run_at <= s.now - self.grace:
                    self.metrics.schedule_ticks.labels("missed").inc()
                    log.warning(
                        "schedule %s: ticks from %s on were missed (no scheduler ran); %s",
                        s.name,
                        s.next_run_at.isoformat(),
                        "enqueuing the latest" if s.missed == "catch_up" else "skipped",
                    )
                firings.append(Firing(s.name, s.revision, s.next_run_at, ticks, nxt))
            if firings:
                async with self.db.connection() as conn:
                    fired = await store.schedules_fire(conn, firings, self.max_attempts)
                moves = Moves(Path.SCHEDULE)
                for f in fired:
                    moves.add_jobs(f.queue, NEW, PENDING, (f.id,))  # due at once: a tick's job runs when made
                self.effects.apply(moves)
                enqueued += len(fired)
            if len(due) < BATCH:
                break
            await between_batches()
        async with self.db.connection() as conn:
            self.due_in = await store.schedules_next_due(conn, self.unreadable)
        return SchedulerResult(enqueued, self.due_in)
