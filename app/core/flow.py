"""Queue configuration: read and changed through the API, cached per process, and the defaults it gives
enqueue, fail, claim and retention.

Every process keeps the configuration of the queues it has served, read once from PostgreSQL. A change
commits together with a NOTIFY ("config <queue>", app/db/flow.py) that app/maintenance/listener.py turns
into invalidate() in every process, so a change takes effect everywhere as soon as it is durable. A
listener that reconnects forgets everything (a message may have gone by unheard), and an entry is read
again after CACHE_SECONDS at the latest. Limits never rely on the cache alone: the claim of an unlimited
queue refuses to claim from a queue that has limits (app/db/claim.py JOB_CLAIM), and the limited claim
reads the limits in its own statement (app/db/claim.py JOB_CLAIM_LIMITED)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from app.db import flow as store_flow
from app.db.flow import CONFIG_FIELDS, QueueConfigRow
from app.db.pool import Database
from app.db.spread import key_names
from app.errors import ValidationFailed
from app.models.flow import QueueConfigPatch
from app.settings import Settings

CACHE_SECONDS = 10.0
MAX_ENTRIES = 10_000


@dataclass(frozen=True, slots=True)
class Effective:
    """A queue's settings with the global ones filled in."""

    max_attempts: int
    backoff_base_seconds: float
    backoff_max_seconds: float
    lease_seconds: int
    default_priority: int
    retention: dict[str, int]  # status -> seconds (0: keep)
    limited: bool
    max_pending: int  # jobs not yet started (app/core/quotas.py)
    spread: int  # keys an enqueue spreads new jobs over (app/db/spread.py): 1, the queue's own name alone
    keys: tuple[str, ...]  # the names of every key a claim takes from, key 0 (the queue's name) first; (): it alone


def effective(s: Settings, row: QueueConfigRow | None) -> Effective:
    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    r = row
    return Effective(
        max_attempts=pick(r and r.max_attempts, s.default_max_attempts),
        backoff_base_seconds=pick(r and r.backoff_base_seconds, s.backoff_base_seconds),
        backoff_max_seconds=pick(r and r.backoff_max_seconds, s.backoff_cap_seconds),
        lease_seconds=pick(r and r.lease_seconds, s.lease_default_seconds),
        default_priority=pick(r and r.default_priority, 0),
        retention={
            "completed": pick(r and r.retention_completed_seconds, s.retention_completed_seconds),
            "failed": pick(r and r.retention_failed_seconds, s.retention_failed_seconds),
            "cancelled": pick(r and r.retention_cancelled_seconds, s.retention_cancelled_seconds),
        },
        limited=bool(r and r.limited),
        max_pending=pick(r and r.max_pending, s.max_pending_jobs),
        spread=r.spread or 1 if r is not None else 1,
        keys=key_names(r.queue, r.keys_used) if r is not None else (),
    )


def changes_of(patch: QueueConfigPatch) -> dict[str, Any]:
    """The stored fields a PATCH sets or clears (None), from the fields it names."""
    out: dict[str, Any] = {}
    for name in patch.model_fields_set:
        value = getattr(patch, name)
        if name == "retention":
            kept = value.model_fields_set if value is not None else {"completed", "failed", "cancelled"}
            for status in kept:
                out[f"retention_{status}_seconds"] = getattr(value, status) if value is not None else None
        elif name in ("rate", "group_rate"):
            out[f"{name}_limit"] = value.limit if value is not None else None
            out[f"{name}_per_seconds"] = value.per_seconds if value is not None else None
        else:
            out[name] = value
    return out


def merged(current: QueueConfigRow, changes: dict[str, Any]) -> dict[str, Any]:
    """The stored fields after a partial update (a None in `changes` clears the field)."""
    values = {f: getattr(current, f) for f in CONFIG_FIELDS}
    values.update(changes)
    return values


# The settings that need every claim of the queue to read one shard (a spread of 1): the limits, counted by the
# claim statement, and the orders kept across the queue's jobs (API field, stored field).
_SPREAD_ONLY_ONE = (
    ("concurrency", "concurrency"),
    ("rate", "rate_limit"),
    ("group_concurrency", "group_concurrency"),
    ("group_rate", "group_rate_limit"),
    ("fair", "fair"),
    ("ordered", "ordered"),
)


def check(s: Settings, values: dict[str, Any], keys_used: int = 1) -> None:
    """Rules across fields, on the configuration as it would be stored (422 when broken). Ranges of single
    fields are the request model's (app/models/flow.py). `keys_used`: the keys the queue's claims would take from
    (app/db/spread.py; more than `spread` when it was lowered and the keys above still hold jobs)."""
    problems: list[tuple[str, str]] = []
    spread = values.get("spread") or 1
    if max(spread, keys_used) > 1:
        # Each key is claimed by statements of its own, on its own shard: a limit counted in one statement, or an
        # order kept across a queue's jobs, cannot hold across keys (docs/scale-out.md).
        why = (
            "spread must be 1 or unset"
            if spread > 1
            else f"keys 1 to {keys_used - 1} of the queue may still hold jobs: they are retired once empty, by a "
            f"configuration change made {CACHE_SECONDS:.0f} s or more after the spread was lowered"
        )
        for name, field in _SPREAD_ONLY_ONE:
            if values.get(field) is not None and values.get(field) is not False:
                problems.append((name, f"holds only on a queue kept under one key: {why}"))
    if values.get("ordered") and (values.get("group_concurrency") or 1) != 1:
        problems.append(("ordered", "strict order within a group runs one job of the group at a time: "
                         "group_concurrency must be 1 or unset"))  # fmt: skip
    base = values.get("backoff_base_seconds") or s.backoff_base_seconds
    cap = values.get("backoff_max_seconds") or s.backoff_cap_seconds
    if base > cap:
        problems.append(("backoff_base_seconds", f"{base} exceeds backoff_max_seconds ({cap})"))
    lease = values.get("lease_seconds")
    if lease is not None and lease > s.lease_max_seconds:
        problems.append(("lease_seconds", f"exceeds the longest lease a claim may ask (JOBQ_LEASE_MAX_SECONDS, "
                         f"{s.lease_max_seconds})"))  # fmt: skip
    if problems:
        errors = [{"loc": ["body", f], "msg": m, "type": "value_error"} for f, m in problems]
        raise ValidationFailed("; ".join(f"body.{f}: {m}" for f, m in problems), errors=errors)


def _settled(changed_at: datetime | None) -> bool:
    """A change made at `changed_at` has reached every process's cache (CACHE_SECONDS ago or more)."""
    return changed_at is None or datetime.now(UTC) - changed_at > timedelta(seconds=CACHE_SECONDS)


@dataclass(frozen=True, slots=True)
class _Entry:
    expires: float  # monotonic
    row: QueueConfigRow | None
    effective: Effective


class QueueConfigs:
    """The per-process cache of queue configurations."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self._entries: dict[str, _Entry] = {}
        self._loading: dict[str, asyncio.Future[_Entry]] = {}
        self._generation = 0
        self.lookups = 0  # database reads so far (tests, diagnostics)

    def cached(self, queue: str) -> Effective | None:
        """The queue's settings when cached and fresh, without waiting; None: call `get`."""
        entry = self._entries.get(queue)
        if entry is None or entry.expires < time.monotonic():
            return None
        return entry.effective

    def keys_of(self, queue: str) -> tuple[str, ...] | None:
        """The keys of a spread queue as last read, however long ago (the fallback poll's look for ready jobs
        asks every key without a read of its own per queue); (): the queue's own name alone; None: not held
        (never read, or dropped: the caller reads it)."""
        entry = self._entries.get(queue)
        return None if entry is None else entry.effective.keys

    def may_be_limited(self, queue: str) -> bool:
        """Whether a slot freed on this queue may let a waiting claim proceed: its cached configuration has
        limits, or this process has none cached (never read, aged out, dropped after a listener reconnect),
        so it cannot rule them out. A wake-up costs nothing where no claim waits on the queue."""
        cfg = self.cached(queue)
        return cfg is None or cfg.limited

    async def get(self, queue: str) -> Effective:
        return self.cached(queue) or (await self._load(queue)).effective

    async def row(self, queue: str) -> QueueConfigRow | None:
        entry = self._entries.get(queue)
        if entry is None or entry.expires < time.monotonic():
            entry = await self._load(queue)
        return entry.row

    def invalidate(self, queue: str | None = None) -> None:
        """Forget one queue's configuration (it changed), or every one (we may have missed a change)."""
        self._generation += 1
        if queue is None:
            self._entries.clear()
        else:
            self._entries.pop(queue, None)

    def remember(self, row: QueueConfigRow) -> None:
        """A configuration this process has just written (its own NOTIFY will arrive too)."""
        self._put(row.queue, row)

    async def _load(self, queue: str) -> _Entry:
        # Concurrent first uses of one queue share one read.
        pending = self._loading.get(queue)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(queue))
            self._loading[queue] = pending
            pending.add_done_callback(lambda _: self._loading.pop(queue, None))
        return await asyncio.shield(pending)

    async def _fetch(self, queue: str) -> _Entry:
        generation = self._generation
        async with self.db.connection() as conn:
            row = await store_flow.queue_config_get(conn, queue)
        self.lookups += 1
        if generation != self._generation:  # changed while we read: answer, but do not keep it
            return _Entry(0.0, row, effective(self.settings, row))
        return self._put(queue, row)

    def _put(self, queue: str, row: QueueConfigRow | None) -> _Entry:
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        entry = _Entry(time.monotonic() + CACHE_SECONDS, row, effective(self.settings, row))
        self._entries[queue] = entry
        return entry

    # -- changes ------------------------------------------------------------------------------------------

    async def update(self, queue: str, changes: dict[str, Any]) -> QueueConfigRow:
        """Apply a partial update (None clears a field) and tell every process. Rules across fields are
        checked on the result, under the row's lock, so two concurrent changes cannot combine into a
        configuration that either alone would have been refused for."""
        async with self.db.connection() as conn, conn.transaction():
            current = await store_flow.queue_config_lock(conn, queue)
            values = merged(current, changes)
            spread = values.get("spread") or 1
            keys_used = max(current.keys_used, spread)
            if keys_used > spread and current.spread == spread and _settled(current.changed_at):
                # The spread was lowered by an earlier change, long enough ago that every process enqueues under
                # the keys it left (its cached configuration is at most CACHE_SECONDS old): the keys above it that
                # hold no job not yet finished are retired, and claims stop taking from them.
                above = key_names(queue, keys_used)[spread:]
                keys_used = spread + await store_flow.queue_keys_busy(conn, above)
            check(self.settings, values, keys_used)
            row = await store_flow.queue_config_set(conn, queue, values, keys_used)
            await store_flow.queue_keys_sync(conn, queue, key_names(queue, row.keys_used)[1:])
        self.invalidate(queue)
        self.remember(row)
        return row
