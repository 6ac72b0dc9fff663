"""Response bodies of the statistics' history: the series the dashboard's charts draw, and its sparklines."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

HistoryRange = Literal["hour", "day", "week"]
RANGE_DESCRIPTION = (
    "`hour`: 60 buckets of a minute; `day`: 96 buckets of 15 minutes; `week`: 168 buckets of an hour. Buckets "
    "are aligned to multiples of their length (UTC); the last one holds now and is still filling."
)


class SeriesPoint(BaseModel):
    at: datetime = Field(description="Start of the bucket.")
    enqueued: int = Field(description="Jobs enqueued in the bucket.")
    completed: int = Field(description="Jobs completed in the bucket.")
    failed: int = Field(description="Jobs that failed for good in the bucket.")
    p50_ms: float | None = Field(
        description="Median claim-to-completion time of the bucket's completions (histogram estimate); null "
        "without completions."
    )
    p95_ms: float | None = Field(description="95th percentile claim-to-completion time; null without completions.")
    ready: float | None = Field(
        description="Ready jobs: the average of the bucket's once-a-minute samples; null when no minute of the "
        "bucket was sampled (no replica was running)."
    )
    oldest_ready_age_seconds: float | None = Field(
        description="The largest sampled age of the oldest ready job (0 when none was ready); null when no "
        "minute of the bucket was sampled."
    )


class Series(BaseModel):
    queue: str | None = Field(description="The queue; null for the sum over every queue the key may see.")
    range: HistoryRange
    bucket_seconds: int = Field(description="Length of a bucket.")
    since: datetime = Field(description="Start of the first bucket.")
    as_of: datetime = Field(description="Database time of the figures.")
    points: list[SeriesPoint] = Field(description="One per bucket, oldest first, empty buckets included.")


class QueueSparkline(BaseModel):
    queue: str
    enqueued: list[int] = Field(description="Jobs enqueued, per bucket.")
    completed: list[int] = Field(description="Jobs completed, per bucket.")
    failed: list[int] = Field(description="Jobs failed for good, per bucket.")
    ready: list[float | None] = Field(description="Average sampled ready jobs per bucket (null: not sampled).")


class Sparklines(BaseModel):
    range: HistoryRange
    bucket_seconds: int
    since: datetime = Field(description="Start of the first bucket.")
    as_of: datetime = Field(description="Database time of the figures.")
    queues: list[QueueSparkline] = Field(
        description="The queues with statistics in the range (among those asked for), by name, a page at a time; "
        "a queue that is absent had none (all zero, backlog included)."
    )
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
