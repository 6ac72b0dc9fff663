"""Request and response bodies of queue configuration (GET and PATCH /queues/{queue}/config)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, Field, Strict, StrictBool

from app.models.fields import Body, Integral, MaxAttempts, Priority, TimeoutSeconds

Count = Annotated[int, Strict(), Field(ge=1, le=1_000_000), Integral]
PendingCount = Annotated[int, Strict(), Field(ge=1, le=1_000_000_000), Integral]
Spread = Annotated[int, Strict(), Field(ge=1, le=64), Integral]  # app/db/spread.py MAX_SPREAD
WindowSeconds = Annotated[int, Strict(), Field(ge=1, le=86_400), Integral]
KeepSeconds = Annotated[int, Strict(), Field(ge=0, le=315_360_000), Integral]
LeaseSeconds = Annotated[int, Strict(), Field(ge=1, le=604_800), Integral]
BackoffSeconds = Annotated[float, Field(gt=0, le=3600, strict=True, allow_inf_nan=False)]
BackoffMaxSeconds = Annotated[float, Field(gt=0, le=604_800, strict=True, allow_inf_nan=False)]


def _clearable(schema: dict[str, Any]) -> None:
    """A PATCH field: a value, or null to clear it back to the global setting, or left out to keep it. The
    null branch is meaningful here (JSON Merge Patch); the `default` is not (nothing is filled in)."""
    schema.pop("default", None)


def clearable(description: str) -> Any:
    return Field(None, description=description, json_schema_extra=_clearable)


class Rate(Body):
    limit: Count = Field(..., description="Most claims in any window of `per_seconds`.")
    per_seconds: WindowSeconds = Field(..., description="The window, in seconds (by the database clock).")


class RetentionPatch(Body):
    completed: KeepSeconds | None = clearable("Delete completed jobs this long after they finished (0: keep).")
    failed: KeepSeconds | None = clearable("Delete failed jobs this long after they failed (0: keep).")
    cancelled: KeepSeconds | None = clearable("Delete cancelled jobs this long after (0: keep).")


_LIMITS = "Counts every replica's claims together: enforced inside the claim statement (see docs/flow-control.md)."


class QueueConfigPatch(Body):
    """Fields left out keep their value; `null` clears a field back to the global setting."""

    max_attempts: MaxAttempts | None = clearable("Attempts of a job enqueued without max_attempts.")
    backoff_base_seconds: BackoffSeconds | None = clearable("First retry delay after a fail.")
    backoff_max_seconds: BackoffMaxSeconds | None = clearable("Longest retry delay.")
    lease_seconds: LeaseSeconds | None = clearable("Lease of a claim that names none.")
    default_priority: Priority | None = clearable("Priority of a job enqueued without one.")
    retention: RetentionPatch | None = clearable("Retention per status; null clears all three.")
    concurrency: Count | None = clearable("Most running jobs of the queue. " + _LIMITS)
    rate: Rate | None = clearable("Most claims of the queue per window. " + _LIMITS)
    group_concurrency: Count | None = clearable("Most running jobs per group.")
    group_rate: Rate | None = clearable("Most claims per group per window.")
    fair: StrictBool | None = clearable("Hand ready jobs out round-robin across groups instead of by age.")
    ordered: StrictBool | None = clearable(
        "Within a group, a job is claimable only once the job before it has finished for good (a job waiting "
        "for its retry holds its group back); needs group_concurrency 1 or unset."
    )
    max_pending: PendingCount | None = clearable(
        "Most jobs not yet started (pending, delayed, waiting for dependencies) the queue may hold; an enqueue "
        "past it is refused with 429 `queue-full`. Checked by each server against a count it refreshes about "
        "once a second: other servers' enqueues of that second may pass it (docs/flow-control.md)."
    )
    spread: Spread | None = clearable(
        "Distribution keys (1-64) over which enqueues spread the queue's jobs, so that on Citus one queue can use "
        "every node (docs/scale-out.md); null: 1, every job under the queue's own name. Needs concurrency, rate, "
        "group_concurrency, group_rate, fair and ordered unset. Lowered, claims still take from the keys above."
    )
    timeout_seconds: TimeoutSeconds | None = clearable(
        "Hard timeout (1-604800) of the queue's jobs enqueued without one: a claim that runs this long is "
        'failed (`last_error` "timeout") whatever its heartbeats, and the job retried or not as after any '
        "failure. Applies to running jobs at once."
    )


class RateLimit(BaseModel):
    limit: int = Field(description="Most claims in any window of `per_seconds`.")
    per_seconds: int = Field(description="The window, in seconds.")


class Retention(BaseModel):
    completed: int | None = Field(description="Seconds; null: JOBQ_RETENTION_COMPLETED_SECONDS.")
    failed: int | None = Field(description="Seconds; null: JOBQ_RETENTION_FAILED_SECONDS.")
    cancelled: int | None = Field(description="Seconds; null: JOBQ_RETENTION_CANCELLED_SECONDS.")


class QueueConfig(BaseModel):
    """A queue's configuration; null: the global setting (for the limits: no limit)."""

    queue: str
    max_attempts: int | None = Field(description="null: JOBQ_DEFAULT_MAX_ATTEMPTS.")
    backoff_base_seconds: float | None = Field(description="null: JOBQ_BACKOFF_BASE_SECONDS.")
    backoff_max_seconds: float | None = Field(description="null: JOBQ_BACKOFF_CAP_SECONDS.")
    lease_seconds: int | None = Field(description="null: JOBQ_LEASE_DEFAULT_SECONDS.")
    default_priority: int | None = Field(description="null: 0.")
    retention: Retention
    concurrency: int | None = Field(description="Most running jobs of the queue; null: no limit.")
    rate: RateLimit | None = Field(description="Most claims of the queue per window; null: no limit.")
    group_concurrency: int | None = Field(description="Most running jobs per group; null: no limit.")
    group_rate: RateLimit | None = Field(description="Most claims per group per window; null: no limit.")
    fair: bool | None = Field(description="Round-robin across groups; null: false.")
    ordered: bool | None = Field(description="Strict order within each group; null: false.")
    max_pending: int | None = Field(description="Most jobs not yet started; null: JOBQ_MAX_PENDING_JOBS.")
    timeout_seconds: int | None = Field(description="Hard timeout of jobs enqueued without one; null: none.")
    spread: int = Field(description="Distribution keys the queue's new jobs are spread over (1: none).")
    changed_at: datetime | None = Field(description="When the configuration last changed; null: never.")
