"""Retention: finished jobs are deleted once older than their status's retention age (the queue's own,
PATCH /queues/{queue}/config, else the global one), queue by queue, a batch at a time (each batch its own
short transaction); per-minute statistics older than a day are rolled up into hours, a batch at a time
too, and hours older than eight days deleted (app/db/history.py); rate-limit ledger rows once older than
every window of their queue; SQS FIFO deduplication ids once their window has passed, and SQS message
attributes once their job is gone."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from app.core.effects import GONE, Effects, Moves, Path
from app.db import flow as store_flow
from app.db import history as store_history
from app.db import retention as store_retention
from app.db import sqs as store_sqs
from app.db.pool import Database
from app.maintenance.base import Ticking, between_batches
from app.observability.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("jobq.retention")

SCAN_FACTOR = 10  # the queues with old statistics are looked for among the oldest SCAN_FACTOR x batch rows


@dataclass
class RetentionResult:
    deleted: dict[str, int] = field(default_factory=dict)  # status -> rows
    minutes_rolled_up: int = 0
    dedup_ids_expired: int = 0


class Retention(Ticking):
    name = "retention"

    def __init__(self, settings: Settings, db: Database, metrics: Metrics, effects: Effects) -> None:
        # The first pass comes early, at a random point of the first interval.
        interval = settings.retention_interval_seconds
        super().__init__(interval, metrics, first_delay=interval * 0.55)
        self.db = db
        self.effects = effects
        self.batch = settings.sweep_batch_size
        self.ages = {
            "completed": settings.retention_completed_seconds,
            "failed": settings.retention_failed_seconds,
            "cancelled": settings.retention_cancelled_seconds,
        }

    async def run_once(self, now: datetime | None = None) -> RetentionResult:
        """`now` replaces the database clock for deciding what is old enough (tests move time forward)."""
        result = RetentionResult()
        async with self.db.connection() as conn:
            queues = await store_retention.finished_queues(conn)
            overrides = await store_flow.queue_retention_overrides(conn)
        for queue in queues:
            ages = dict(self.ages)
            for status, age in zip(ages, overrides.get(queue, ()), strict=False):
                if age is not None:
                    ages[status] = age
            for status, age in ages.items():
                if age <= 0:
                    continue  # 0: keep
                while True:
                    async with self.db.connection() as conn:
                        n = await store_retention.jobs_delete_finished(conn, queue, status, age, self.batch, now)
                    result.deleted[status] = result.deleted.get(status, 0) + n
                    if n:
                        moves = Moves(Path.RETENTION)
                        moves.add(queue, status, GONE, n=n)
                        self.effects.apply(moves)
                    if n < self.batch:
                        break
                    await between_batches()
        await self._history(now, result)
        async with self.db.connection() as conn:
            ledgers = await store_flow.queue_claims_queues(conn)
        for queue in ledgers:  # the rate limits' ledger, queue by queue
            async with self.db.connection() as conn:
                await store_flow.queue_claims_prune(conn, queue)
        while True:  # SQS FIFO deduplication ids past their five minutes (app/core/sqs.py)
            async with self.db.connection() as conn:
                n = await store_sqs.sqs_dedup_prune(conn, self.batch, now)
            result.dedup_ids_expired += n
            if n < self.batch:
                break
            await between_batches()
        while True:  # message attributes of SQS messages whose jobs were deleted
            async with self.db.connection() as conn:
                n = await store_sqs.sqs_messages_prune(conn, self.batch)
            if n < self.batch:
                break
            await between_batches()
        total = sum(result.deleted.values())
        if total:
            log.info("finished jobs deleted", extra={"deleted": result.deleted})
        return result

    async def _history(self, now: datetime | None, result: RetentionResult) -> None:
        """Minute rows older than a day rolled up into hours and hours older than eight days deleted, queue by
        queue (app/db/history.py), then the sampled minutes as old."""
        async with self.db.connection() as conn:
            cutoffs = await store_history.history_cutoffs(conn, now)
        done: set[str] = set()
        while True:
            async with self.db.connection() as conn:
                queues = await store_history.stats_old_queues(conn, cutoffs, sorted(done), self.batch * SCAN_FACTOR)
            if not queues:
                break
            for queue in queues:
                while True:
                    async with self.db.connection() as conn:
                        n = await store_history.stats_roll_up(conn, queue, cutoffs.minutes_before, self.batch)
                    result.minutes_rolled_up += n
                    if n < self.batch:
                        break
                    await between_batches()
                async with self.db.connection() as conn:
                    await store_history.history_delete_old(conn, queue, cutoffs.hours_before)
                done.add(queue)
        async with self.db.connection() as conn:
            await store_history.samples_delete_old(conn, cutoffs.hours_before)
