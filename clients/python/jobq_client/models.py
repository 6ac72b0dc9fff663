"""What the API answers, as typed read-only objects; unknown fields from a newer server are ignored."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast

JobStatus = Literal["pending", "waiting", "running", "completed", "failed", "cancelled"]
OnDependencyFailure = Literal["cancel", "run"]
# A dependency: a job id; in a batch also an earlier item, by its `ref` (a string) or {"ref": index or ref}.
Dependency = int | str | Mapping[str, Any]
FINISHED: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
EnqueueOutcome = Literal["created", "existing", "replaced"]
# The states in which a unique job holds its key (they must include pending and running).
UniqueState = Literal["pending", "running", "completed", "failed", "cancelled"]
CompleteOutcomeKind = Literal["completed", "claim_lost", "not_found", "cancelled", "timed_out"]


def _time(value: Any) -> datetime:
    # RFC 3339 with an offset; "Z" is spelled out for Python 3.10's fromisoformat.
    text = str(value)
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)


def _time_or_none(value: Any) -> datetime | None:
    return None if value is None else _time(value)


@dataclass(frozen=True)
class Unique:
    """Enqueue options of a unique job (the server's docs/producers.md): at most one job per `key` (default:
    a hash of the payload) on the queue while one is in a `while` state (default pending, running,
    completed), and with `for_seconds`, in the same aligned window of that many seconds. A repeat returns
    the job that holds the key."""

    key: str | None = None
    for_seconds: int | None = None
    while_: Sequence[UniqueState] | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.key is not None:
            doc["key"] = self.key
        if self.for_seconds is not None:
            doc["for_seconds"] = self.for_seconds
        if self.while_ is not None:
            doc["while"] = list(self.while_)
        return doc


@dataclass(frozen=True)
class Debounce:
    """Enqueue options of a debounced job (the server's docs/producers.md): while a job with `key` is pending
    on the queue, an enqueue replaces its payload and priority and moves its run time to now + `seconds`,
    never past its first enqueue + `max_wait_seconds` (and never earlier); otherwise it makes a new job."""

    key: str
    seconds: float
    max_wait_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"key": self.key, "seconds": self.seconds}
        if self.max_wait_seconds is not None:
            doc["max_wait_seconds"] = self.max_wait_seconds
        return doc


@dataclass(frozen=True)
class JobDebounce:
    """A debounced job's key and the options of its latest enqueue, as the server shows them."""

    key: str
    seconds: float
    max_wait_seconds: float | None
    run_by: datetime | None  # the latest its run time moves to (None: no limit)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> JobDebounce:
        return cls(
            key=str(doc["key"]),
            seconds=float(doc["seconds"]),
            max_wait_seconds=None if doc.get("max_wait_seconds") is None else float(doc["max_wait_seconds"]),
            run_by=_time_or_none(doc.get("run_by")),
        )


@dataclass(frozen=True)
class JobUnique:
    """A unique job's key and window, as the server shows them."""

    key: str
    for_seconds: int | None
    while_: tuple[str, ...]
    window_start: datetime | None
    window_end: datetime | None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> JobUnique:
        return cls(
            key=str(doc["key"]),
            for_seconds=doc.get("for_seconds"),
            while_=tuple(doc.get("while") or ()),
            window_start=_time_or_none(doc.get("window_start")),
            window_end=_time_or_none(doc.get("window_end")),
        )


@dataclass(frozen=True)
class Job:
    """A job as `GET /jobs/{id}`, enqueue, complete and fail return it (never with its claim token)."""

    id: int
    queue: str
    status: JobStatus
    payload: Any
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    claimed_at: datetime | None = None
    lease_expires_at: datetime | None = None
    finished_at: datetime | None = None
    worker: str | None = None
    last_error: str | None = None
    result: Any = None
    idempotency_key: str | None = None
    traceparent: str | None = None  # W3C trace context of the enqueue (None from a server without tracing)
    schedule: str | None = None  # the schedule that enqueued it, and the tick it stands for
    scheduled_for: datetime | None = None
    group: str | None = None
    timeout_seconds: int | None = None  # its own hard timeout (None: its queue's, if any)
    progress: Any = None  # what the worker last reported with a heartbeat during the latest claim
    depends_on: tuple[int, ...] | None = None  # the jobs it runs after (None: none)
    on_dependency_failure: OnDependencyFailure | None = None  # None for a job without dependencies
    pending_dependencies: int | None = None  # while waiting: dependencies not finished yet
    unique: JobUnique | None = None  # a unique job's key and window
    debounce: JobDebounce | None = None  # a debounced job's key and options
    # On the answer of an enqueue: "created" (a new job), "existing" (its idempotency key or unique key named
    # this job, kept as it was) or "replaced" (a debounced enqueue replaced this pending job); None elsewhere.
    enqueued: EnqueueOutcome | None = None

    @property
    def finished(self) -> bool:
        """completed, failed or cancelled: it will not run again (unless an operator retries it)."""
        return self.status in FINISHED

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Job:
        return cls(
            id=int(doc["id"]),
            queue=str(doc["queue"]),
            status=cast(JobStatus, doc["status"]),
            payload=doc.get("payload"),
            priority=int(doc.get("priority", 0)),
            attempts=int(doc.get("attempts", 0)),
            max_attempts=int(doc.get("max_attempts", 1)),
            run_at=_time(doc["run_at"]),
            created_at=_time(doc["created_at"]),
            claimed_at=_time_or_none(doc.get("claimed_at")),
            lease_expires_at=_time_or_none(doc.get("lease_expires_at")),
            finished_at=_time_or_none(doc.get("finished_at")),
            worker=doc.get("worker"),
            last_error=doc.get("last_error"),
            result=doc.get("result"),
            idempotency_key=doc.get("idempotency_key"),
            traceparent=doc.get("traceparent"),
            schedule=doc.get("schedule"),
            scheduled_for=_time_or_none(doc.get("scheduled_for")),
            group=doc.get("group"),
            timeout_seconds=doc.get("timeout_seconds"),
            progress=doc.get("progress"),
            depends_on=None if doc.get("depends_on") is None else tuple(int(i) for i in doc["depends_on"]),
            on_dependency_failure=doc.get("on_dependency_failure"),
            pending_dependencies=doc.get("pending_dependencies"),
            unique=None if doc.get("unique") is None else JobUnique.from_json(doc["unique"]),
            debounce=None if doc.get("debounce") is None else JobDebounce.from_json(doc["debounce"]),
        )


@dataclass(frozen=True)
class Claim:
    """A claimed job: pass `id` and `claim_token` to heartbeat, complete and fail."""

    id: int
    queue: str
    payload: Any
    priority: int
    attempts: int  # claims so far, this one included
    max_attempts: int
    claim_token: str = field(repr=False)
    lease_expires_at: datetime
    run_at: datetime
    created_at: datetime
    traceparent: str | None = None  # the enqueue's W3C trace context: a job's span continues it

    @property
    def last_attempt(self) -> bool:
        """A failure now fails the job for good."""
        return self.attempts >= self.max_attempts

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Claim:
        return cls(
            id=int(doc["id"]),
            queue=str(doc["queue"]),
            payload=doc.get("payload"),
            priority=int(doc.get("priority", 0)),
            attempts=int(doc["attempts"]),
            max_attempts=int(doc["max_attempts"]),
            claim_token=str(doc["claim_token"]),
            lease_expires_at=_time(doc["lease_expires_at"]),
            run_at=_time(doc["run_at"]),
            created_at=_time(doc["created_at"]),
            traceparent=doc.get("traceparent"),
        )


@dataclass(frozen=True)
class Heartbeat:
    """The renewed lease. `cancel_requested`: an operator cancelled the job; stop, do not complete it
    (the lease is then None: nothing was renewed)."""

    id: int
    lease_expires_at: datetime | None
    cancel_requested: bool = False

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Heartbeat:
        return cls(
            id=int(doc["id"]),
            lease_expires_at=_time_or_none(doc.get("lease_expires_at")),
            cancel_requested=bool(doc.get("cancel_requested", False)),
        )


@dataclass(frozen=True)
class CompleteOutcome:
    """One item of a batch complete: `completed`, or why not."""

    id: int
    outcome: CompleteOutcomeKind
    status: JobStatus | None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CompleteOutcome:
        return cls(
            id=int(doc["id"]),
            outcome=cast(CompleteOutcomeKind, doc["outcome"]),
            status=cast("JobStatus | None", doc.get("status")),
        )


@dataclass(frozen=True)
class JobState:
    """A job's id and status after a write: what complete and fail return with `minimal=True` (the server's
    `Prefer: return=minimal` answer)."""

    id: int
    status: JobStatus

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> JobState:
        # A server without minimal answers sends the whole job: its id and status are read alike.
        return cls(id=int(doc["id"]), status=cast(JobStatus, doc["status"]))


@dataclass(frozen=True)
class Enqueued:
    """An enqueued job's id and status: what enqueue and enqueue_batch return with `minimal=True`.
    `created` is False when the idempotency key already named the job (nothing was written); None when
    the server did not say (one without minimal answers, in a batch)."""

    id: int
    status: JobStatus
    created: bool | None
    # created, existing (an idempotency or unique hit) or replaced (a debounced enqueue); None when the
    # server did not say.
    enqueued: EnqueueOutcome | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], created: bool | None = None) -> Enqueued:
        said = doc.get("created")
        return cls(
            id=int(doc["id"]),
            status=cast(JobStatus, doc["status"]),
            created=created if said is None else said,
            enqueued=cast("EnqueueOutcome | None", doc.get("enqueued")),
        )


@dataclass(frozen=True)
class Claimed:
    """A claim's answer: the jobs claimed, and the outcome of each complete the claim carried, in order."""

    jobs: list[Claim]
    completed: list[CompleteOutcome]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Claimed:
        return cls(
            jobs=[Claim.from_json(j) for j in doc["jobs"]],
            completed=[CompleteOutcome.from_json(o) for o in doc.get("completed", [])],
        )


@dataclass(frozen=True)
class NewJob:
    """One job of a batch enqueue (the fields of a single enqueue)."""

    payload: Any
    priority: int | None = None
    run_at: datetime | str | None = None
    delay_seconds: float | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None
    # Runs once these jobs have completed: job ids, or earlier items of the same batch (their `ref`, or
    # {"ref": index}). See the server's docs/workflows.md.
    depends_on: Sequence[Dependency] | None = None
    on_dependency_failure: OnDependencyFailure | None = None  # "cancel" (the server's default) or "run"
    ref: str | None = None  # this item's name for later items of the same batch
    timeout_seconds: int | None = None  # hard timeout: a claim running this long is failed by the server
    unique: Unique | Mapping[str, Any] | None = None  # at most one such job per key (see Unique)
    debounce: Debounce | Mapping[str, Any] | None = None  # replace the key's pending job (see Debounce)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"payload": self.payload}
        names = ("priority", "delay_seconds", "max_attempts", "idempotency_key", "on_dependency_failure", "ref")
        for name in (*names, "timeout_seconds"):
            value = getattr(self, name)
            if value is not None:
                doc[name] = value
        if self.debounce is not None:
            doc["debounce"] = self.debounce.to_json() if isinstance(self.debounce, Debounce) else dict(self.debounce)
        if self.unique is not None:
            doc["unique"] = self.unique.to_json() if isinstance(self.unique, Unique) else dict(self.unique)
        if self.depends_on is not None:
            doc["depends_on"] = [dict(d) if isinstance(d, Mapping) else d for d in self.depends_on]
        if isinstance(self.run_at, datetime):
            if self.run_at.tzinfo is None:
                raise ValueError("run_at needs a timezone (the server compares it with its own clock)")
            doc["run_at"] = self.run_at.isoformat()
        elif self.run_at is not None:
            doc["run_at"] = self.run_at
        return doc
