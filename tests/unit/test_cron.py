"""Cron expressions (app/cron.py): what each field form matches, the day-of-month/day-of-week rule of
Vixie cron, leap years, and the instants in a time zone across DST changes, on a fixed clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from app.cron import Cron, CronError, ZonedCron, zone


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def fires(expression: str, start: datetime, n: int, timezone: str = "UTC") -> list[datetime]:
    """The next n instants after start, in UTC."""
    z = ZonedCron.of(expression, timezone)
    out = []
    t = start
    for _ in range(n):
        nxt = z.next_after(t)
        assert nxt is not None
        out.append(nxt)
        t = nxt
    return out


def local(expression: str, start: datetime, n: int, timezone: str) -> list[str]:
    """The next n instants as local times with their offset, e.g. '2026-03-08 03:00-04:00'."""
    tz = zone(timezone)
    return [t.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S%z") for t in fires(expression, start, n, timezone)]


# --- fields ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "field", "values"),
    [
        ("* * * * *", "minutes", tuple(range(60))),
        ("5 * * * *", "minutes", (5,)),
        ("5,10,55 * * * *", "minutes", (5, 10, 55)),
        ("10-15 * * * *", "minutes", (10, 11, 12, 13, 14, 15)),
        ("*/15 * * * *", "minutes", (0, 15, 30, 45)),
        ("10-30/10 * * * *", "minutes", (10, 20, 30)),
        ("50/3 * * * *", "minutes", (50, 53, 56, 59)),
        ("1-5,*/20,59 * * * *", "minutes", (0, 1, 2, 3, 4, 5, 20, 40, 59)),
        ("0 */7 * * *", "hours", (0, 7, 14, 21)),
        ("0 0 1,15 * *", "days", (1, 15)),
        ("0 0 * JAN,jul,Dec *", "months", (1, 7, 12)),
        ("0 0 * FEB-apr *", "months", (2, 3, 4)),
        ("0 0 * */3 *", "months", (1, 4, 7, 10)),
        ("0 0 * * MON-FRI", "weekdays", (1, 2, 3, 4, 5)),
        ("0 0 * * sat,SUN", "weekdays", (0, 6)),
        ("0 0 * * 7", "weekdays", (0,)),
        ("0 0 * * 5-7", "weekdays", (0, 5, 6)),
        ("0 0 * * 0-7", "weekdays", (0, 1, 2, 3, 4, 5, 6)),
        ("0 0 * * *", "seconds", (0,)),
        ("*/10 0 0 * * *", "seconds", (0, 10, 20, 30, 40, 50)),
        ("7 0 0 * * *", "seconds", (7,)),
    ],
)
def test_each_field_form_matches_what_it_says(expression: str, field: str, values: tuple[int, ...]) -> None:
    assert getattr(Cron.parse(expression), field) == values


@pytest.mark.parametrize(
    ("macro", "same_as"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@MIDNIGHT", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ],
)
def test_macros(macro: str, same_as: str) -> None:
    start = utc(2026, 5, 17, 13, 7)
    assert fires(macro, start, 3) == fires(same_as, start, 3)


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("", "0 fields"),
        ("* * * *", "4 fields"),
        ("* * * * * * *", "7 fields"),
        ("60 * * * *", "minute: 60 is out of range 0-59"),
        ("* 24 * * *", "hour: 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month: 0 is out of range 1-31"),
        ("* * 32 * *", "day-of-month: 32 is out of range 1-31"),
        ("* * * 13 *", "month: 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week: 8 is out of range 0-7"),
        ("60 * * * * *", "second: 60 is out of range 0-59"),
        ("*/0 * * * *", "minute: a step of 0"),
        ("30-10 * * * *", "runs backwards"),
        ("* * * * FRI-MON", "runs backwards"),
        ("* * * FOO *", "month: 'FOO' is not a number or a name"),
        ("* * * * MON#2", "day-of-week: cannot read 'MON#2'"),
        ("* * L * *", "day-of-month: 'L' is not a number"),
        ("? * * * *", "minute: `?` is only for day-of-month and day-of-week"),
        ("1,,2 * * * *", "minute: cannot read ''"),
        ("-5 * * * *", "minute: cannot read '-5'"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("@reboot", "unknown macro '@reboot'"),
        ("0 7\n* * *", "character '\\n'"),
        ("0 7 * * *\r\n", "character '\\r'"),
    ],
)
def test_bad_expressions_say_what_is_wrong(expression: str, says: str) -> None:
    with pytest.raises(CronError, match=None) as caught:
        Cron.parse(expression)
    assert says in str(caught.value)


@pytest.mark.parametrize("name", ["Mars/Olympus_Mons", "../../etc/passwd", "/etc/localtime", "localtime", "", "utc "])
def test_unknown_time_zones_are_refused(name: str) -> None:
    with pytest.raises(CronError, match="unknown time zone"):
        zone(name)


# --- matching wall times ------------------------------------------------------------------------------------


def test_every_second_minute_and_hour() -> None:
    start = utc(2026, 1, 1, 0, 0, 0)
    assert fires("* * * * * *", start, 3) == [start + timedelta(seconds=s) for s in (1, 2, 3)]
    assert fires("* * * * *", start, 2) == [utc(2026, 1, 1, 0, 1), utc(2026, 1, 1, 0, 2)]
    assert fires("0 * * * *", start, 2) == [utc(2026, 1, 1, 1), utc(2026, 1, 1, 2)]


def test_next_is_strictly_after_even_within_a_second() -> None:
    assert fires("* * * * * *", utc(2026, 1, 1, 0, 0, 0) + timedelta(microseconds=1), 1) == [utc(2026, 1, 1, 0, 0, 1)]
    assert fires("0 12 * * *", utc(2026, 1, 1, 12), 1) == [utc(2026, 1, 2, 12)]


def test_carries_over_minutes_hours_days_months_and_years() -> None:
    assert fires("*/20 59 23 31 12 *", utc(2026, 12, 31, 23, 59, 40), 2) == [
        utc(2027, 12, 31, 23, 59, 0),
        utc(2027, 12, 31, 23, 59, 20),
    ]
    assert fires("0 0 1 * *", utc(2026, 1, 31, 5), 2) == [utc(2026, 2, 1), utc(2026, 3, 1)]


def test_day_31_skips_short_months() -> None:
    assert fires("0 0 31 * *", utc(2026, 1, 31, 1), 3) == [utc(2026, 3, 31), utc(2026, 5, 31), utc(2026, 7, 31)]


def test_february_29_waits_for_leap_years_and_skips_1900_like_centuries() -> None:
    assert fires("0 0 29 2 *", utc(2026, 1, 1), 2) == [utc(2028, 2, 29), utc(2032, 2, 29)]
    assert fires("0 0 29 2 *", utc(2096, 3, 1), 1) == [utc(2104, 2, 29)]  # 2100 is not a leap year
    assert fires("0 0 29 2 *", utc(2399, 1, 1), 1) == [utc(2400, 2, 29)]  # 2400 is


def test_day_of_month_or_day_of_week_when_both_are_restricted() -> None:
    # Vixie cron: "the 13th, and every Friday". 2026-02-13 is a Friday.
    got = fires("0 0 13 * FRI", utc(2026, 2, 1), 5)
    assert got == [utc(2026, 2, 6), utc(2026, 2, 13), utc(2026, 2, 20), utc(2026, 2, 27), utc(2026, 3, 6)]
    got = fires("0 0 1 * MON", utc(2026, 5, 30), 3)  # 2026-06-01 is a Monday; 06-08 the next one
    assert got == [utc(2026, 6, 1), utc(2026, 6, 8), utc(2026, 6, 15)]


def test_a_day_field_starting_with_a_star_makes_both_required() -> None:
    # Vixie cron looks at the first character: "*/2" counts as unrestricted, so the days must match both.
    got = fires("0 0 */2 * MON", utc(2026, 6, 1), 3)  # odd days that are Mondays
    assert all(t.isoweekday() == 1 and t.day % 2 == 1 for t in got)
    assert got == [utc(2026, 6, 15), utc(2026, 6, 29), utc(2026, 7, 13)]
    assert fires("0 0 * * MON", utc(2026, 6, 1), 2) == [utc(2026, 6, 8), utc(2026, 6, 15)]
    assert fires("0 0 ? * MON", utc(2026, 6, 1), 1) == [utc(2026, 6, 8)]
    assert fires("0 0 10 * ?", utc(2026, 6, 1), 2) == [utc(2026, 6, 10), utc(2026, 7, 10)]


def test_a_day_that_comes_rarely() -> None:
    # A Sunday 29 February, day-of-week given as a step (star first, so both fields must match): every
    # 28 years or so. Checked against every day of the calendar.
    got = fires("0 0 0 29 2 */7", utc(2026, 1, 1), 2)
    day, expected = datetime(2026, 1, 1), []
    while len(expected) < 2:
        day += timedelta(days=1)
        if (day.month, day.day, day.isoweekday()) == (2, 29, 7):
            expected.append(day.replace(tzinfo=UTC))
    assert got == expected
    assert expected[0].year == 2032


# --- time zones and DST ---------------------------------------------------------------------------------------


def test_a_time_zone_moves_the_instant() -> None:
    assert fires("0 9 * * *", utc(2026, 1, 10), 1, "Europe/Paris") == [utc(2026, 1, 10, 8)]  # CET, +01:00
    assert fires("0 9 * * *", utc(2026, 7, 10), 1, "Europe/Paris") == [utc(2026, 7, 10, 7)]  # CEST, +02:00
    assert fires("0 9 * * *", utc(2026, 1, 10), 1, "Asia/Kolkata") == [utc(2026, 1, 10, 3, 30)]


def test_spring_forward_a_time_that_does_not_exist_runs_once_when_the_gap_ends() -> None:
    # New York, 2026-03-08: 02:00 EST becomes 03:00 EDT; 02:30 does not exist that day.
    assert local("30 2 * * *", utc(2026, 3, 7, 12), 3, "America/New_York") == [
        "2026-03-08 03:00:00-0400",
        "2026-03-09 02:30:00-0400",
        "2026-03-10 02:30:00-0400",
    ]


def test_spring_forward_several_missing_times_run_once_together() -> None:
    # Every 15 minutes in the missing hour: one run at 03:00 for all four, and 03:00 itself is that run.
    assert local("*/15 1-3 * * *", utc(2026, 3, 8, 6, 40), 4, "America/New_York") == [
        "2026-03-08 01:45:00-0500",
        "2026-03-08 03:00:00-0400",
        "2026-03-08 03:15:00-0400",
        "2026-03-08 03:30:00-0400",
    ]


def test_spring_forward_an_interval_keeps_going_through_the_gap() -> None:
    # Paris, 2026-03-29: 02:00 CET becomes 03:00 CEST. Every 20 minutes: 01:40, then 03:00, 03:20.
    assert local("*/20 * * * *", utc(2026, 3, 29, 0, 30), 3, "Europe/Paris") == [
        "2026-03-29 01:40:00+0100",
        "2026-03-29 03:00:00+0200",
        "2026-03-29 03:20:00+0200",
    ]


def test_fall_back_a_repeated_time_runs_once_at_its_first_occurrence() -> None:
    # New York, 2026-11-01: 02:00 EDT becomes 01:00 EST; 01:30 happens twice and runs once.
    assert local("30 1 * * *", utc(2026, 10, 31, 12), 3, "America/New_York") == [
        "2026-11-01 01:30:00-0400",
        "2026-11-02 01:30:00-0500",
        "2026-11-03 01:30:00-0500",
    ]


def test_fall_back_nothing_runs_during_the_repeated_hour() -> None:
    assert local("*/20 * * * *", utc(2026, 11, 1, 4, 30), 7, "America/New_York") == [
        "2026-11-01 00:40:00-0400",
        "2026-11-01 01:00:00-0400",
        "2026-11-01 01:20:00-0400",
        "2026-11-01 01:40:00-0400",
        "2026-11-01 02:00:00-0500",  # an hour later than 01:40 EDT: the repeat of 01:xx is skipped
        "2026-11-01 02:20:00-0500",
        "2026-11-01 02:40:00-0500",
    ]


def test_fall_back_from_inside_the_repeated_hour() -> None:
    # The clock reads 01:10 for the second time (EST): 01:20 and 01:40 already ran at their first
    # occurrence, so the next run is 02:00.
    inside = utc(2026, 11, 1, 6, 10)
    assert inside.astimezone(zone("America/New_York")).fold == 1
    assert local("*/20 * * * *", inside, 1, "America/New_York") == ["2026-11-01 02:00:00-0500"]


def test_southern_hemisphere_and_half_hour_dst() -> None:
    # Sydney goes back on 2026-04-05 (03:00 AEDT -> 02:00 AEST) and forward on 2026-10-04 (02:00 -> 03:00).
    assert local("30 2 * * *", utc(2026, 4, 4, 0), 2, "Australia/Sydney") == [
        "2026-04-05 02:30:00+1100",
        "2026-04-06 02:30:00+1000",
    ]
    assert local("30 2 * * *", utc(2026, 10, 3, 0), 2, "Australia/Sydney") == [
        "2026-10-04 03:00:00+1100",
        "2026-10-05 02:30:00+1100",
    ]
    # Lord Howe moves its clocks by 30 minutes (02:00 -> 02:30 on 2026-10-04): 02:15 runs at 02:30.
    assert local("15 2 * * *", utc(2026, 10, 3, 0), 2, "Australia/Lord_Howe") == [
        "2026-10-04 02:30:00+1100",
        "2026-10-05 02:15:00+1100",
    ]


def test_every_instant_is_later_than_the_one_before_across_a_year_of_dst() -> None:
    for timezone in ("America/New_York", "Europe/Paris", "Australia/Lord_Howe"):
        got = fires("*/40 * * * *", utc(2026, 1, 1), 365 * 36, timezone)
        assert all(a < b for a, b in pairwise(got)), timezone
        # Each local wall time fires at most once.
        tz = zone(timezone)
        walls = [t.astimezone(tz).replace(tzinfo=None) for t in got]
        assert len(set(walls)) == len(walls), timezone


# --- looking back ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "timezone", "at", "latest"),
    [
        ("* * * * * *", "UTC", utc(2026, 5, 1, 12, 0, 0), utc(2026, 5, 1, 12, 0, 0)),
        ("* * * * * *", "UTC", utc(2026, 5, 1, 12, 0, 0) + timedelta(microseconds=5), utc(2026, 5, 1, 12, 0, 0)),
        ("*/15 * * * *", "UTC", utc(2026, 5, 1, 12, 14, 59), utc(2026, 5, 1, 12, 0)),
        ("0 0 29 2 *", "UTC", utc(2026, 5, 1), utc(2024, 2, 29)),
        ("30 2 * * *", "America/New_York", utc(2026, 3, 8, 7, 30), utc(2026, 3, 8, 7, 0)),
        ("*/20 * * * *", "America/New_York", utc(2026, 11, 1, 6, 50), utc(2026, 11, 1, 5, 40)),
    ],
)
def test_latest_at_or_before(expression: str, timezone: str, at: datetime, latest: datetime) -> None:
    assert ZonedCron.of(expression, timezone).latest_at_or_before(at) == latest
