"""Answer bodies of the jobs API, health and problems: documentation of what the handlers serialise with orjson."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from app.db.rows import Status
from app.models.fields import Json, _omittable_schema
from app.models.jobs import OnDependencyFailure

# --- responses (documentation of what the handlers serialise with orjson) -----------------------------------


class JobUnique(BaseModel):
    """A unique job's key and window, as enqueued (docs/producers.md)."""

    key: str = Field(description="The unique key (the one given, else the SHA-256 of the payload, in hex).")
    for_seconds: int | None = Field(description="The window's length; null: no window.")
    while_: list[Status] = Field(alias="while", description="The states in which the job holds the key.")
    window_start: datetime | None = Field(description="Start of the window the job was enqueued in.")
    window_end: datetime | None = Field(description="End of that window: from then on the key is free again.")


class JobDebounce(BaseModel):
    """A debounced job's key and the options of its latest enqueue (docs/producers.md)."""

    key: str
    seconds: float = Field(description="Quiet time after the latest enqueue.")
    max_wait_seconds: float | None = Field(description="Longest wait from the first enqueue; null: no limit.")
    run_by: datetime | None = Field(
        description="The latest its run time moves to (first enqueue + max_wait_seconds); null: no limit."
    )


class Job(BaseModel):
    id: int
    queue: str
    status: Status
    payload: Json
    priority: int
    attempts: int = Field(description="Claims so far, the current one included.")
    max_attempts: int
    run_at: datetime = Field(description="Earliest time the job may be claimed (next retry when pending).")
    created_at: datetime
    claimed_at: datetime | None = Field(description="Start of the latest claim.")
    lease_expires_at: datetime | None
    finished_at: datetime | None
    worker: str | None = Field(description="Worker of the latest claim.")
    last_error: str | None
    result: Json = Field(description="What the worker completed it with; null until then.")
    idempotency_key: str | None
    traceparent: str | None = Field(
        description="W3C trace context of the enqueue that made the job (its request's span when the service "
        "traces, else the producer's `traceparent` header); a worker continues this trace. Null when none."
    )
    schedule: str | None = Field(description="The schedule that enqueued this job; null for other jobs.")
    scheduled_for: datetime | None = Field(
        description="The schedule's tick this job stands for (its cron time); null for other jobs."
    )
    group: str | None = Field(description="The job's group; null: none.")
    progress: Json = Field(
        description="What the worker last reported with a heartbeat's `progress` during the latest claim; "
        "null when it reported nothing (a new claim clears it)."
    )
    depends_on: list[int] | None = Field(description="The jobs this one runs after, as enqueued; null: none.")
    on_dependency_failure: OnDependencyFailure | None = Field(
        description="What a failed or cancelled dependency does to this job; null for a job without dependencies."
    )
    pending_dependencies: int | None = Field(
        description="While `waiting`: how many of its dependencies have not finished yet; null otherwise."
    )
    timeout_seconds: int | None = Field(
        description="Its own hard timeout, as enqueued; null: its queue's `timeout_seconds`, if any."
    )
    unique: JobUnique | None = Field(description="A unique job's key and window; null for other jobs.")
    debounce: JobDebounce | None = Field(description="A debounced job's key and options; null for other jobs.")


class JobList(BaseModel):
    jobs: list[Job]


# Minimal answers: with `Prefer: return=minimal` (RFC 7240), the writes answer ids and states only.


class JobState(BaseModel):
    """A complete's or fail's answer with `Prefer: return=minimal`: the job's id and its status after the call."""

    id: int
    status: Status


class EnqueuedJob(BaseModel):
    """An enqueue's answer (one item of a batch enqueue's) with `Prefer: return=minimal`."""

    id: int
    status: Status
    created: bool = Field(
        description="false: the idempotency key or unique key already named this job, or a debounced enqueue "
        "replaced the pending job of its key (a single enqueue then answers 200, not 201)."
    )
    enqueued: Literal["created", "existing", "replaced"] = Field(
        description="`created` when this call made the job, `existing` when its idempotency key or unique key "
        "already named it (kept as it was), `replaced` when a debounced enqueue replaced the pending job of its key."
    )


class MinimalEnqueuedJobs(BaseModel):
    """A batch enqueue's answer with `Prefer: return=minimal`: one item per job, in request order."""

    jobs: list[EnqueuedJob]


class EnqueuedJobs(JobList):
    enqueued: list[Literal["created", "existing", "replaced"]] = Field(
        description="Per job, in order: `created` when this call made it, `existing` when its idempotency key "
        "or unique key already named it (the job is then the one found, kept as it was), `replaced` when a "
        "debounced item replaced the pending job of its key."
    )


class Claim(BaseModel):
    id: int
    queue: str
    payload: Json
    priority: int
    attempts: int = Field(description="Claims so far, this one included.")
    max_attempts: int
    claim_token: str = Field(description="Pass it to heartbeat, complete and fail.")
    lease_expires_at: datetime
    run_at: datetime
    created_at: datetime
    traceparent: str | None = Field(
        description="W3C trace context of the enqueue that made the job (its request's span when the service "
        "traces, else the producer's `traceparent` header): start the job's span as its child. Null when none."
    )
    group: str | None = Field(description="The job's group; null: none.")


class CompleteOutcome(BaseModel):
    id: int
    outcome: Literal["completed", "claim_lost", "not_found", "cancelled", "timed_out"]
    status: Status | None = Field(description="The job's status after the call; null when not found.")


class ClaimResponse(BaseModel):
    jobs: list[Claim]
    completed: list[CompleteOutcome] = Field(
        description="The outcome of each item of the request's `complete`, in order (empty when it had none)."
    )


class HeartbeatResponse(BaseModel):
    id: int
    lease_expires_at: datetime | None = Field(description="The new expiry; null when the job was cancelled.")
    cancel_requested: bool = Field(
        description="An operator cancelled the job: stop working on it and do not complete it."
    )


class CompleteBatchResponse(BaseModel):
    results: list[CompleteOutcome] = Field(description="One per item, in request order.")


class Health(BaseModel):
    status: Literal["ok"]
    version: str = Field(description="The jobq release this process runs (semantic versioning; CHANGELOG.md).")


class ReplicationSummary(BaseModel):
    """The primary's replication, as jobq's newest connection to it found it (app/db/replication.py)."""

    mode: Literal["none", "synchronous", "asynchronous"] = Field(
        description="`synchronous`: a commit waits for a standby (synchronous_standby_names is set), so an "
        "acknowledged job survives a failover to it. `asynchronous`: standbys stream but no commit waits for "
        "them: a job acknowledged just before a failover may be missing on the promoted standby. `none`: no "
        "standby streams from the primary (or none jobq can see)."
    )
    standbys: int = Field(description="Standbys streaming from the primary (pg_stat_replication).")
    synchronous_standbys: int | None = Field(
        description="Of them, those a commit waits for; null when jobq's role cannot see it (grant pg_monitor)."
    )
    warning: str | None = Field(description="What may be lost, or may wait, in this state; null when nothing.")


class Replication(ReplicationSummary):
    synchronous_standby_names: str = Field(description="The primary's setting (empty: asynchronous).")
    server_synchronous_commit: str = Field(
        description="The server's default synchronous_commit; jobq's own sessions always use `on`."
    )


class ReadReplica(BaseModel):
    """The read replica (JOBQ_READ_DATABASE_URL) and whether reads go to it now."""

    serving: bool = Field(description="Reads that may lag go to the replica now (else to the primary).")
    lag_seconds: float | None = Field(
        description="How long ago the primary was where the replica is now; null when unknown (replica down)."
    )
    max_lag_seconds: float = Field(description="JOBQ_READ_MAX_LAG_SECONDS: past it, reads go to the primary.")
    reason: str | None = Field(description="Why reads go to the primary, when they do.")


class Readiness(BaseModel):
    status: Literal["ready"]
    replication: ReplicationSummary | None = Field(
        description="The primary's replication (null until a connection has read it)."
    )
    read_replica: ReadReplica | None = Field(description="Null without JOBQ_READ_DATABASE_URL.")


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(
        description="Where: `body`, `path`, `query` or `header`, then field names and list indexes."
    )
    msg: str = Field(description="What is wrong, in words.")
    type: str = Field(description="The kind of error (pydantic's error type, e.g. `missing`, `greater_than`).")


class Problem(BaseModel):
    type: str = Field(description="A stable URN, `urn:jobq:problem:<slug>`: branch on this, not on the text.")
    title: str
    status: int
    detail: str
    instance: str = Field(description="The request's path.")
    # Sent with validation-error (422) only, and never null.
    errors: list[ValidationIssue] | None = Field(
        None,
        description="With `validation-error` only: each problem of the request.",
        json_schema_extra=_omittable_schema,
    )
