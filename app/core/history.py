"""The statistics' history as the dashboard draws it: a series of equal buckets over the last hour, day or
week, per queue or for every queue the caller may see, and a sparkline per queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from app.db import history as store_history
from app.db.history import BucketRow
from app.db.replica import Conn, Reads
from app.observability.metrics import percentile_ms

Doc = dict[str, Any]
RangeName = Literal["hour", "day", "week"]


@dataclass(frozen=True, slots=True)
class Range:
    bucket_seconds: int
    buckets: int


# Minute rows are kept a day, hour rows a week (app/db/history.py): the week is drawn by the hour.
RANGES: dict[str, Range] = {"hour": Range(60, 60), "day": Range(900, 96), "week": Range(3600, 168)}


def _average(total: int, sampled: int) -> float | None:
    return round(total / sampled, 2) if sampled else None


def point(row: BucketRow) -> Doc:
    max_ms = round(row.duration_max_ms, 3) if row.duration_max_ms is not None else None
    return {
        "at": row.at,
        "enqueued": row.enqueued,
        "completed": row.completed,
        "failed": row.failed,
        "p50_ms": percentile_ms(row.durations_ms, 0.50, max_ms),
        "p95_ms": percentile_ms(row.durations_ms, 0.95, max_ms),
        "ready": _average(row.ready_sum, row.sampled),
        "oldest_ready_age_seconds": (row.oldest_ready_seconds or 0.0) if row.sampled else None,
    }


class HistoryService:
    def __init__(self, reads: Reads) -> None:
        self.reads = reads  # the read replica when there is one

    async def series(self, range_: RangeName, queue: str | None, allowed: str | None) -> Doc:
        """One queue's series, or (queue None) the sum over the queues matching `allowed` (None: all)."""
        r = RANGES[range_]

        async def read(conn: Conn) -> list[BucketRow]:
            return await store_history.series(conn, queue, allowed, r.bucket_seconds, r.buckets)

        rows = await self.reads.run(read)
        return {
            "queue": queue,
            "range": range_,
            "bucket_seconds": r.bucket_seconds,
            "since": rows[0].at,
            "as_of": rows[0].as_of,
            "points": [point(row) for row in rows],
        }

    async def sparklines(self, range_: RangeName, allowed: str | None) -> Doc:
        r = RANGES[range_]

        async def read(conn: Conn) -> tuple[Any, Any]:
            return await store_history.sparklines(conn, allowed, r.bucket_seconds, r.buckets)

        frame, rows = await self.reads.run(read)
        sampled = [0] * r.buckets
        for f in frame:
            if f.bucket is not None and 0 <= f.bucket < r.buckets:
                sampled[f.bucket] = f.minutes
        lines: dict[str, Doc] = {}
        for row in rows:
            if not 0 <= row.bucket < r.buckets:
                continue
            line = lines.get(row.queue)
            if line is None:
                line = lines[row.queue] = {
                    "queue": row.queue,
                    "enqueued": [0] * r.buckets,
                    "completed": [0] * r.buckets,
                    "failed": [0] * r.buckets,
                    "ready_sum": [0] * r.buckets,
                }
            for name in ("enqueued", "completed", "failed", "ready_sum"):
                line[name][row.bucket] = getattr(row, name)
        for line in lines.values():
            sums = line.pop("ready_sum")
            line["ready"] = [_average(total, n) for total, n in zip(sums, sampled, strict=True)]
        return {
            "range": range_,
            "bucket_seconds": r.bucket_seconds,
            "since": frame[0].since,
            "as_of": frame[0].as_of,
            "queues": list(lines.values()),
        }
