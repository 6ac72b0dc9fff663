"""What a job's change of state sets off: one table (TABLE), applied in one place (Effects.apply()).

Every write path reports what its statement moved (Moves, after it committed) and apply() turns that
into wake-ups of claims, wake-ups of result waits and counts; no path chooses them itself.

A row of TABLE is a transition (from, to) of the state machine whose states are the schema's statuses
(migrations/0001_jobs.sql, 0010_dependencies.sql), plus NEW (no row yet), GONE (deleted by retention) and
SCHEDULED: `pending` with its run_at ahead. SCHEDULED is only ever a to-state: no write makes a job due,
time does, and the fallback poll (app/maintenance/poll.py) finds it then. A job leaving `pending` leaves it
as PENDING, due or not.

What a row sets off:
  * claims: "now", jobs became claimable on the queue: wake the claims waiting on it (here and wherever
    they wait, app/core/wakeups.py); "slot", a job let go of a place under a limit (a running job left
    `running`, or a pending one that held its ordered group's turn left `pending`): wake them only when
    the queue may have limits (app/core/flow.py QueueConfigs.may_be_limited: a limited configuration, or
    one this process does not hold); "none".
  * results: the job reached a final status: wake the requests waiting for its result (app/core/results.py).
  * paths: the write paths that make this move, and what each counts per job (app/observability/metrics.py
    EVENTS; "swept_<action>" is jobq_sweeper_rows_total, "ticks_enqueued" jobq_schedule_ticks_total).
    The same move counts differently by cause: a running job back to pending is a retry, a release, a
    lapsed lease or a hand-back of a claim nobody received. A path that reports a move its row does not
    list is a bug, and apply() says so.

The dependency release (app/core/dependencies.py, path DEPENDENCY) reports its moves like every other
path: a waiting job made `pending` or cancelled because the jobs it waits for finished. It runs after the
statement that finished them, in the request (the direct dependants) or in the background service
(app/maintenance/releaser.py), so its wake-ups travel the same way as everyone's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from app.core.flow import QueueConfigs
from app.core.wakeups import Wakeups
from app.db.rows import Status
from app.db.spread import logical
from app.observability.metrics import Metrics

# The schema's statuses (app/db/rows.py Status; a StrEnum member is its string), and the three states only
# this table knows.
PENDING, WAITING, RUNNING = Status.pending, Status.waiting, Status.running
COMPLETED, FAILED, CANCELLED = Status.completed, Status.failed, Status.cancelled
NEW, GONE, SCHEDULED = "new", "gone", "scheduled"


class Path(StrEnum):
    """A write path: the code that runs a statement and reports its moves."""

    ENQUEUE = "enqueue"  # app/core/jobs.py, the shared insert statement
    ENQUEUE_DEPENDENT = "enqueue_dependent"  # app/core/jobs.py, jobs with depends_on
    SCHEDULE = "schedule"  # app/maintenance/scheduler.py
    CLAIM = "claim"  # app/core/dispatcher.py, plain and limited claims
    COMPLETE = "complete"  # app/core/jobs.py, single, batch and carried by a claim
    FAIL = "fail"
    RELEASE = "release"  # a worker hands its claim back
    HAND_BACK = "hand_back"  # app/core/dispatcher.py: claimed for a request that went away
    RESCUE = "rescue"  # app/maintenance/rescuer.py, lapsed leases
    TIMEOUT = "timeout"  # app/maintenance/timeouts.py, hard timeouts
    CANCEL = "cancel"  # app/core/operations.py
    BULK_CANCEL = "bulk_cancel"  # app/core/search.py
    PURGE = "purge"  # app/core/sqs.py, SQS PurgeQueue and DeleteQueue
    RETRY = "retry"
    BULK_RETRY = "bulk_retry"
    REDRIVE = "redrive"
    RETENTION = "retention"  # app/maintenance/retention.py
    DEPENDENCY = "dependency"  # app/core/dependencies.py, the release of jobs waiting for finished ones


Claims = Literal["none", "slot", "now"]


@dataclass(frozen=True, slots=True)
class Effect:
    paths: Mapping[Path, tuple[str, ...]]
    claims: Claims = "none"
    results: bool = False


_ENQUEUED = ("enqueued",)
_CANCEL = {Path.CANCEL: ("cancelled",), Path.BULK_CANCEL: ("cancelled",), Path.PURGE: ("cancelled",)}
_RETRY = {Path.RETRY: (), Path.BULK_RETRY: ()}

TABLE: Mapping[tuple[str, str], Effect] = {
    # Arrivals. A job due later wakes claims too, as an enqueue always has: they find nothing yet, but the
    # statement tidies the queue's line of answered claims, which the fallback poll forgets only then
    # (app/core/dispatcher.py; tests/test_flow.py's fair rotation relies on it). A job waiting for its
    # dependencies wakes nothing.
    (NEW, PENDING): Effect(
        {Path.ENQUEUE: _ENQUEUED, Path.ENQUEUE_DEPENDENT: _ENQUEUED, Path.SCHEDULE: ("enqueued", "ticks_enqueued")},
        claims="now",
    ),
    (NEW, SCHEDULED): Effect({Path.ENQUEUE: _ENQUEUED, Path.ENQUEUE_DEPENDENT: _ENQUEUED}, claims="now"),
    # The direct hand-off (app/core/dispatcher.py): claimed for a parked claim in the enqueue's own transaction.
    # Nothing is left for any other claim to take: it wakes nobody.
    (NEW, RUNNING): Effect({Path.ENQUEUE: ("enqueued", "claimed")}),
    (NEW, WAITING): Effect({Path.ENQUEUE_DEPENDENT: _ENQUEUED}),
    # A dependency already failed or cancelled (on_dependency_failure: cancel).
    (NEW, CANCELLED): Effect({Path.ENQUEUE_DEPENDENT: ("enqueued", "cancelled")}, results=True),
    # The claim. Held-back and empty claims are counted by the dispatcher: they are not moves.
    (PENDING, RUNNING): Effect({Path.CLAIM: ("claimed",)}),
    # Leaving `running`: a slot is free under a concurrency limit.
    (RUNNING, COMPLETED): Effect({Path.COMPLETE: ("completed",)}, claims="slot", results=True),
    (RUNNING, FAILED): Effect(
        {
            Path.FAIL: ("failed",),
            Path.RESCUE: ("lease_expired", "failed", "swept_failed"),
            Path.TIMEOUT: ("failed", "swept_timed_out"),
        },
        claims="slot",
        results=True,
    ),
    (RUNNING, PENDING): Effect(
        {
            Path.FAIL: ("retried",),  # retry_in_seconds: 0
            Path.RELEASE: ("released",),  # delay_seconds: 0
            Path.RESCUE: ("lease_expired", "swept_rescued"),
            Path.HAND_BACK: (),
        },
        claims="now",
    ),
    (RUNNING, SCHEDULED): Effect(
        {Path.FAIL: ("retried",), Path.RELEASE: ("released",), Path.TIMEOUT: ("retried", "swept_timed_out")},
        claims="slot",
    ),
    (RUNNING, CANCELLED): Effect(_CANCEL, claims="slot", results=True),
    # A pending job may hold its ordered group's turn (docs/flow-control.md), due or not; a waiting one
    # holds nothing (docs/workflows.md).
    (PENDING, CANCELLED): Effect(_CANCEL, claims="slot", results=True),
    (WAITING, CANCELLED): Effect({**_CANCEL, Path.DEPENDENCY: ()}, results=True),
    (WAITING, PENDING): Effect({Path.DEPENDENCY: ()}, claims="now"),
    # Back from a final status, due at once.
    (FAILED, PENDING): Effect({**_RETRY, Path.REDRIVE: ()}, claims="now"),
    (CANCELLED, PENDING): Effect(_RETRY, claims="now"),
    (COMPLETED, PENDING): Effect(_RETRY, claims="now"),  # a replay
    (COMPLETED, GONE): Effect({Path.RETENTION: ("swept_deleted",)}),
    (FAILED, GONE): Effect({Path.RETENTION: ("swept_deleted",)}),
    (CANCELLED, GONE): Effect({Path.RETENTION: ("swept_deleted",)}),
}


@dataclass(slots=True)
class Moves:
    """What one statement moved, summed per (queue, from, to): callers add a count per key, not an object
    per job. Ids are those of the jobs moved, where the path has them (apply() hands them to the result
    waiters when the row says so); durations (claim to completion, ms) are the completes'."""

    path: Path
    counts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    ids: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    durations: dict[str, list[float]] = field(default_factory=dict)

    def add(self, queue: str, frm: str, to: str, n: int = 1) -> None:
        key = (queue, frm, to)
        self.counts[key] = self.counts.get(key, 0) + n

    def add_jobs(self, queue: str, frm: str, to: str, ids: Sequence[int]) -> None:
        key = (queue, frm, to)
        self.counts[key] = self.counts.get(key, 0) + len(ids)
        self.ids.setdefault(key, []).extend(ids)

    def completed(self, queue: str, ids: Sequence[int], durations_ms: Sequence[float]) -> None:
        self.add_jobs(queue, RUNNING, COMPLETED, ids)
        self.durations.setdefault(queue, []).extend(durations_ms)

    def __bool__(self) -> bool:
        return bool(self.counts)


class UnlistedMove(Exception):
    """A path reported a move that TABLE does not list for it."""


class Effects:
    """The one place a statement's moves become wake-ups and counts (built once per process)."""

    def __init__(self, wakeups: Wakeups, metrics: Metrics, configs: QueueConfigs) -> None:
        self.wakeups = wakeups
        self.metrics = metrics
        self.configs = configs

    def apply(self, moves: Moves) -> None:
        """After the statement committed: what TABLE says each of its moves sets off."""
        if not moves.counts:
            return
        now: set[str] = set()
        slot: set[str] = set()
        finished: list[int] = []
        for key, n in moves.counts.items():
            queue, frm, to = key
            effect = TABLE.get((frm, to))
            if effect is None or moves.path not in effect.paths:
                raise UnlistedMove(f"{moves.path}: {frm} -> {to}")
            if effect.claims == "now":
                now.add(queue)
            elif effect.claims == "slot":
                slot.add(queue)
            if effect.results:
                finished.extend(moves.ids.get(key, ()))
            for event in effect.paths[moves.path]:
                self._count(event, queue, n, moves)
        if finished:
            self.wakeups.jobs_finished(finished)
        # Queues known to have no limits gain nothing claimable from a freed slot: left alone.
        # (A spread queue's key is asked about by its queue's name: app/db/spread.py.)
        now.update(q for q in slot - now if self.configs.may_be_limited(logical(q)))
        if now:
            self.wakeups.jobs_available(now)

    def _count(self, event: str, queue: str, n: int, moves: Moves) -> None:
        # Counted under the queue's name: a spread queue's moves name the key they happened under.
        label = logical(queue)
        if event == "completed":
            self.metrics.completed(label, moves.durations.get(queue, []))
        elif event.startswith("swept_"):
            self.metrics.swept.labels(event.removeprefix("swept_")).inc(n)
        elif event == "ticks_enqueued":
            self.metrics.schedule_ticks.labels("enqueued").inc(n)
        else:
            self.metrics.count(event, label, n)
