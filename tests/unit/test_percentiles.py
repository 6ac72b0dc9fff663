"""Claim-to-completion percentiles from the stored histogram (app/observability/metrics.py)."""

from __future__ import annotations

from app.observability.metrics import DURATION_BOUNDS_MS, percentile_ms


def histogram(**buckets: int) -> list[int]:
    """A histogram with counts in the buckets whose upper bounds are given as b<bound>=count."""
    h = [0] * (len(DURATION_BOUNDS_MS) + 1)
    for name, n in buckets.items():
        h[DURATION_BOUNDS_MS.index(float(name[1:])) if name != "over" else -1] = n
    return h


def test_no_completions_no_percentile() -> None:
    assert percentile_ms(None, 0.5, None) is None
    assert percentile_ms([0] * 19, 0.5, None) is None


def test_interpolates_inside_the_bucket() -> None:
    h = histogram(b10=100)  # all between 5 and 10 ms
    assert percentile_ms(h, 0.5, 10.0) == 7.5
    assert percentile_ms(h, 0.95, 10.0) == 9.75


def test_never_above_the_exact_maximum() -> None:
    h = histogram(b1000=10)
    assert percentile_ms(h, 0.95, 600.0) == 600.0


def test_the_open_last_bucket_ends_at_the_maximum() -> None:
    h = histogram(over=4)
    assert percentile_ms(h, 0.5, 5_000_000.0) == DURATION_BOUNDS_MS[-1] + (5_000_000.0 - DURATION_BOUNDS_MS[-1]) / 2


def test_error_is_within_one_bucket() -> None:
    # 60 fast jobs (10-25 ms) and 40 slow ones (250-500 ms): p50 falls in the fast bucket, p95 in the slow one.
    h = histogram(b25=60, b500=40)
    p50, p95 = percentile_ms(h, 0.5, 480.0), percentile_ms(h, 0.95, 480.0)
    assert p50 is not None and 10 <= p50 <= 25
    assert p95 is not None and 250 <= p95 <= 480
