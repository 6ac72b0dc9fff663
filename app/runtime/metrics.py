"""Job events counted once, reported twice: as Prometheus metrics of this process, and as per-minute
queue statistics flushed to the database (queue_stats) so that every replica's /stats agrees.

Events are counted from what statements returned (rows completed, failed, ...), never by extra
queries. The flush is one statement per second per process; a crash loses at most that second of
windowed statistics, never a job or a finished-job count (those live in queue_counts, kept by the
statements themselves)."""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from app.db import operations as store_ops
from app.db.pool import Database

log = logging.getLogger("jobq.metrics")

# Bucket upper bounds (ms) of the claim-to-completion histogram kept in queue_stats.durations_ms;
# one more bucket above the last bound. Never reorder: stored histograms depend on it.
DURATION_BOUNDS_MS: tuple[float, ...] = (
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000,
    60_000, 120_000, 300_000, 600_000, 1_800_000, 3_600_000,
)  # fmt: skip
# Each is a jobq_jobs_{event}_total counter (empty_claims: jobq_claims_empty_with_ready_total) and a
# column of queue_stats. `released` (handed back untried, attempt given back) is neither a retry nor a
# failure.
EVENTS = (
    "enqueued", "claimed", "completed", "failed", "retried", "lease_expired", "cancelled", "released",
    "empty_claims",
)  # fmt: skip
# Claim requests answered short because of a limit (app/db/flow.py), by limit: jobq_claims_held_back_total
# {queue, limit} and the held_* columns of queue_stats.
LIMITS = ("concurrency", "rate", "group_concurrency", "group_rate", "ordered")
HELD = tuple(f"held_{limit}" for limit in LIMITS)
COUNTED = EVENTS + HELD


def percentile_ms(histogram: list[int] | None, q: float, max_ms: float | None) -> float | None:
    """The q-quantile of a DURATION_BOUNDS_MS histogram, interpolated linearly inside its bucket and
    never above the exact maximum. Its error is bounded by the width of one bucket."""
    if not histogram or not sum(histogram):
        return None
    rank = q * sum(histogram)
    seen = 0
    for i, n in enumerate(histogram):
        if n and seen + n >= rank:
            low = DURATION_BOUNDS_MS[i - 1] if i > 0 else 0.0
            high = DURATION_BOUNDS_MS[i] if i < len(DURATION_BOUNDS_MS) else (max_ms or low)
            value = low + (high - low) * (rank - seen) / n
            return round(min(value, max_ms) if max_ms is not None else value, 3)
        seen += n
    return max_ms


HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


@dataclass
class _Minute:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTED, 0))
    durations: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BOUNDS_MS) + 1))
    duration_max: float = 0.0


class Metrics:
    def __init__(self) -> None:
        # Multi-process mode (`jobq serve --workers N`): values live in files the /metrics endpoint
        # merges; otherwise a registry of this app (tests build many apps in one process).
        self.multiprocess = multiprocess_dir() is not None
        self.registry = CollectorRegistry()
        reg = None if self.multiprocess else self.registry
        labels = ["queue"]
        self.jobs = {
            event: Counter(f"jobq_jobs_{event}_total", f"Jobs {event.replace('_', ' ')}.", labels, registry=reg)
            for event in EVENTS
            if event != "empty_claims"
        }
        self.empty_claims = Counter(
            "jobq_claims_empty_with_ready_total",
            "Claim requests answered empty while ready jobs existed (locked by other claims, or paused).",
            labels,
            registry=reg,
        )
        self.held_back = Counter(
            "jobq_claims_held_back_total",
            "Claim requests answered with fewer jobs than asked while ready jobs were held back by a limit.",
            ["queue", "limit"],
            registry=reg,
        )
        self.job_duration = Histogram(
            "jobq_job_duration_seconds",
            "Claim to completion.",
            labels,
            buckets=[b / 1000 for b in DURATION_BOUNDS_MS],
            registry=reg,
        )
        self.http_requests = Histogram(
            "jobq_http_request_duration_seconds",
            "HTTP requests by route, method and status.",
            ["route", "method", "status"],
            buckets=HTTP_BUCKETS,
            registry=reg,
        )
        mode: dict[str, Any] = {"multiprocess_mode": "livesum"} if self.multiprocess else {}
        latest: dict[str, Any] = {"multiprocess_mode": "mostrecent"} if self.multiprocess else {}
        self.waiting = Gauge("jobq_waiting_claims", "Long-polls waiting for a job.", registry=reg, **mode)
        self.waiting_results = Gauge(
            "jobq_waiting_results",
            "Requests waiting for a job to finish (GET /jobs/{id}?wait_seconds).",
            registry=reg,
            **mode,
        )
        self.pool_size = Gauge("jobq_pool_connections", "Open pooled connections.", registry=reg, **mode)
        self.pool_busy = Gauge("jobq_pool_connections_in_use", "Pooled connections lent out.", registry=reg, **mode)
        self.pool_waiting = Gauge(
            "jobq_pool_requests_waiting", "Requests waiting for a connection.", registry=reg, **mode
        )
        self.depth = Gauge("jobq_queue_ready_jobs", "Ready jobs (due, pending).", labels, registry=reg, **latest)
        self.scheduled = Gauge("jobq_queue_scheduled_jobs", "Pending jobs not yet due.", labels, registry=reg, **latest)
        self.oldest = Gauge(
            "jobq_queue_oldest_ready_age_seconds", "Age of the oldest ready job.", labels, registry=reg, **latest
        )
        self.sweeps = Counter("jobq_sweeper_runs_total", "Sweeper passes.", registry=reg)
        self.maintenance_errors = Counter(
            "jobq_maintenance_errors_total", "Background passes that failed, by service.", ["service"], registry=reg
        )
        self.swept = Counter("jobq_sweeper_rows_total", "Rows the sweeper changed.", ["action"], registry=reg)
        self.schedule_ticks = Counter(
            "jobq_schedule_ticks_total",
            "Schedule ticks by outcome: `enqueued` by this process, `missed` (found later than "
            "JOBQ_SCHEDULE_GRACE_SECONDS: passes that found missed ticks, each schedule counted once).",
            ["outcome"],
            registry=reg,
        )
        self._minutes: dict[tuple[str, datetime], _Minute] = {}
        self._children: dict[tuple[str, str], Any] = {}

    # -- events ---------------------------------------------------------------------------------------------

    def _minute(self, queue: str) -> _Minute:
        key = (queue, datetime.now(UTC).replace(second=0, microsecond=0))
        m = self._minutes.get(key)
        if m is None:
            m = self._minutes[key] = _Minute()
        return m

    def _child(self, event: str, queue: str) -> Any:
        """The labelled counter; labels() costs microseconds, so each child is looked up once."""
        key = (event, queue)
        child = self._children.get(key)
        if child is None:
            if event in HELD:
                child = self._children[key] = self.held_back.labels(queue, event.removeprefix("held_"))
                return child
            metric = {"empty_claims": self.empty_claims, "duration": self.job_duration}.get(event) or self.jobs[event]
            child = self._children[key] = metric.labels(queue)
        return child

    def count(self, event: str, queue: str, n: int = 1) -> None:
        if n <= 0:
            return
        self._child(event, queue).inc(n)
        self._minute(queue).counts[event] += n

    def count_many(self, event: str, queues: Iterable[str]) -> None:
        totals: dict[str, int] = {}
        for q in queues:
            totals[q] = totals.get(q, 0) + 1
        for q, n in totals.items():
            self.count(event, q, n)

    def completed(self, queue: str, durations_ms: list[float]) -> None:
        self.count("completed", queue, len(durations_ms))
        m = self._minute(queue)
        hist = self._child("duration", queue)
        for d in durations_ms:
            m.durations[bisect.bisect_left(DURATION_BOUNDS_MS, d)] += 1
            m.duration_max = max(m.duration_max, d)
            hist.observe(d / 1000)

    # -- the shared per-minute statistics ------------------------------------------------------------------

    async def flush(self, db: Database) -> None:
        """Add this process's counts since the last flush to queue_stats (one statement)."""
        if not self._minutes:
            return
        pending, self._minutes = self._minutes, {}
        rows = [
            {
                "queue_name": q,
                "minute": minute,
                **m.counts,
                "duration_max_ms": m.duration_max,
                "durations_ms": m.durations,
            }
            for (q, minute), m in pending.items()
        ]
        try:
            async with db.connection() as conn:
                await store_ops.stats_add(conn, rows)
        except Exception:
            # Keep them for the next flush rather than lose them.
            for key, m in pending.items():
                mine = self._minutes.setdefault(key, _Minute())
                for event, n in m.counts.items():
                    mine.counts[event] += n
                mine.durations = [a + b for a, b in zip(mine.durations, m.durations, strict=True)]
                mine.duration_max = max(mine.duration_max, m.duration_max)
            raise

    # -- exposition ----------------------------------------------------------------------------------------------

    def exposition_registry(self) -> CollectorRegistry:
        if not self.multiprocess:
            return self.registry
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
