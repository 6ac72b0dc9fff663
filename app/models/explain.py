"""The answer of GET /jobs/{id}/explain: the rules of the claim that hold a job right now, one reason each."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from app.db.rows import Status


class PausedReason(BaseModel):
    """Its queue is paused: claims take nothing from it until it is resumed."""

    kind: Literal["paused"]


class ScheduledReason(BaseModel):
    """Enqueued to run later (`run_at`, `delay_seconds`), and not due yet."""

    kind: Literal["scheduled"]
    run_at: datetime


class BackoffReason(BaseModel):
    """An attempt failed (or timed out, or its lease lapsed); the retry is not due yet."""

    kind: Literal["backoff"]
    run_at: datetime
    attempts: int
    last_error: str | None


class ConcurrencyReason(BaseModel):
    """The queue's `concurrency` is full: these running jobs hold its places."""

    kind: Literal["concurrency"]
    limit: int
    held_by: list[int] = Field(description="The running jobs that count against it (the first 100).")


class RateReason(BaseModel):
    """The queue's `rate` window is full."""

    kind: Literal["rate"]
    limit: int
    per_seconds: int
    until: datetime | None = Field(description="When the oldest claim of the window leaves it.")


class GroupConcurrencyReason(BaseModel):
    """Its group's `group_concurrency` is full (an ordered queue runs one job of a group at a time)."""

    kind: Literal["group_concurrency"]
    group: str
    limit: int
    held_by: list[int] = Field(description="The running jobs of the group (the first 100).")


class GroupRateReason(BaseModel):
    """Its group's `group_rate` window is full."""

    kind: Literal["group_rate"]
    group: str
    limit: int
    per_seconds: int
    until: datetime | None = Field(description="When the oldest claim of the group's window leaves it.")


class OrderedReason(BaseModel):
    """The queue is `ordered` and it is not this job's turn: the job `behind` comes first in its group."""

    kind: Literal["ordered"]
    group: str
    behind: int = Field(description="The group's first pending job, which must finish first.")


class DependenciesReason(BaseModel):
    """It is `waiting` for jobs it depends on (`depends_on`)."""

    kind: Literal["dependencies"]
    waiting_for: list[int] = Field(description="Those not finished yet (of the queues this key may use).")


class RunningReason(BaseModel):
    """It is running: a worker holds it."""

    kind: Literal["running"]
    worker: str | None
    lease_expires_at: datetime | None


class FinishedReason(BaseModel):
    """It has finished; it runs again only if retried."""

    kind: Literal["finished"]
    status: Status


Reason = Annotated[
    PausedReason
    | ScheduledReason
    | BackoffReason
    | ConcurrencyReason
    | RateReason
    | GroupConcurrencyReason
    | GroupRateReason
    | OrderedReason
    | DependenciesReason
    | RunningReason
    | FinishedReason,
    Field(discriminator="kind"),
]


class JobExplanation(BaseModel):
    """Why a job is not running now."""

    id: int = Field(json_schema_extra={"format": "int64"})
    queue: str
    status: Status
    runnable: bool = Field(
        description="Nothing holds it: the next claim of its queue may take it, in claim order (priority, then "
        "run_at, then id) among the other runnable jobs."
    )
    reasons: list[Reason] = Field(description="Every rule that holds it now; empty when runnable.")
