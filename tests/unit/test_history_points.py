"""A bucket of the statistics' history as a point of a chart (app/core/history.py): pure logic."""

from __future__ import annotations

from datetime import UTC, datetime

from app.core.history import RANGES, point
from app.db.history import HOURS_KEEP_SECONDS, MINUTES_KEEP_SECONDS, BucketRow
from app.observability.metrics import percentile_ms

WHEN = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def bucket(**fields: object) -> BucketRow:
    base: dict[str, object] = {
        "bucket": 0, "at": WHEN, "enqueued": 0, "completed": 0, "failed": 0, "duration_max_ms": None,
        "durations_ms": None, "sampled": 0, "ready_sum": 0, "oldest_ready_seconds": None, "as_of": WHEN,
    }  # fmt: skip
    base.update(fields)
    return BucketRow(**base)  # type: ignore[arg-type]


def test_backlog_is_the_average_of_the_sampled_minutes() -> None:
    p = point(bucket(sampled=10, ready_sum=1234, oldest_ready_seconds=8.5))
    assert (p["ready"], p["oldest_ready_age_seconds"]) == (123.4, 8.5)


def test_a_bucket_never_sampled_has_no_backlog_rather_than_zero() -> None:
    p = point(bucket(sampled=0, ready_sum=0))
    assert (p["ready"], p["oldest_ready_age_seconds"]) == (None, None)
    quiet = point(bucket(sampled=3))  # sampled, nothing ready
    assert (quiet["ready"], quiet["oldest_ready_age_seconds"]) == (0, 0)


def test_percentiles_need_completions() -> None:
    assert (point(bucket())["p50_ms"], point(bucket())["p95_ms"]) == (None, None)
    histogram = [0, 0, 0, 0, 4, 6] + [0] * 13
    p = point(bucket(completed=10, durations_ms=histogram, duration_max_ms=240.0))
    assert p["p95_ms"] == percentile_ms(histogram, 0.95, 240.0)
    assert p["p95_ms"] is not None and 100 < p["p95_ms"] <= 240


def test_each_range_is_covered_by_the_rows_kept() -> None:
    for r in RANGES.values():
        span = r.bucket_seconds * r.buckets
        assert span <= HOURS_KEEP_SECONDS
        if r.bucket_seconds < 3600:  # finer than an hour: minute rows only, which are kept a day
            assert span <= MINUTES_KEEP_SECONDS
