"""Which ticks a scheduler pass enqueues (app/core/schedules.py plan), on a fixed clock: late ticks within
the grace all run, missed ones are skipped or the latest caught up, and the next tick follows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.core.schedules import plan
from app.cron import ZonedCron

MINUTE = ZonedCron.of("* * * * *")
GRACE = timedelta(seconds=60)


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 6, 1, hour, minute, second, tzinfo=UTC)


def test_a_tick_on_time() -> None:
    assert plan(MINUTE, at(12, 0), at(12, 0, 0), GRACE, False) == ([at(12, 0)], at(12, 1))
    assert plan(MINUTE, at(12, 0), at(12, 0, 59), GRACE, False) == ([at(12, 0)], at(12, 1))


def test_late_ticks_within_the_grace_all_run() -> None:
    every_10s = ZonedCron.of("*/10 * * * * *")
    ticks, nxt = plan(every_10s, at(12, 0), at(12, 0, 35), GRACE, False)
    assert ticks == [at(12, 0), at(12, 0, 10), at(12, 0, 20), at(12, 0, 30)] and nxt == at(12, 0, 40)


def test_missed_ticks_are_skipped() -> None:
    # Down from 11:00 to 12:30:30: the ticks up to 12:29:30 were missed; 12:30 is 30 s late, within the grace.
    assert plan(MINUTE, at(11, 0), at(12, 30, 30), GRACE, False) == ([at(12, 30)], at(12, 31))
    hourly = ZonedCron.of("0 * * * *")
    assert plan(hourly, at(9, 0), at(12, 30), GRACE, False) == ([], at(13, 0))


def test_catch_up_enqueues_the_latest_missed_tick_only() -> None:
    hourly = ZonedCron.of("0 * * * *")
    assert plan(hourly, at(9, 0), at(12, 30), GRACE, True) == ([at(12, 0)], at(13, 0))
    # The latest missed tick, then the late one within the grace.
    assert plan(MINUTE, at(11, 0), at(12, 30, 30), GRACE, True) == ([at(12, 29), at(12, 30)], at(12, 31))


def test_a_tick_exactly_one_grace_late_counts_as_missed() -> None:
    hourly = ZonedCron.of("0 * * * *")
    assert plan(hourly, at(12, 0), at(12, 1), GRACE, False) == ([], at(13, 0))
    assert plan(hourly, at(12, 0), at(12, 0, 59), GRACE, False) == ([at(12, 0)], at(13, 0))


def test_a_long_backlog_is_cut_into_passes() -> None:
    every_second = ZonedCron.of("* * * * * *")
    ticks, nxt = plan(every_second, at(12, 0), at(12, 0, 50), GRACE, False, limit=20)
    assert ticks == [at(12, 0, s) for s in range(20)] and nxt == at(12, 0, 20)  # the next pass goes on from there


def test_a_schedule_that_fires_no_more() -> None:
    last = ZonedCron.of("0 0 31 12 *")
    end = datetime(9998, 12, 31, tzinfo=UTC)
    ticks, nxt = plan(last, end, end + timedelta(seconds=1), GRACE, False)
    assert ticks == [end] and nxt is None
