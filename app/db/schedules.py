"""All SQL of schedules: their definitions (admin API) and the scheduler's statements, one that finds the due
schedules and those that fire their ticks (one transaction). Otherwise one autocommit statement each.

Cron and time zones are Python's business (app/cron.py): the next tick is computed there, by the
database clock read here, and written back. Firing is guarded twice, in one transaction: the schedule
advances only from the state its ticks were computed from (a replica that fired them first, or a change
through the API since, leaves nothing to do), and jobs_schedule_tick_idx admits one job per (schedule,
tick) whatever happens. The advance is one statement on `schedules` (a reference table on Citus); the ticks'
jobs are inserted by one statement per queue after it, each on its queue's shard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from app.db.jobs import as_json
from app.db.rows import DueSchedule, Fired, ScheduleRow, outcome_rows, rows_of
from app.db.scope import queue_allowed

SCHEDULE_COLUMNS = """
  s.name, s.queue_name AS queue, s.cron, s.timezone, s.payload::text AS payload, s.priority, s.max_attempts,
  s.job_group AS group, s.missed, s.paused, CASE WHEN s.paused THEN NULL ELSE s.next_run_at END AS next_run_at,
  s.last_run_at, s.created_at, s.updated_at, s.revision, s.next_run_at AS next_tick"""

# The database clock, for computing a new schedule's first tick.
CLOCK = "SELECT clock_timestamp()"


async def database_now(conn: psycopg.AsyncConnection[Any]) -> datetime:
    cur = await conn.execute(CLOCK)
    row = await cur.fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


# --- definitions ---------------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Definition:
    """A schedule as PUT defines it (validated), with its first tick from now."""

    name: str
    queue: str
    cron: str
    timezone: str
    payload: str  # serialised JSON
    priority: int | None  # None: the default when each job is made
    max_attempts: int | None
    group: str | None
    missed: str
    paused: bool | None  # None: as it was (not paused when new)
    next_run_at: datetime | None


SCHEDULE_PUT = f"""
-- The clock in VALUES, not in DO UPDATE SET: Citus takes only IMMUTABLE functions there (app/db/distribute.py).
INSERT INTO jobq.schedules AS s (name, queue_name, cron, timezone, payload, priority, max_attempts, job_group, missed,
                            paused, next_run_at, updated_at)
VALUES (%(name)s, %(queue)s, %(cron)s, %(timezone)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(group)s,
        %(missed)s, coalesce(%(paused)s::boolean, false), %(next)s, now())
ON CONFLICT (name) DO UPDATE SET
  queue_name = EXCLUDED.queue_name, cron = EXCLUDED.cron, timezone = EXCLUDED.timezone,
  payload = EXCLUDED.payload, priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
  job_group = EXCLUDED.job_group, missed = EXCLUDED.missed,
  paused = coalesce(%(paused)s::boolean, s.paused),
  -- The same cron in the same zone keeps its next tick: a definition applied again (a deploy script)
  -- neither skips a tick that is due nor repeats one. A new expression, or a resume, starts from now.
  next_run_at = CASE
    WHEN s.cron = EXCLUDED.cron AND s.timezone = EXCLUDED.timezone
         AND NOT (s.paused AND NOT coalesce(%(paused)s::boolean, true))
    THEN s.next_run_at ELSE EXCLUDED.next_run_at END,
  revision = s.revision + 1,
  updated_at = EXCLUDED.updated_at
-- A schedule of a queue the caller may not use stays as it is (the caller gets 403).
WHERE {queue_allowed("s.queue_name", "%(allowed)s::text")}
-- A row this statement inserted has no xmax; one it updated has this transaction's.
RETURNING (s.xmax = 0) AS created, {SCHEDULE_COLUMNS}
"""


# Definitions change one at a time (across replicas, for this transaction): the cap on their number
# (JOBQ_MAX_SCHEDULES) is then exact, and whether a name is free cannot change between looking and writing.
SCHEDULES_LOCK_KEY = 0x6A6F6273  # pg_advisory_xact_lock key, beside app/maintenance/vacuum.py's
SCHEDULES_LOCK = f"SELECT pg_advisory_xact_lock({SCHEDULES_LOCK_KEY})"

SCHEDULE_HOLDER = f"""
-- Whether a schedule has this name, and whether the caller may see it (its queue is one of the caller's).
SELECT {queue_allowed("s.queue_name", "%(allowed)s::text")} AS visible FROM jobq.schedules s WHERE s.name = %(name)s
"""

SCHEDULES_COUNT = "SELECT count(*) FROM jobq.schedules"


async def schedules_lock(conn: psycopg.AsyncConnection[Any]) -> None:
    """In a transaction: wait for other definitions to commit."""
    await conn.execute(SCHEDULES_LOCK)


async def schedule_holder(conn: psycopg.AsyncConnection[Any], name: str, allowed: str | None) -> bool | None:
    """None: no schedule has this name; else whether the caller may see the one that has it."""
    cur = await conn.execute(SCHEDULE_HOLDER, {"name": name, "allowed": allowed})
    row = await cur.fetchone()
    return None if row is None else bool(row[0])


async def schedules_count(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute(SCHEDULES_COUNT)
    row = await cur.fetchone()
    return int(row[0]) if row else 0


@dataclass(slots=True, frozen=True)
class Stored:
    created: bool
    schedule: ScheduleRow | None


async def schedule_put(conn: psycopg.AsyncConnection[Any], d: Definition, allowed: str | None) -> Stored | None:
    """Create or replace; None when a schedule of that name exists on a queue outside `allowed`."""
    params = {
        "name": d.name,
        "queue": d.queue,
        "cron": d.cron,
        "timezone": d.timezone,
        "payload": d.payload,
        "priority": d.priority,
        "max_attempts": d.max_attempts,
        "group": d.group,
        "missed": d.missed,
        "paused": d.paused,
        "next": d.next_run_at,
        "allowed": allowed,
    }
    cur = conn.cursor(row_factory=outcome_rows(Stored, ScheduleRow))
    await cur.execute(SCHEDULE_PUT, params)
    return await cur.fetchone()


SCHEDULE_GET = f"""
SELECT {SCHEDULE_COLUMNS} FROM jobq.schedules s
WHERE s.name = %(name)s AND {queue_allowed("s.queue_name", "%(allowed)s::text")}
"""

SCHEDULES_LIST = f"""
SELECT {SCHEDULE_COLUMNS} FROM jobq.schedules s
WHERE {queue_allowed("s.queue_name", "%(allowed)s::text")}
ORDER BY s.name
"""


async def schedule_get(conn: psycopg.AsyncConnection[Any], name: str, allowed: str | None) -> ScheduleRow | None:
    cur = conn.cursor(row_factory=rows_of(ScheduleRow))
    await cur.execute(SCHEDULE_GET, {"name": name, "allowed": allowed})
    return await cur.fetchone()


async def schedules_list(conn: psycopg.AsyncConnection[Any], allowed: str | None) -> list[ScheduleRow]:
    cur = conn.cursor(row_factory=rows_of(ScheduleRow))
    await cur.execute(SCHEDULES_LIST, {"allowed": allowed})
    return await cur.fetchall()


SCHEDULE_DELETE = f"""
DELETE FROM jobq.schedules s WHERE s.name = %(name)s AND {queue_allowed("s.queue_name", "%(allowed)s::text")}
RETURNING s.name
"""


async def schedule_delete(conn: psycopg.AsyncConnection[Any], name: str, allowed: str | None) -> bool:
    cur = await conn.execute(SCHEDULE_DELETE, {"name": name, "allowed": allowed})
    return await cur.fetchone() is not None


SCHEDULE_PAUSE = f"""
UPDATE jobq.schedules s SET paused = true, revision = s.revision + 1, updated_at = now()
WHERE s.name = %(name)s AND {queue_allowed("s.queue_name", "%(allowed)s::text")}
RETURNING {SCHEDULE_COLUMNS}
"""

SCHEDULE_RESUME = f"""
-- `next`: the first tick after now, computed from the revision read just before: the ticks of the pause
-- are not fired late. Resuming a schedule that is not paused changes nothing. The clock as a subquery: Citus
-- takes no stable function in a CASE of an UPDATE (app/db/distribute.py).
UPDATE jobq.schedules s
SET paused = false, next_run_at = CASE WHEN s.paused THEN %(next)s ELSE s.next_run_at END,
    revision = s.revision + CASE WHEN s.paused THEN 1 ELSE 0 END,
    updated_at = CASE WHEN s.paused THEN (SELECT now()) ELSE s.updated_at END
WHERE s.name = %(name)s AND s.revision = %(revision)s AND {queue_allowed("s.queue_name", "%(allowed)s::text")}
RETURNING {SCHEDULE_COLUMNS}
"""


async def schedule_pause(conn: psycopg.AsyncConnection[Any], name: str, allowed: str | None) -> ScheduleRow | None:
    cur = conn.cursor(row_factory=rows_of(ScheduleRow))
    await cur.execute(SCHEDULE_PAUSE, {"name": name, "allowed": allowed})
    return await cur.fetchone()


async def schedule_resume(
    conn: psycopg.AsyncConnection[Any], name: str, revision: int, next_run_at: datetime | None, allowed: str | None
) -> ScheduleRow | None:
    """None when the schedule changed since `revision` was read (or is gone)."""
    cur = conn.cursor(row_factory=rows_of(ScheduleRow))
    await cur.execute(SCHEDULE_RESUME, {"name": name, "revision": revision, "next": next_run_at, "allowed": allowed})
    return await cur.fetchone()


# --- the scheduler ---------------------------------------------------------------------------------------------

# Left out of the scheduler's questions: schedules whose cron or time zone this process cannot read
# (refused by this release, or missing from this machine's zone data), for as long as they hold that very
# text: as due as ever, they would otherwise be read again at once, pass after pass.
NOT_UNREADABLE = """NOT EXISTS (
  SELECT FROM unnest(%(skip_names)s::text[], %(skip_crons)s::text[], %(skip_zones)s::text[]) AS x(name, cron, tz)
  WHERE x.name = schedules.name AND x.cron = schedules.cron AND x.tz = schedules.timezone)"""

SCHEDULES_DUE = f"""
-- Active schedules whose next tick has come, by the database clock, through schedules_due_idx. Not
-- locked: replicas that read the same schedule compute the same ticks, and SCHEDULES_FIRE lets one of
-- them through.
SELECT name, cron, timezone, missed, next_run_at, revision, now() AS now
FROM jobq.schedules
WHERE NOT paused AND next_run_at <= now() AND {NOT_UNREADABLE}
ORDER BY next_run_at
LIMIT %(batch)s
"""


def _skip(unreadable: Mapping[str, tuple[str, str]]) -> dict[str, list[str]]:
    return {
        "skip_names": list(unreadable),
        "skip_crons": [cron for cron, _ in unreadable.values()],
        "skip_zones": [tz for _, tz in unreadable.values()],
    }


async def schedules_due(
    conn: psycopg.AsyncConnection[Any], batch: int, unreadable: Mapping[str, tuple[str, str]] | None = None
) -> list[DueSchedule]:
    """`unreadable`: name -> (cron, timezone) of schedules to leave out while they hold that text."""
    cur = conn.cursor(row_factory=rows_of(DueSchedule))
    await cur.execute(SCHEDULES_DUE, {"batch": batch, **_skip(unreadable or {})})
    return await cur.fetchall()


@dataclass(slots=True, frozen=True)
class Firing:
    """What one pass does to one due schedule: the ticks to enqueue (oldest first, maybe none), and
    where the schedule goes next."""

    name: str
    revision: int
    due: datetime  # next_run_at as read: the guard
    ticks: Sequence[datetime]
    next_run_at: datetime | None


SCHEDULES_ADVANCE = """
WITH advance AS (
  SELECT * FROM json_to_recordset(%(advance)s::json)
    AS a(name text, revision bigint, due timestamptz, next timestamptz, last timestamptz)
)
-- Only from the state the ticks were computed from. Replicas that fire the same ticks queue on the row lock
-- (held until the ticks' jobs are made, in the same transaction); the first moves next_run_at, and the others
-- then match nothing and enqueue nothing.
UPDATE jobq.schedules AS s
SET next_run_at = a.next, last_run_at = coalesce(a.last, s.last_run_at)
FROM advance a
WHERE s.name = a.name AND s.revision = a.revision AND s.next_run_at = a.due AND NOT s.paused
RETURNING s.name, s.queue_name
"""

SCHEDULE_TICKS_INSERT = """
-- The ticks of the schedules of one queue that SCHEDULES_ADVANCE advanced, in its transaction: one statement
-- per queue, so that on Citus each writes the one shard of its queue (app/db/distribute.py). What the schedule
-- leaves out comes from the queue's configuration (GET /queues/{queue}/config) as it is when the job is made,
-- else the service's defaults, as for any enqueue.
WITH ticks AS (
  SELECT * FROM json_to_recordset(%(ticks)s::json) AS t(name text, tick timestamptz)
)
INSERT INTO jobq.jobs (queue_name, payload, priority, max_attempts, group_key, schedule, scheduled_for)
SELECT s.queue_name, s.payload, coalesce(s.priority, q.default_priority, 0),
       coalesce(s.max_attempts, q.max_attempts, %(max_attempts)s), s.job_group, s.name, t.tick
FROM jobq.schedules s JOIN ticks t USING (name)
LEFT JOIN jobq.queue_state q ON q.queue_name = s.queue_name AND q.queue_name = %(queue)s
WHERE s.queue_name = %(queue)s
ORDER BY t.tick, s.name
-- One job per (schedule, tick), whatever else happened: the last word on duplicates.
ON CONFLICT DO NOTHING  -- jobs_schedule_tick_idx (no arbiter named: its columns differ on Citus, app/db/distribute.py)
RETURNING id, queue_name AS queue, schedule, scheduled_for
"""


async def schedules_fire(
    conn: psycopg.AsyncConnection[Any], firings: Sequence[Firing], max_attempts: int
) -> list[Fired]:
    """Advance the schedules and enqueue their ticks, in one transaction: the advance, then one insert per queue
    of the schedules it advanced; returns the jobs made. `max_attempts`: for schedules that name none."""
    advance = [
        {
            "name": f.name,
            "revision": f.revision,
            "due": f.due,
            "next": f.next_run_at,
            "last": max(f.ticks, default=None),
        }
        for f in firings
    ]
    fired: list[Fired] = []
    cur = conn.cursor(row_factory=rows_of(Fired))
    async with conn.transaction():
        advanced = await conn.execute(SCHEDULES_ADVANCE, {"advance": as_json(advance)})
        queue_of = {str(name): str(queue) for name, queue in await advanced.fetchall()}
        ticks: dict[str, list[dict[str, Any]]] = {}
        for f in firings:
            if f.name in queue_of and f.ticks:
                ticks.setdefault(queue_of[f.name], []).extend({"name": f.name, "tick": t} for t in f.ticks)
        for queue in sorted(ticks):
            params = {"queue": queue, "ticks": as_json(ticks[queue]), "max_attempts": max_attempts}
            await cur.execute(SCHEDULE_TICKS_INSERT, params)
            fired += await cur.fetchall()
    return fired


SCHEDULES_NEXT_DUE = f"""
-- Seconds until the earliest active schedule is due, by the database clock (NULL: none).
SELECT extract(epoch FROM min(next_run_at) - now())::float8 FROM jobq.schedules WHERE NOT paused AND {NOT_UNREADABLE}
"""


async def schedules_next_due(
    conn: psycopg.AsyncConnection[Any], unreadable: Mapping[str, tuple[str, str]] | None = None
) -> float | None:
    cur = await conn.execute(SCHEDULES_NEXT_DUE, _skip(unreadable or {}))
    row = await cur.fetchone()
    return None if row is None or row[0] is None else float(row[0])
