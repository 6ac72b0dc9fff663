"""Cron expressions: parsing, and the instants at which one fires in an IANA timezone, DST included.

Pure logic, no I/O, and a leaf (it imports nothing of the app): app/models/schedules.py validates with it,
app/core/schedules.py decides what to enqueue from these instants.

Syntax (Vixie cron's, plus an optional seconds field first):

    [second] minute hour day-of-month month day-of-week

five fields, or six with seconds first (five fields fire at second 0). Each field is a comma-separated
list of `*`, `N`, `A-B`, `*/S`, `A-B/S` or `N/S` (N to the field's maximum in steps of S). Months take
JAN-DEC and days SUN-SAT as well as numbers (case-insensitive); day-of-week 0 and 7 are both Sunday. `?`
is accepted for `*` in the two day fields. Macros: @yearly (@annually), @monthly, @weekly, @daily
(@midnight), @hourly.

Day-of-month and day-of-week combine as in Vixie cron: when both are restricted (neither starts with
`*` or `?`), a day matches if EITHER matches ("0 0 13 * FRI": every 13th and every Friday); otherwise
both must match.

Time zones. A cron describes local wall-clock times; each becomes an instant like this:
  * a wall time that occurs once is that instant;
  * a wall time that does not exist (the hour skipped when clocks go forward) fires once, at the first
    instant after the gap; several such times of one gap fire once together;
  * a wall time that occurs twice (the hour repeated when clocks go back) fires once, at its first
    occurrence: nothing fires during the repeat.
So each local wall time fires at most once, and never is lost. The map from wall time to instant never
goes backwards, which is what lets next_after() scan wall times in order.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

SECOND = timedelta(seconds=1)
# Every pattern of the Gregorian calendar (leap years included) repeats within 400 years: a cron that
# matches no wall time in 400 years never will.
SEARCH_YEARS = 400

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {
    m: i + 1 for i, m in enumerate(("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"))
}
_DAYS = {d: i for i, d in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
_ITEM = re.compile(r"^(?:(?P<star>[*?])|(?P<lo>[0-9A-Za-z]+)(?:-(?P<hi>[0-9A-Za-z]+))?)(?:/(?P<step>[0-9]+))?$")


# Anything but printable ASCII, space and tab (a cron expression is ASCII: names of months and days).
_UNPRINTABLE = re.compile(r"[^\t\x20-\x7e]")


class CronError(ValueError):
    """A cron expression or a time zone that cannot be used; the message says what is wrong."""


@dataclass(frozen=True)
class _Field:
    name: str
    lo: int
    hi: int
    names: dict[str, int] | None = None


_SECOND = _Field("second", 0, 59)
_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DOM = _Field("day-of-month", 1, 31)
_MONTH = _Field("month", 1, 12, _MONTHS)
_DOW = _Field("day-of-week", 0, 7, _DAYS)


def _value(text: str, field: _Field) -> int:
    if text.isdigit():
        n = int(text)
    elif field.names is not None and text.upper() in field.names:
        n = field.names[text.upper()]
    elif field.names is not None:
        raise CronError(f"{field.name}: {text!r} is not a number or a name ({', '.join(field.names)})")
    else:
        raise CronError(f"{field.name}: {text!r} is not a number")
    if not field.lo <= n <= field.hi:
        raise CronError(f"{field.name}: {n} is out of range {field.lo}-{field.hi}")
    return n


def _parse_field(text: str, field: _Field) -> tuple[int, ...]:
    values: set[int] = set()
    for item in text.split(","):
        m = _ITEM.match(item)
        if m is None:
            raise CronError(f"{field.name}: cannot read {item!r} (use *, N, A-B, */S, A-B/S or N/S)")
        if m["star"] == "?" and field not in (_DOM, _DOW):
            raise CronError(f"{field.name}: `?` is only for day-of-month and day-of-week")
        step = int(m["step"]) if m["step"] is not None else 1
        if step == 0:
            raise CronError(f"{field.name}: a step of 0 in {item!r}")
        if m["star"]:
            lo, hi = field.lo, field.hi
        else:
            lo = _value(m["lo"], field)
            # "N/S" runs from N to the field's maximum; "N" is N alone.
            hi = _value(m["hi"], field) if m["hi"] is not None else field.hi if m["step"] is not None else lo
            if lo > hi:
                raise CronError(f"{field.name}: the range {item!r} runs backwards (write it as two ranges)")
        values.update(range(lo, hi + 1, step))
    if field is _DOW:
        values = {0 if v == 7 else v for v in values}
    return tuple(sorted(values))


def _after(values: tuple[int, ...], n: int) -> int | None:
    """The smallest value > n, or None."""
    i = bisect_left(values, n + 1)
    return values[i] if i < len(values) else None


@dataclass(frozen=True)
class Cron:
    """A parsed expression: which wall-clock times it matches (no time zone)."""

    text: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # 0 = Sunday
    day_or: bool  # both day fields restricted: either may match (Vixie cron)

    @classmethod
    def parse(cls, text: str) -> Cron:
        if bad := _UNPRINTABLE.search(text):
            # A newline (or a Unicode space) would split into fields like a space, and be stored as typed.
            raise CronError(f"character {bad.group()!r}: separate the fields with spaces (or tabs) only")
        spec = text.strip()
        if spec.startswith("@"):
            if spec.lower() not in MACROS:
                raise CronError(f"unknown macro {spec!r} (use one of {', '.join(MACROS)})")
            spec = MACROS[spec.lower()]
        parts = spec.split()
        if len(parts) == 5:
            parts = ["0", *parts]
        elif len(parts) != 6:
            raise CronError(
                f"{len(parts)} fields: give 5 (minute hour day-of-month month day-of-week) or 6 (with the second first)"
            )
        second, minute, hour, dom, month, dow = parts
        cron = cls(
            text=text.strip(),
            seconds=_parse_field(second, _SECOND),
            minutes=_parse_field(minute, _MINUTE),
            hours=_parse_field(hour, _HOUR),
            days=_parse_field(dom, _DOM),
            months=_parse_field(month, _MONTH),
            weekdays=_parse_field(dow, _DOW),
            day_or=not dom.startswith(("*", "?")) and not dow.startswith(("*", "?")),
        )
        if cron.next_wall(datetime(2000, 1, 1)) is None:
            raise CronError("it never fires (no month has such a day)")
        return cron

    def day_matches(self, d: date) -> bool:
        dom = d.day in self.days
        dow = d.isoweekday() % 7 in self.weekdays
        return (dom or dow) if self.day_or else (dom and dow)

    def next_wall(self, start: datetime) -> datetime | None:
        """The first naive wall time at or after `start` (rounded up to the second) that matches, or None
        when none does within SEARCH_YEARS."""
        dt = start.replace(microsecond=0) + (SECOND if start.microsecond else timedelta(0))
        last_year = min(dt.year + SEARCH_YEARS, 9998)
        while dt.year <= last_year:
            if dt.month not in self.months:
                month = _after(self.months, dt.month)
                dt = datetime(dt.year, month, 1) if month else datetime(dt.year + 1, self.months[0], 1)
                continue
            if not self.day_matches(dt.date()):
                dt = datetime(dt.year, dt.month, dt.day) + timedelta(days=1)
                continue
            if dt.hour not in self.hours:
                hour = _after(self.hours, dt.hour)
                if hour is None:
                    dt = datetime(dt.year, dt.month, dt.day) + timedelta(days=1)
                else:
                    dt = dt.replace(hour=hour, minute=0, second=0)
                continue
            if dt.minute not in self.minutes:
                minute = _after(self.minutes, dt.minute)
                if minute is None:
                    dt = dt.replace(minute=0, second=0) + timedelta(hours=1)
                else:
                    dt = dt.replace(minute=minute, second=0)
                continue
            if dt.second not in self.seconds:
                second = _after(self.seconds, dt.second)
                dt = dt.replace(second=0) + timedelta(minutes=1) if second is None else dt.replace(second=second)
                continue
            return dt
        return None


@lru_cache(maxsize=1)
def _zone_names() -> frozenset[str]:
    # Read once (it walks the zone directories): the IANA names of the machine's zone data, or of the
    # tzdata package where the machine has none.
    return frozenset(available_timezones())


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name` ("UTC", "Europe/Paris"). Only names of the zone database: not a file
    path, nor the machine's own "localtime", whose meaning would differ from host to host."""
    if name != "UTC" and (name not in _zone_names() or name in ("localtime", "Factory")):
        raise CronError(f"unknown time zone {name!r} (use an IANA name such as UTC or Europe/Paris)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise CronError(f"unknown time zone {name!r} (use an IANA name such as UTC or Europe/Paris)") from exc


def _gap_end(wall: datetime, tz: tzinfo, before: timedelta, after: timedelta) -> datetime:
    """The instant a DST gap that holds `wall` ends (the clocks' jump), found to the second. Read with the
    offset from before the jump, `wall` lands after it; with the offset from after, before it."""
    lo = (wall - after).replace(tzinfo=UTC)  # before the jump
    hi = (wall - before).replace(tzinfo=UTC)  # after it
    while hi - lo > SECOND:
        mid = lo + (hi - lo) // 2
        mid = mid.replace(microsecond=0)
        if mid.astimezone(tz).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return hi


def instant(wall: datetime, tz: tzinfo) -> datetime:
    """The instant (UTC) at which a naive wall time of `tz` fires: see the module docstring."""
    first = wall.replace(tzinfo=tz, fold=0)
    second = wall.replace(tzinfo=tz, fold=1)
    before, after = first.utcoffset(), second.utcoffset()
    assert before is not None and after is not None
    if before >= after:
        # Occurs once (equal offsets), or twice (the clocks went back): fold=0 is the first occurrence.
        return (wall - before).replace(tzinfo=UTC)
    return _gap_end(wall, tz, before, after)  # does not exist: the clocks went forward over it


@dataclass(frozen=True)
class ZonedCron:
    """A cron expression in a time zone: the instants at which it fires."""

    cron: Cron
    tz: tzinfo

    @classmethod
    def of(cls, expression: str, timezone: str = "UTC") -> ZonedCron:
        return cls(Cron.parse(expression), zone(timezone))

    def next_after(self, t: datetime) -> datetime | None:
        """The first instant strictly after `t` (aware) at which it fires, in UTC; None if it never does
        again (within SEARCH_YEARS, or before year 9999)."""
        local = t.astimezone(self.tz)
        start = local.replace(tzinfo=None, fold=0)
        try:
            while (wall := self.cron.next_wall(start)) is not None:
                when = instant(wall, self.tz)
                # Rejected: wall times at or before t, and, when t is in the second pass of a repeated
                # hour, the first pass of the times after it (they fired then).
                if when > t:
                    return when
                start = wall + SECOND
        except OverflowError:
            pass  # past year 9999
        return None

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        """The last instant at or before `t` at which it fires (None if none within SEARCH_YEARS): found
        with next_after() alone, by doubling a look-back window and then halving it."""

        def fires_in(since: datetime) -> bool:  # fires in (since, t]
            n = self.next_after(since)
            return n is not None and n <= t

        reach = SECOND
        limit = timedelta(days=366 * SEARCH_YEARS)
        while not fires_in(t - reach):
            if reach > limit:
                return None
            reach *= 2
        lo, hi = t - reach, t - reach / 2 if reach > SECOND else t  # fires in (lo, t]; not in (hi, t]
        while hi - lo > SECOND:
            mid = lo + (hi - lo) / 2
            if fires_in(mid):
                lo = mid
            else:
                hi = mid
        return self.next_after(lo)
