"""Request and response bodies of schedules (admin): jobs enqueued by cron."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, StrictBool

from app.cron import Cron, zone
from app.models.fields import QUEUE_PATTERN, Body, Json, Label, MaxAttempts, Maybe, Priority, omitted

CRON_HELP = (
    "5 fields (minute hour day-of-month month day-of-week), or 6 with the second first: `*`, `N`, `A-B`, "
    "`*/S`, `A-B/S`, lists with commas, JAN-DEC and SUN-SAT; @hourly, @daily, @weekly, @monthly, @yearly. "
    "When both day fields are restricted, a day matching either runs (as in Vixie cron)."
)
ZONE_HELP = (
    "IANA time zone of the cron's wall-clock times (default UTC). Across DST changes each local time runs "
    "once: a time the clocks skip runs when the gap ends, a repeated time at its first occurrence."
)
MISSED_HELP = (
    "Ticks found more than JOBQ_SCHEDULE_GRACE_SECONDS late (no replica was running): `skip` (default) "
    "enqueues none of them, `catch_up` enqueues one job for the latest of them."
)

Missed = Literal["skip", "catch_up"]


def _cron(text: str) -> str:
    Cron.parse(text)  # CronError is a ValueError: pydantic reports it as a 422 on `cron`
    return text.strip()


def _zone(name: str) -> str:
    zone(name)
    return name


CronText = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_cron)]
ZoneName = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_zone)]


class ScheduleRequest(Body):
    queue: Annotated[str, Field(pattern=QUEUE_PATTERN)] = Field(..., description="Where each tick's job goes.")
    cron: CronText = Field(..., description=CRON_HELP)
    timezone: Maybe[ZoneName] = omitted(ZONE_HELP)
    payload: Json = Field(..., description="The payload of each job; any JSON value.")
    priority: Maybe[Priority] = omitted(
        "Each job's priority; left out: the queue's default_priority when each job is made, else 0."
    )
    max_attempts: Maybe[MaxAttempts] = omitted(
        "Each job's max_attempts; left out: the queue's max_attempts when each job is made, else "
        "JOBQ_DEFAULT_MAX_ATTEMPTS."
    )
    group: Maybe[Label] = omitted(
        "Each job's group (flow control: per-group limits, fairness and order, docs/flow-control.md); left out: none."
    )
    missed: Missed = Field("skip", description=MISSED_HELP)
    paused: Maybe[StrictBool] = omitted(
        "Create or replace it paused (true) or running (false); left out: a new schedule runs, a replaced "
        "one keeps its state."
    )


class Schedule(BaseModel):
    name: str
    queue: str
    cron: str
    timezone: str
    payload: Json
    priority: int | None = Field(description="Each job's priority; null: the queue's default_priority, else 0.")
    max_attempts: int | None = Field(
        description="Each job's max_attempts; null: the queue's max_attempts when each job is made, else "
        "JOBQ_DEFAULT_MAX_ATTEMPTS."
    )
    group: str | None = Field(description="Each job's group; null: none.")
    missed: Missed
    paused: bool = Field(description="A paused schedule enqueues nothing; resume skips the ticks of the pause.")
    next_run_at: datetime | None = Field(
        description="When the next job will be enqueued (the next tick); null while paused, or when the "
        "expression fires no more."
    )
    last_run_at: datetime | None = Field(description="The latest tick that enqueued a job; null before the first.")
    created_at: datetime
    updated_at: datetime


class ScheduleList(BaseModel):
    schedules: list[Schedule] = Field(description="By name.")
