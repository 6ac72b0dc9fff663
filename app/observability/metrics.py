"""Job events counted once, reported twice: as Prometheus metrics of this process, and as per-minute
queue statistics flushed to the database (queue_stats) so that every replica's /stats agrees.

Events are counted from what statements returned (rows completed, failed, ...), never by extra
queries. The flush is one statement per second per process; a crash loses at most that second of
windowed statistics, never a job or a finished-job count (those live in queue_counts, kept by the
statements themselves).

Queue names come from clients, so the `queue` label is bounded: at most JOBQ_METRICS_MAX_QUEUES distinct
values per process (events of further queues are counted under `queue="(other)"`), and a queue without
an event for JOBQ_METRICS_QUEUE_IDLE_SECONDS leaves /metrics, freeing its place. Multi-process mode keeps
values in files that the exposition merges and that cannot forget one series: there the cap holds but
series stay until the processes restart.

What the hot paths count (job events, job durations, the request histogram) is added up in plain numbers and
applied to the Prometheus values in one go (Tally): when this process answers /metrics (or its registry is read),
once a second (app/maintenance/stats.py TallyApply) and when the service stops. In multi-process mode each
increment of a Prometheus value is a locked write to a memory-mapped file (2.2 µs an increment, 4.5 µs an
observation, measured on the reference machine: a claim of 100 jobs observed 100 durations), so there another
process's counts reach /metrics within a second."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric
from prometheus_client.multiprocess import MultiProcessCollector

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
# Claim requests answered short because of a limit (app/db/claim.py), by limit: jobq_claims_held_back_total
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


OTHER_QUEUE = "(other)"  # never a queue name: those hold only [A-Za-z0-9_.:-]


class QueueLabels:
    """Which `queue` label value a queue's events go under, and which queues have gone idle."""

    def __init__(self, max_queues: int, idle_seconds: float) -> None:
        self.max_queues = max_queues
        self.idle_seconds = idle_seconds
        self._last: dict[str, float] = {}  # queue -> monotonic time of its last event

    def label(self, queue: str) -> str:
        """The label for an event of `queue`, which is active from now."""
        if queue in self._last or len(self._last) < self.max_queues:
            self._last[queue] = time.monotonic()
            return queue
        return OTHER_QUEUE

    def has(self, queue: str) -> bool:
        return queue in self._last

    def idle(self) -> list[str]:
        """Forget the queues without an event for idle_seconds, and name them."""
        cutoff = time.monotonic() - self.idle_seconds
        gone = [q for q, at in self._last.items() if at < cutoff]
        for q in gone:
            del self._last[q]
        return gone


HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


@dataclass
class _Minute:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTED, 0))
    durations: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BOUNDS_MS) + 1))
    duration_max: float = 0.0


# Writes one flush's rows to queue_stats (app/db/operations.py stats_writer): passed in, so that what counts
# knows nothing of the database it reports to.
StatsWriter = Callable[[list[dict[str, Any]]], Awaitable[None]]


def _retrieve(task: asyncio.Future[None]) -> None:
    """A flush whose caller was cancelled ends unobserved. If it failed, it has put its counts back for the
    next flush, so its error is nobody's business: retrieve it so that asyncio does not report it."""
    if not task.cancelled():
        task.exception()


class Tally:
    """Increments of labelled Prometheus counters and observations of labelled histograms, kept as plain numbers
    until `apply()` adds them to the values (one increment a value, whatever the number of events). The event
    loop counts; a registry may be read, and so applied, from any thread (tests, an embedding application): a
    lock keeps each event either in the tally or applied, never both, never neither (about 0.1 µs an event)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._incs: dict[Any, float] = {}  # counter child -> amount not yet applied
        self._observed: dict[Any, tuple[list[float], list[int]]] = {}  # histogram child -> ([sum], bucket counts)

    def inc(self, counter: Any, amount: float = 1) -> None:
        with self._lock:
            self._incs[counter] = self._incs.get(counter, 0) + amount

    def observe(self, histogram: Any, amount: float) -> None:
        self.observe_many(histogram, (amount,))

    def observe_many(self, histogram: Any, amounts: Iterable[float]) -> None:
        bounds = histogram._upper_bounds
        with self._lock:
            seen = self._observed.get(histogram)
            if seen is None:
                seen = self._observed[histogram] = ([0.0], [0] * len(bounds))
            total, counts = seen
            for amount in amounts:
                total[0] += amount
                # The first bucket whose bound is >= amount, as Histogram.observe picks it (the last bound is +Inf).
                counts[bisect.bisect_left(bounds, amount)] += 1

    def apply(self) -> None:
        with self._lock:
            incs, self._incs = self._incs, {}
            observed, self._observed = self._observed, {}
        for counter, amount in incs.items():
            counter.inc(amount)
        for histogram, (total, counts) in observed.items():
            histogram._sum.inc(total[0])
            for value, n in zip(histogram._buckets, counts, strict=True):
                if n:
                    value.inc(n)


class _TalliedRegistry(CollectorRegistry):
    """A registry whose readers (the exposition, get_sample_value) see what the tally holds."""

    def __init__(self, tally: Tally) -> None:
        super().__init__()
        self._tally = tally

    def collect(self) -> Iterator[Metric]:
        self._tally.apply()
        yield from super().collect()


class Metrics:
    def __init__(self, max_queues: int = 1000, queue_idle_seconds: float = 3600.0) -> None:
        # Multi-process mode (`jobq serve --workers N`): values live in files the /metrics endpoint
        # merges; otherwise a registry of this app (tests build many apps in one process).
        self.multiprocess = multiprocess_dir() is not None
        self.tally = Tally()
        self.registry: CollectorRegistry = _TalliedRegistry(self.tally)
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
        self.waiting_jobs = Gauge(
            "jobq_queue_waiting_jobs", "Jobs waiting for their dependencies.", labels, registry=reg, **latest
        )
        self.oldest = Gauge(
            "jobq_queue_oldest_ready_age_seconds", "Age of the oldest ready job.", labels, registry=reg, **latest
        )
        # The scaling signal (app/core/scale.py): what an autoscaler scales workers on (docs/autoscaling.md).
        self.claimable = Gauge(
            "jobq_queue_claimable_jobs",
            "Ready jobs a claim could take now under the queue's limits (concurrency, rate, groups; 0 while paused).",
            labels,
            registry=reg,
            **latest,
        )
        self.running_jobs = Gauge(
            "jobq_queue_running_jobs", "Jobs held by a claim (in flight).", labels, registry=reg, **latest
        )
        self.dead_rows = Gauge(
            "jobq_jobs_dead_rows", "Dead row versions in the jobs table (VACUUM removes them).", registry=reg, **latest
        )
        self.xmin_age = Gauge(
            "jobq_database_oldest_xmin_age_seconds",
            "How long the oldest snapshot that VACUUM must respect has been held.",
            registry=reg,
            **latest,
        )
        self.standbys = Gauge(
            "jobq_replication_standbys",
            "Standbys streaming from the primary, as of this process's newest connection.",
            registry=reg,
            **latest,
        )
        self.asynchronous = Gauge(
            "jobq_replication_asynchronous",
            "1 when the primary has standbys but replicates asynchronously: an acknowledged job may be lost on "
            "failover.",
            registry=reg,
            **latest,
        )
        self.replica_lag = Gauge(
            "jobq_read_replica_lag_seconds",
            "How far the read replica (JOBQ_READ_DATABASE_URL) is behind the primary; NaN when unknown.",
            registry=reg,
            **latest,
        )
        self.replica_serving = Gauge(
            "jobq_read_replica_serving",
            "1 while reads go to the read replica, 0 while they go to the primary.",
            registry=reg,
            **latest,
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
        # Counts since the last flush, by queue; the flush files them under the database's current minute.
        self._minutes: dict[str, _Minute] = {}
        self._flushing = asyncio.Lock()  # one flush at a time (see flush)
        self._children: dict[tuple[str, str], Any] = {}
        self.queue_labels = QueueLabels(max_queues, queue_idle_seconds)
        self._other_depths = False  # the depth gauges have a (other) series

    @property
    def _queue_metrics(self) -> list[Any]:
        return [
            *self.jobs.values(),
            self.empty_claims,
            self.job_duration,
            self.depth,
            self.scheduled,
            self.oldest,
            self.waiting_jobs,
            self.claimable,
            self.running_jobs,
        ]

    def forget_idle_queues(self) -> list[str]:
        """Remove the series of queues idle past JOBQ_METRICS_QUEUE_IDLE_SECONDS (one process only)."""
        if self.multiprocess:
            return []
        self.apply()  # before their series go: what is tallied for them would go to a value no one reads
        gone = self.queue_labels.idle()
        for queue in gone:
            for metric in self._queue_metrics:
                with contextlib.suppress(KeyError):
                    metric.remove(queue)
            for limit in LIMITS:
                with contextlib.suppress(KeyError):
                    self.held_back.remove(queue, limit)
            for key in [k for k in self._children if k[1] == queue]:
                del self._children[key]
        return gone

    def set_depths(self, depths: Iterable[tuple[str, float, float, float, float]]) -> None:
        """(queue, ready, scheduled, oldest ready age, waiting) of every queue. A queue with jobs counts as
        active; an empty one keeps the series it has (at 0) until it goes idle, and gets none otherwise.
        Queues past the cap are summed (the oldest age: the largest) under `(other)`."""
        # (other), once set, is set at every refresh: left alone, it would keep a sum its queues no longer have.
        values: dict[str, list[float]] = {OTHER_QUEUE: [0.0, 0.0, 0.0, 0.0]} if self._other_depths else {}
        for queue, ready, scheduled, oldest, waiting in depths:
            if ready or scheduled or waiting:
                label = self.queue_labels.label(queue)
            elif self.queue_labels.has(queue):
                label = queue
            else:
                continue
            mine = values.setdefault(label, [0.0, 0.0, 0.0, 0.0])
            mine[0] += ready
            mine[1] += scheduled
            mine[2] = max(mine[2], oldest)
            mine[3] += waiting
        self._other_depths = OTHER_QUEUE in values
        for label, (ready, scheduled, oldest, waiting) in values.items():
            self.depth.labels(label).set(ready)
            self.scheduled.labels(label).set(scheduled)
            self.oldest.labels(label).set(oldest)
            self.waiting_jobs.labels(label).set(waiting)

    def set_scale(self, values: Iterable[tuple[str, float, float]]) -> None:
        """(queue, claimable, running) of every queue, labelled as set_depths labels them; queues past the cap
        are summed under `(other)`."""
        sums: dict[str, list[float]] = {OTHER_QUEUE: [0.0, 0.0]} if self._other_depths else {}
        for queue, claimable, running in values:
            if claimable or running:
                label = self.queue_labels.label(queue)
            elif self.queue_labels.has(queue):
                label = queue
            else:
                continue
            mine = sums.setdefault(label, [0.0, 0.0])
            mine[0] += claimable
            mine[1] += running
        for label, (claimable, running) in sums.items():
            self.claimable.labels(label).set(claimable)
            self.running_jobs.labels(label).set(running)

    # -- events ---------------------------------------------------------------------------------------------

    def _minute(self, queue: str) -> _Minute:
        m = self._minutes.get(queue)
        if m is None:
            m = self._minutes[queue] = _Minute()
        return m

    def _child(self, event: str, queue: str) -> Any:
        """The labelled counter; labels() costs microseconds, so each child is looked up once."""
        label = self.queue_labels.label(queue)
        key = (event, label)
        child = self._children.get(key)
        if child is None:
            if event in HELD:
                child = self._children[key] = self.held_back.labels(label, event.removeprefix("held_"))
                return child
            metric = {"empty_claims": self.empty_claims, "duration": self.job_duration}.get(event) or self.jobs[event]
            child = self._children[key] = metric.labels(label)
        return child

    def count(self, event: str, queue: str, n: int = 1) -> None:
        if n <= 0:
            return
        self.tally.inc(self._child(event, queue), n)
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
        self.tally.observe_many(hist, [d / 1000 for d in durations_ms])

    # -- the shared per-minute statistics ------------------------------------------------------------------

    async def flush(self, write: StatsWriter) -> None:
        """Add this process's counts since the last flush to queue_stats (one statement). Flushes take turns,
        and a flush whose caller is cancelled (the service stopping while one is under way) still finishes
        its statement: its counts were taken out, so they are either written or put back, never dropped,
        and the next flush (the last one, at stop) waits for it."""
        flushing = asyncio.ensure_future(self._flush_in_turn(write))
        flushing.add_done_callback(_retrieve)
        await asyncio.shield(flushing)

    async def _flush_in_turn(self, write: StatsWriter) -> None:
        async with self._flushing:
            await self._flush(write)

    async def _flush(self, write: StatsWriter) -> None:
        if not self._minutes:
            return
        pending, self._minutes = self._minutes, {}
        rows = [
            {
                "queue_name": q,
                **m.counts,
                "duration_max_ms": m.duration_max,
                "durations_ms": m.durations,
            }
            for q, m in pending.items()
        ]
        try:
            await write(rows)
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

    def apply(self) -> None:
        """Add what the hot paths counted since the last time to the Prometheus values (see Tally)."""
        self.tally.apply()

    def exposition_registry(self) -> CollectorRegistry:
        if not self.multiprocess:
            return self.registry
        self.apply()  # this process's; the others' within a second (app/maintenance/stats.py TallyApply)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
