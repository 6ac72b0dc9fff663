"""The background dependency release: the cascades a request left (a fan-out wider than one batch, the
levels below the first of a cancellation), those of the jobs finished in the background (the lease
rescuer's terminal fails, an SQS purge), and whatever a process that died mid-way left.

Runs in every API process: a pass takes each queue with outbox rows in turn and runs release steps on it
(app/core/dependencies.py; SKIP LOCKED, so replicas share the work, and one that died mid-step leaves its
rows to the others), a slice of time per queue so that a big cascade in one queue delays none in another.
A step follows up to LEVELS_PER_STEP levels of a cascade in one transaction (a chain goes that much
faster); one that fails (a dependant locked past the statement budget, say) is undone whole, and the queue
goes on a level per transaction, so the levels before the trouble are kept; a queue whose single-level step
fails is logged and tried again on the next pass, the others go on. A finish pokes it;
otherwise it looks every JOBQ_DEPENDENCY_INTERVAL_SECONDS.

Every JOBQ_DEPENDENCY_RECONCILE_SECONDS a pass also reconciles: it gives dependency rows written by a
process of the previous release their queue names, and records, queue by queue and a bounded page at a
time, the parents that finished without a record (finished by such a process). During a rolling upgrade
their dependants are released within that interval; after it, the walk finds nothing to record."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from app.core.dependencies import DependencyRelease
from app.maintenance.base import Ticking, between_batches
from app.observability.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("jobq.releaser")

SLICE_SECONDS = 0.5  # of one pass, per queue, before the next queue's turn
LEVELS_PER_STEP = 10  # of a cascade, in one transaction; after a step that failed, one level at a time
SINGLE_LEVEL_SECONDS = 30.0  # ... on that queue for this long
QUEUES_PER_LOOK = 100  # queues with outbox rows read at a time
RECONCILE_QUEUES = 1000  # parent queues walked by one reconciliation (the next one goes on from there)
RECONCILE_PAGES = 20  # pages of one queue's dependency rows per reconciliation (likewise)


@dataclass
class ReleaseResult:
    released: int = 0
    cancelled: int = 0
    steps: int = 0
    errors: int = 0
    recorded: int = 0  # by the reconciliation
    more: bool = False  # stopped with work left (its slice ran out): the next pass comes at once


class DependencyReleaser(Ticking):
    name = "releaser"

    def __init__(self, settings: Settings, release: DependencyRelease, metrics: Metrics) -> None:
        super().__init__(settings.dependency_interval_seconds, metrics)
        self.release = release
        self.reconcile_every = settings.dependency_reconcile_seconds
        self._reconciled = -1e18
        self._queue_cursor = ""  # the reconciliation's place among the parent queues
        self._page_cursor: dict[str, int] = {}
        self._more = False
        self._single: dict[str, float] = {}  # queue -> until when its steps go one level at a time
        release.backlog = self.poke

    def next_delay(self) -> float:
        return 0.0 if self._more else super().next_delay()

    async def run_once(self, reconcile: bool | None = None) -> ReleaseResult:
        """One pass over every queue with outbox rows (a slice each); with `reconcile` (by default: when one
        is due) the reconciliation first."""
        out = ReleaseResult()
        now = time.monotonic()
        self._single = {q: t for q, t in self._single.items() if t > now}
        if reconcile or (reconcile is None and time.monotonic() - self._reconciled >= self.reconcile_every):
            self._reconciled = time.monotonic()
            out.recorded = await self._reconcile(out)
        after = ""
        while queues := await self.release.queues_with_work(after, QUEUES_PER_LOOK):
            for queue in queues:
                await self._drain(queue, out)
            after = queues[-1]
        self._more = out.more
        if out.released or out.cancelled:
            log.info(
                "dependants released",
                extra={"released": out.released, "cancelled": out.cancelled, "steps": out.steps, "more": out.more},
            )
        return out

    async def _drain(self, queue: str, out: ReleaseResult) -> None:
        """Steps on one queue until it has no work left or its slice of the pass ran out."""
        until = time.monotonic() + SLICE_SECONDS
        levels = 1 if self._single.get(queue, 0.0) > time.monotonic() else LEVELS_PER_STEP
        while True:
            try:
                step = await self.release.step(queue, levels=levels)
            except Exception:
                if levels > 1:
                    # Undone whole: a level at a time now (and for a while on this queue), each committed, up
                    # to whatever held it up; a slice of its own for that.
                    log.warning("%s: a step on queue %r failed; one level at a time", self.name, queue, exc_info=True)
                    levels = 1
                    self._single[queue] = time.monotonic() + SINGLE_LEVEL_SECONDS
                    until = time.monotonic() + SLICE_SECONDS
                    continue
                out.errors += 1
                self.metrics.maintenance_errors.labels(self.name).inc()
                log.exception("%s: a step on queue %r failed; the other queues go on", self.name, queue)
                return
            out.steps += 1
            out.released += step.released
            out.cancelled += step.cancelled
            if not step.more and not (step.released or step.cancelled or step.edges):
                return
            if time.monotonic() > until:
                out.more = True
                return
            await between_batches()

    async def _reconcile(self, out: ReleaseResult) -> int:
        recorded = 0
        try:
            while await self.release.fill_legacy() > 0:
                await between_batches()
        except Exception:
            out.errors += 1
            self.metrics.maintenance_errors.labels(self.name).inc()
            log.exception("%s: dependency rows of a previous release could not be completed", self.name)
        queue = self._queue_cursor
        for _ in range(RECONCILE_QUEUES):
            try:
                found = await self.release.next_parent_queue(queue)
            except Exception:
                out.errors += 1
                log.exception("%s: the reconciliation stopped", self.name)
                return recorded
            if found is None:
                self._queue_cursor = ""
                return recorded
            queue = found
            try:
                recorded += await self._reconcile_queue(queue)
            except Exception:
                out.errors += 1
                self.metrics.maintenance_errors.labels(self.name).inc()
                log.exception("%s: reconciling queue %r failed; the other queues go on", self.name, queue)
        self._queue_cursor = queue  # the next reconciliation goes on from here
        return recorded

    async def _reconcile_queue(self, queue: str) -> int:
        after = self._page_cursor.pop(queue, 0)
        recorded = 0
        for _ in range(RECONCILE_PAGES):
            seen, last, n = await self.release.reconcile_queue(queue, after)
            recorded += n
            if last is None or seen < self.release.batch:
                return recorded
            after = last
            await between_batches()
        self._page_cursor[queue] = after
        return recorded
