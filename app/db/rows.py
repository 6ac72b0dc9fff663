"""Rows as the SQL returns them, read by name: one immutable class per shape, and the row factories
that build them.

psycopg's `class_row` passes every value by keyword; on the hot path that costs more than the statement's
own work per row. These factories build the row positionally instead, after checking once per result
shape that the statement's column names are the class's fields, in order: a statement and its row class
cannot drift apart silently. jsonb columns (payload, result, progress) arrive as text and are passed
through as JSON fragments, never parsed and serialised again.

The rows of the hot paths (a job, a claimed job, a write's outcome) are NamedTuples, built from the
values psycopg hands over in one C call: a frozen dataclass sets each field through object.__setattr__,
which cost 4.9 us per 25-field job row against 0.2 us (measured with timeit), about a fifth of the batch
enqueue's API CPU. The rest are frozen slotted dataclasses, built positionally."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple, TypeVar, cast

from psycopg import AsyncCursor
from psycopg.rows import RowMaker

T = TypeVar("T")


# A job's status: the states of the schema's state machine (CHECK constraints in migrations/0001_jobs.sql),
# the values of a row's `status`, and the API's Status (a docstring here would become its OpenAPI text).
# Members are the strings themselves: `row.status == Status.running` compares two str.
class Status(StrEnum):
    pending = "pending"
    waiting = "waiting"  # for the jobs it depends on (depends_on)
    running = "running"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


# The statuses a job ends in: no claim or write moves it on (a retry starts it again); retention deletes it.
FINISHED = (Status.completed, Status.failed, Status.cancelled)


def _names(cls: type[Any]) -> tuple[str, ...]:
    if issubclass(cls, tuple):
        return tuple(cls._fields)  # type: ignore[attr-defined]
    return tuple(f.name for f in dataclasses.fields(cls))


def _maker(cls: type[T]) -> Callable[[Sequence[Any]], T]:
    """Build a `cls` from its values in field order."""
    if issubclass(cls, tuple):  # a NamedTuple: the values become the tuple, no per-field call
        new = tuple.__new__
        return lambda values: cast(T, new(cls, values))
    return lambda values: cls(*values)


def _check(cls: type[Any], cursor: AsyncCursor[Any], expected: tuple[str, ...]) -> None:
    # The raw result's column names, not cursor.description, which builds an object per column.
    result = cursor.pgresult
    if result is None or not result.nfields:
        return  # a statement that returns no rows (SET): nothing will be built
    got = tuple(result.fname(i).decode() for i in range(result.nfields))  # type: ignore[union-attr]
    if got != expected:
        raise TypeError(f"{cls.__name__}: the statement returns {got}, the class expects {expected}")


def rows_of(cls: type[T]) -> Callable[[AsyncCursor[Any]], RowMaker[T]]:
    """A row factory for `cls`: the statement's columns are its fields, in order."""
    expected = _names(cls)

    def factory(cursor: AsyncCursor[Any]) -> RowMaker[T]:
        _check(cls, cursor, expected)
        return _maker(cls)

    return factory


def outcome_rows(cls: type[T], job: type[Any]) -> Callable[[AsyncCursor[Any]], RowMaker[T]]:
    """A row factory for a write's outcome: `cls`'s own fields first, then its last field `job` built from
    the remaining columns (None when the statement found no job: its id column is NULL)."""
    own = _names(cls)[:-1]
    expected = own + _names(job)
    n = len(own)

    def factory(cursor: AsyncCursor[Any]) -> RowMaker[T]:
        _check(cls, cursor, expected)

        build, inner = _maker(cls), _maker(job)

        def make(values: Sequence[Any]) -> T:
            return build((*values[:n], inner(values[n:]) if values[n] is not None else None))

        return make

    return factory


class JobRow(NamedTuple):
    """A job as the API shows it (app/models/answers.py Job), plus the claim token, which the API never
    shows but the store needs to tell a retried write from a stale one. payload and result are JSON
    text (None when not read)."""

    id: int
    queue: str
    status: str
    payload: str | None
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    last_error: str | None
    result: str | None
    idempotency_key: str | None
    claim_token: str | None
    traceparent: str | None
    schedule: str | None  # the schedule that made it, and the tick it stands for
    scheduled_for: datetime | None
    group: str | None
    progress: str | None  # JSON text: what the worker last reported (heartbeat), None when nothing
    depends_on: list[int] | None  # dependencies between jobs (app/db/dependencies.py)
    on_dependency_failure: str | None
    pending_dependencies: int | None
    timeout_seconds: int | None  # its own hard timeout, as enqueued (None: its queue's, if any)
    unique: str | None = None  # JSON text: a unique job's key and window (None: not a unique job)
    debounce: str | None = None  # JSON text: a debounced job's key and options (None: not debounced)
    has_dependants: bool = False  # some job depends on it (not shown by the API; the release reads it)


class ClaimRow(NamedTuple):
    """A row of a claim statement (app/db/claim.py), either a job handed to a worker (app/models/answers.py
    Claim), with which request of the shared statement it is for (`slot`, in request order) and its rank
    among the statement's jobs, its marker fields NULL; or the statement's one marker row (`marker` true,
    the job's fields NULL), saying what the statement found beside the jobs it claimed. Marker rows never
    leave app/db/claim.py."""

    slot: int
    rank: int
    id: int
    queue: str
    payload: str
    priority: int
    attempts: int
    max_attempts: int
    claim_token: str
    lease_expires_at: datetime
    run_at: datetime
    created_at: datetime
    traceparent: str | None
    group: str | None
    # The marker row's (NULL on a job's):
    marker: bool | None
    limited: bool | None  # the queue has limits (the plain claim then claimed nothing)
    ready_left: bool | None  # ready jobs were left unclaimed
    # The limited claim's figures: what the queue's concurrency and rate limits alone left room for, which
    # group limits held a due job back, when a full rate window lets the next claim through (seconds), and
    # the group of the last job handed out ('': it had none), where a fair queue's next round starts.
    room_concurrency: int | None
    room_rate: int | None
    held_group_concurrency: bool | None
    held_group_rate: bool | None
    held_ordered: bool | None
    wake_in: float | None
    last_group: str | None
    # What the limited claim's rate limits count of it: {"at": its time, "rows": [[group, jobs], ...]}.
    ledger: dict[str, Any] | None


class Inserted(NamedTuple):
    """One enqueued job: `created` is false when its idempotency key or unique key already named the job,
    or when a debounced enqueue replaced the pending job of its key (`replaced`)."""

    created: bool
    job: JobRow
    replaced: bool = False


class Made(NamedTuple):
    """A row of an enqueue that may find or replace a job instead of making one (unique jobs, debounce): per
    input item (`ord`), whether this statement made the job, and the job (None: none made or found)."""

    ord: int
    created: bool
    job: JobRow | None


class Written(NamedTuple):
    """The outcome of a guarded write on one job (complete, fail, release, heartbeat, cancel, retry):
    whether this statement changed the row, and the row (as changed, else as found; None: no such job,
    or none the caller may see)."""

    ord: int
    written: bool
    job: JobRow | None


class Moved(NamedTuple):
    """The outcome of an admin action on one job (cancel, retry): as Written, with the status the job
    had when this statement changed it (None when it did not), which says what the move sets off
    (app/core/effects.py)."""

    ord: int
    written: bool
    was: str | None
    job: JobRow | None


class Beat(NamedTuple):
    """A heartbeat's outcome: the new lease expiry when it renewed, else the job's state as found."""

    ord: int
    lease_expires_at: datetime | None
    status: str | None
    claim_token: str | None
    worker: str | None  # of the renewed claim (NULL when not renewed), and its queue
    queue: str | None


@dataclass(slots=True, frozen=True)
class ScheduleRow:
    """A schedule as the API shows it (app/models/schedules.py Schedule): next_run_at is None while paused.
    `revision` and `next_tick` (the next tick, paused or not) are the service's."""

    name: str
    queue: str
    cron: str
    timezone: str
    payload: str
    priority: int | None
    max_attempts: int | None
    group: str | None
    missed: str
    paused: bool
    next_run_at: datetime | None
    last_run_at: datetime | None
    created_at: datetime
    updated_at: datetime
    revision: int
    next_tick: datetime | None


@dataclass(slots=True, frozen=True)
class DueSchedule:
    """A schedule whose next tick has come, as the scheduler reads it, with the database clock."""

    name: str
    cron: str
    timezone: str
    missed: str
    next_run_at: datetime
    revision: int
    now: datetime


@dataclass(slots=True, frozen=True)
class Fired:
    """A job a schedule made."""

    id: int
    queue: str
    schedule: str
    scheduled_for: datetime


class QueueRow(NamedTuple):
    """A queue in GET /queues (a tuple: a page builds a thousand of them, a frozen dataclass's fields cost a call
    each)."""

    queue: str
    ready: int
    scheduled: int
    running: int
    completed: int
    failed: int
    cancelled: int
    oldest_ready_age: float | None
    paused: bool
    waiting: int
    estimated: bool
    counted_at: datetime | None
    keys_used: int  # the keys of a spread queue (app/db/spread.py) whose counts this row must add up; 1: none


@dataclass(slots=True, frozen=True)
class QueueStatsRow:
    """GET /queues/{queue}/stats as read: counts now, then the window's figures (w_*)."""

    ready: int
    scheduled: int
    oldest_ready_age: float | None
    running: int
    completed: int
    failed: int
    cancelled: int
    on_last: int
    one_left: int
    w_enqueued: int
    w_claimed: int
    w_completed: int
    w_failed: int
    w_retried: int
    w_lease_expired: int
    w_cancelled: int
    w_released: int
    w_empty_claims: int
    w_duration_max_ms: float | None
    w_durations_ms: list[int] | None
    paused: bool
    as_of: datetime
    w_held_concurrency: int
    w_held_rate: int
    w_held_group_concurrency: int
    w_held_group_rate: int
    w_held_ordered: int
    waiting: int
    estimated: bool  # a count past the exact maximum comes from queue_live_counts (app/db/live_counts.py)
    counted_at: datetime | None  # when the background counted this queue (None: not yet, or no live job then)


@dataclass(slots=True, frozen=True)
class GroupsRow:
    """A queue's top groups in GET /queues/{queue}/stats (app/db/operations.py QUEUE_GROUPS)."""

    groups: list[dict[str, Any]]  # {"group", "ready", "running"}, the most ready first
    estimated: bool  # past the exact maximum: some figures come from queue_live_groups (app/db/live_counts.py)
    counted_at: datetime | None  # when the background counted this queue (None: not yet, or no live job then)


@dataclass(slots=True, frozen=True)
class DatabaseHealthRow:
    """What holds vacuum back (app/db/retention.py DATABASE_HEALTH)."""

    jobs_dead_rows: int
    oldest_xmin_age_seconds: float
    oldest_xmin_age_transactions: int
