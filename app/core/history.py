"""The statistics' history as the dashboard draws it: a series of equal buckets over the last hour, day or
week, per queue or for every queue the caller may see, and a sparkline per queue."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from app.core.cursors import QUEUES, BadCursor, decode_cursor, encode_cursor
from app.core.flow import QueueConfigs
from app.core.jobs import invalid
from app.db import history as store_history
from app.db.history import BucketRow
from app.db.replica import Conn, Reads, Server, mark_served, recording_served
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


SPARKLINES_CACHE_SECONDS = 10.0  # a sparkline's buckets are minutes: one answer serves every refresh meanwhile
SPARKLINES_CACHE_ENTRIES = 256


class HistoryService:
    def __init__(self, reads: Reads, configs: QueueConfigs) -> None:
        self.reads = reads  # the read replica when there is one
        self.configs = configs  # a spread queue's keys (app/db/spread.py), whose statistics its series adds up
        # (range, allowed, queues, after, limit) -> (monotonic expiry, answer): the dashboard of every operator
        # asks for the same pages again and again.
        self._sparklines: dict[tuple[Any, ...], tuple[float, Doc, Server]] = {}

    async def series(self, range_: RangeName, queue: str | None, allowed: str | None) -> Doc:
        """One queue's series, or (queue None) the sum over the queues matching `allowed` (None: all)."""
        r = RANGES[range_]
        names = ((await self.configs.get(queue)).keys or (queue,)) if queue is not None else None

        async def read(conn: Conn) -> list[BucketRow]:
            return await store_history.series(conn, names, allowed, r.bucket_seconds, r.buckets)

        rows = await self.reads.run(read)
        return {
            "queue": queue,
            "range": range_,
            "bucket_seconds": r.bucket_seconds,
            "since": rows[0].at,
            "as_of": rows[0].as_of,
            "points": [point(row) for row in rows],
        }

    async def sparklines(
        self,
        range_: RangeName,
        allowed: str | None,
        queues: list[str] | None = None,
        cursor: str | None = None,
        limit: int = 1000,
    ) -> Doc:
        """A page of sparklines: at most `limit` queues by name (of `queues` when given), after `cursor`; the
        same question within SPARKLINES_CACHE_SECONDS gets the same answer without a query."""
        key = (range_, allowed, tuple(queues) if queues is not None else None, cursor, limit)
        now = time.monotonic()
        cached = self._sparklines.get(key)
        if cached is not None and cached[0] > now:
            mark_served(cached[2])  # the answer says where it was read, cached or not
            return cached[1]
        try:
            after = decode_cursor(cursor, QUEUES)[0] if cursor else None
        except BadCursor:
            raise invalid(["query", "cursor"], "not a cursor of this listing; start again without one") from None
        with recording_served() as served:
            doc = await self._sparklines_page(range_, allowed, queues, after, limit)
        by: Server = served.by or "primary"
        mark_served(by)
        if len(self._sparklines) >= SPARKLINES_CACHE_ENTRIES:
            self._sparklines = {k: v for k, v in self._sparklines.items() if v[0] > now}
            if len(self._sparklines) >= SPARKLINES_CACHE_ENTRIES:
                self._sparklines.clear()
        self._sparklines[key] = (now + SPARKLINES_CACHE_SECONDS, doc, by)
        return doc

    async def _sparklines_page(
        self, range_: RangeName, allowed: str | None, queues: list[str] | None, after: str | None, limit: int
    ) -> Doc:
        r = RANGES[range_]

        async def read(conn: Conn) -> tuple[Any, Any]:
            return await store_history.sparklines(conn, allowed, r.bucket_seconds, r.buckets, queues, after, limit + 1)

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
        page = list(lines.values())
        more = len(page) > limit
        page = page[:limit]
        return {
            "range": range_,
            "bucket_seconds": r.bucket_seconds,
            "since": frame[0].since,
            "as_of": frame[0].as_of,
            "queues": page,
            "next_cursor": encode_cursor(QUEUES, [page[-1]["queue"]]) if more else None,
        }
