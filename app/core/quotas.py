"""What an enqueue is held to besides its body: a queue's most jobs not yet started (`max_pending`, else
JOBQ_MAX_PENDING_JOBS: 429 `queue-full`) and the most live queues (JOBQ_MAX_QUEUES: 409 `too-many-queues`),
each refused before anything is written.

Neither counts per enqueue: counting a million pending jobs takes 65 ms (150-200 ms on a loaded machine),
the enqueue itself a fraction of a millisecond. Each process keeps, per queue it enqueues to, the last count
it took and what it has enqueued itself since, and admits an enqueue when the two together stay within the
limit: a lookup, a comparison and two additions. The count is taken again in the background once it is
older than JOBQ_PENDING_COUNT_INTERVAL_MS (ten times that while the queue was under half its limit; and
never more often than every twenty times the last count's own duration, so that counts of a big backlog
take at most a twentieth of a database core per queue and process), and at once, on the request's path,
only when an enqueue would pass the limit by the count in hand (so that a queue that drained is seen to
have room). The first enqueue of a queue in a process waits for its first count. Each count stops at the
limit, so it costs min(backlog, limit) index entries.

How exact: this process's own enqueues are counted as they are admitted, so one process alone never passes a
limit (an enqueue still being written when a count starts stays added after it, and may be in the count
too: counted twice, it errs on the side of refusing; one that fails gives its place back). Other processes'
enqueues are seen at the next count: a queue may hold more than its limit by what the other processes
(replicas, --workers) enqueue into it between two counts: one interval (ten while it was under half its
limit; twenty count durations when those are longer: 1.3-4 s for a million jobs). An idempotency key that
names an existing job takes a place until the next count. The same holds for the number of queues, counted
at most once per interval, and then only for a queue this process has not seen live within the last
minute."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from app.core.flow import QueueConfigs
from app.db import quotas as store
from app.db.pool import Database
from app.errors import QueueFull, TooManyQueues
from app.settings import Settings

log = logging.getLogger("jobq.quotas")

MAX_QUEUES_TRACKED = 10_000  # per process; past it the entries are dropped and counted again on next use
KNOWN_SECONDS = 60.0  # a queue seen live is not checked again for this long
FAR_FACTOR = 10  # counts are this many times rarer while a queue is under half its limit
COST_FACTOR = 20  # and never closer together than this many times the last count's duration


@dataclass(slots=True)
class _Backlog:
    count: int  # jobs not yet started at the last count
    at: float  # monotonic time that count was started
    added: int = 0  # jobs this process admitted since that count started (or still being written then)
    writing: int = 0  # of those, jobs admitted whose insert has not ended
    counted: bool = False  # a count has been taken (until then, enqueues wait for the first)
    cap: int = 0  # the count stopped there: a limit raised past it needs a count again
    took: float = 0.0  # seconds the last count took
    due: float = 0.0  # monotonic time the next count is due (in the background)
    fast_until: float = 0.0  # until then (the next count due, the queue known live), admit() takes the fast path
    refresh: asyncio.Future[None] | None = field(default=None, repr=False)  # the count being taken


class EnqueueQuotas:
    """The per-process counts behind `max_pending` and JOBQ_MAX_QUEUES (see the module's docstring)."""

    def __init__(self, settings: Settings, db: Database, configs: QueueConfigs) -> None:
        self.settings = settings
        self.db = db
        self.configs = configs  # a spread queue's keys (app/db/spread.py), whose jobs its limit counts together
        self.interval = settings.pending_count_interval_ms / 1000
        self._backlogs: dict[str, _Backlog] = {}
        self._known: dict[str, float] = {}  # queue -> monotonic time until which it counts as live
        self._queues: _Backlog | None = None  # the live queues, as _Backlog counts jobs
        self._queues_lock = asyncio.Lock()
        self.counts = 0  # backlog counts taken (tests, diagnostics)

    async def admit(self, queue: str, jobs: int, limit: int) -> None:
        """Admit `jobs` new jobs onto `queue`, whose limit of jobs not yet started is `limit`, or raise."""
        now = time.monotonic()
        entry = self._backlogs.get(queue)
        # The enqueue's path, for a queue far from its limit: a lookup, a comparison, two additions.
        if entry is not None and now < entry.fast_until and entry.count + entry.added + jobs <= limit < entry.cap:
            entry.added += jobs
            entry.writing += jobs
            return
        await self._admit(queue, jobs, limit, now)

    async def _admit(self, queue: str, jobs: int, limit: int, now: float) -> None:
        if self._known.get(queue, 0.0) < now:
            await self._admit_queue(queue, now)
        entry = self._backlogs.get(queue)
        if entry is None:
            if len(self._backlogs) >= MAX_QUEUES_TRACKED:
                self._backlogs.clear()
            entry = self._backlogs[queue] = _Backlog(count=0, at=now)
        if not entry.counted or limit >= entry.cap:
            await asyncio.shield(self._counting(queue, entry, limit))
        if entry.count + entry.added + jobs > limit:
            if now - entry.at >= min(self.interval, 0.1):  # the count in hand may be stale: take it again now
                await asyncio.shield(self._counting(queue, entry, limit))
            # No await from here on: the check and the addition see the same figures.
            if entry.count + entry.added + jobs > limit:
                raise QueueFull(
                    f"Queue `{queue}` holds {entry.count + entry.added} jobs not yet started, its limit is {limit} "
                    f"(its `max_pending`, or JOBQ_MAX_PENDING_JOBS); nothing was enqueued. Retry once workers "
                    "have taken some."
                )
        entry.added += jobs
        entry.writing += jobs
        if now >= entry.due:
            self._counting(queue, entry, limit)  # in the background
        entry.fast_until = min(entry.due, self._known.get(queue, 0.0)) if entry.refresh is None else 0.0

    def written(self, queue: str, jobs: int, ok: bool) -> None:
        """The insert of `jobs` that admit() let through has ended; when it failed, they give their place back."""
        entry = self._backlogs.get(queue)
        if entry is not None:
            entry.writing = max(0, entry.writing - jobs)
            if not ok:
                entry.added = max(0, entry.added - jobs)

    # -- jobs not yet started --------------------------------------------------------------------------------

    def _counting(self, queue: str, entry: _Backlog, limit: int) -> asyncio.Future[None]:
        """The count of the queue's jobs not yet started being taken: one at a time per queue, shared."""
        if entry.refresh is None:
            entry.refresh = asyncio.ensure_future(self._count(queue, entry, limit))

            def done(f: asyncio.Future[None]) -> None:
                entry.refresh = None
                if not f.cancelled() and (exc := f.exception()) is not None:
                    log.debug("counting the jobs not yet started of %s failed: %s", queue, exc)

            entry.refresh.add_done_callback(done)
        return entry.refresh

    async def _count(self, queue: str, entry: _Backlog, limit: int) -> None:
        # Jobs written before the count starts are in it; those still being written may or may not be, and stay
        # added (counted twice at worst: on the side of refusing).
        started, written_before = time.monotonic(), entry.added - entry.writing
        # A spread queue's backlog is that of all its keys, each counted on its own (one shard on Citus), each up
        # to the limit: their sum reaches it as soon as the queue's backlog does.
        names = (await self.configs.get(queue)).keys or (queue,)
        async with self.db.connection() as conn:
            count = 0
            for name in names:
                count += await store.queue_backlog_count(conn, name, limit + 1)
                if count > limit:
                    break
        self.counts += 1
        entry.count, entry.at, entry.counted, entry.cap = count, started, True, limit + 1
        entry.took = time.monotonic() - started
        # Counted again one interval on (ten while under half the limit), and never sooner than twenty times
        # what this count took.
        interval = self.interval if 2 * count >= limit else self.interval * FAR_FACTOR
        entry.due = started + max(interval, COST_FACTOR * entry.took)
        entry.added -= written_before

    # -- live queues -------------------------------------------------------------------------------------------

    async def _admit_queue(self, queue: str, now: float) -> None:
        cap = self.settings.max_queues
        async with self.db.connection() as conn:
            live = await store.queue_live(conn, queue)
        if not live:
            async with self._queues_lock:  # one new queue at a time per process: the count is exact for it
                counted = self._queues
                if counted is None or counted.count + counted.added >= cap or now - counted.at >= self.interval:
                    started = time.monotonic()
                    async with self.db.connection() as conn:
                        counted = self._queues = _Backlog(await store.queues_live_count(conn, cap + 1), started)
                if counted.count + counted.added >= cap:
                    raise TooManyQueues(
                        f"This service holds {cap} live queues (JOBQ_MAX_QUEUES): queues with jobs not yet finished "
                        f"or a configuration. `{queue}` would be one more; nothing was enqueued."
                    )
                counted.added += 1
        if len(self._known) >= MAX_QUEUES_TRACKED:
            self._known.clear()
        self._known[queue] = now + KNOWN_SECONDS
