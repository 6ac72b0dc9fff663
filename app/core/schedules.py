"""Schedules: what the admin endpoints do, and which ticks a scheduler pass enqueues (`plan`, pure).

When is a tick fired, and when is it missed? A tick is due at its instant. A pass that finds it at most
JOBQ_SCHEDULE_GRACE_SECONDS late enqueues it: a busy process, or a replica restarting, delays a tick but
loses none. A tick found later than that was missed (no replica ran while it was due): `skip` enqueues
none of the missed ticks, `catch_up` one job for the latest of them. Either way, every tick is enqueued
at most once (app/db/schedules.py)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import lru_cache

from app.core.jobs import json_text
from app.cron import ZonedCron
from app.db import schedules as store
from app.db.pool import Database
from app.db.rows import ScheduleRow
from app.db.schedules import Definition
from app.errors import Forbidden, ScheduleNameTaken, ScheduleNotFound, TooManySchedules
from app.models.schedules import ScheduleRequest
from app.settings import Settings

TICKS_PER_PASS = 1000  # per schedule; a longer backlog (a fine-grained cron, a long grace) takes more passes


@lru_cache(maxsize=4096)
def zoned(cron: str, timezone: str) -> ZonedCron:
    """Parsed once per process: every pass reads the same few expressions."""
    return ZonedCron.of(cron, timezone)


def plan(
    z: ZonedCron, due: datetime, now: datetime, grace: timedelta, catch_up: bool, limit: int = TICKS_PER_PASS
) -> tuple[list[datetime], datetime | None]:
    """The ticks a pass at `now` enqueues for a schedule whose next tick is `due` (<= now), oldest first,
    and the schedule's next tick after them (None: it fires no more)."""
    ticks: list[datetime] = []
    horizon = now - grace
    nxt: datetime | None = due
    if due <= horizon:
        # Ticks at or before the horizon were missed.
        if catch_up and (latest := z.latest_at_or_before(horizon)) is not None and latest >= due:
            ticks.append(latest)
        nxt = z.next_after(horizon)
    while nxt is not None and nxt <= now and len(ticks) < limit:
        ticks.append(nxt)
        nxt = z.next_after(nxt)
    return ticks, nxt


class ScheduleService:
    def __init__(self, settings: Settings, db: Database, changed: Callable[[], None]) -> None:
        self.settings = settings
        self.db = db
        self.changed = changed  # this process's scheduler looks again (a new first tick may be soon)

    async def put(self, name: str, req: ScheduleRequest, allowed: str | None, may_create: bool = True) -> store.Stored:
        """Create or replace. `may_create` false: replace only (a key limited to some queues, naming a schedule
        outside its namespace: see app/http/schedules.py); a name that is free, or held by a schedule the key
        cannot see, is then refused alike."""
        timezone = req.timezone or "UTC"
        z = zoned(req.cron, timezone)
        payload = json_text(
            req.payload, self.settings.max_payload_bytes, self.settings.max_json_depth, ["body", "payload"]
        )
        async with self.db.connection() as conn, conn.transaction():
            await store.schedules_lock(conn)
            visible = await store.schedule_holder(conn, name, allowed)
            if not may_create and not visible:
                raise Forbidden(
                    f"A key limited to some queues names the schedules it creates like its queues: `{name}` "
                    "matches none of this key's patterns (and no schedule of its queues has this name)."
                )
            if visible is False:
                raise ScheduleNameTaken()
            if visible is None and await store.schedules_count(conn) >= self.settings.max_schedules:
                raise TooManySchedules(
                    f"This service holds {self.settings.max_schedules} schedules (JOBQ_MAX_SCHEDULES); delete one "
                    "first."
                )
            first = z.next_after(await store.database_now(conn))
            definition = Definition(
                name=name,
                queue=req.queue,
                cron=req.cron,
                timezone=timezone,
                payload=payload,
                priority=req.priority,
                max_attempts=req.max_attempts,
                group=req.group,
                missed=req.missed,
                paused=req.paused,
                next_run_at=first,
            )
            stored = await store.schedule_put(conn, definition, allowed)
        if stored is None:  # unreachable under the lock: a schedule of another queue took the name
            raise ScheduleNameTaken()
        self.changed()
        return stored

    async def get(self, name: str, allowed: str | None) -> ScheduleRow:
        async with self.db.connection() as conn:
            found = await store.schedule_get(conn, name, allowed)
        if found is None:
            raise ScheduleNotFound()
        return found

    async def list(self, allowed: str | None) -> list[ScheduleRow]:
        async with self.db.connection() as conn:
            return await store.schedules_list(conn, allowed)

    async def delete(self, name: str, allowed: str | None) -> None:
        async with self.db.connection() as conn:
            if not await store.schedule_delete(conn, name, allowed):
                raise ScheduleNotFound()

    async def pause(self, name: str, allowed: str | None) -> ScheduleRow:
        async with self.db.connection() as conn:
            found = await store.schedule_pause(conn, name, allowed)
        if found is None:
            raise ScheduleNotFound()
        return found

    async def resume(self, name: str, allowed: str | None) -> ScheduleRow:
        """Paused: runs again from the first tick after now (the ticks of the pause are not enqueued late)."""
        for _ in range(5):  # changed between the read and the write: read again
            async with self.db.connection() as conn:
                current = await store.schedule_get(conn, name, allowed)
                if current is None:
                    raise ScheduleNotFound()
                first = zoned(current.cron, current.timezone).next_after(await store.database_now(conn))
                resumed = await store.schedule_resume(conn, name, current.revision, first, allowed)
            if resumed is not None:
                self.changed()
                return resumed
        raise ScheduleNotFound()  # deleted and re-created, again and again: give up as if gone
