"""Queue configuration: the per-queue settings (stored on queue_state) as read, locked and changed, the
queues whose retention differs, and the pruning of the claim ledger that rate limits count (queue_claims).
The claim under these limits is app/db/claim.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from app.db.channels import CHANNEL, CONFIG_CHANGED
from app.db.jobs import RUNNING_C
from app.db.rows import rows_of

# --- configuration ------------------------------------------------------------------------------------------

CONFIG_FIELDS = (
    "max_attempts",
    "backoff_base_seconds",
    "backoff_max_seconds",
    "lease_seconds",
    "default_priority",
    "retention_completed_seconds",
    "retention_failed_seconds",
    "retention_cancelled_seconds",
    "concurrency",
    "rate_limit",
    "rate_per_seconds",
    "group_concurrency",
    "group_rate_limit",
    "group_rate_per_seconds",
    "fair",
    "ordered",
    "max_pending",
    "timeout_seconds",
    "spread",
)


@dataclass(slots=True, frozen=True)
class QueueConfigRow:
    """A queue's configuration as stored; None: the global setting."""

    queue: str
    max_attempts: int | None
    backoff_base_seconds: float | None
    backoff_max_seconds: float | None
    lease_seconds: int | None
    default_priority: int | None
    retention_completed_seconds: int | None
    retention_failed_seconds: int | None
    retention_cancelled_seconds: int | None
    concurrency: int | None
    rate_limit: int | None
    rate_per_seconds: int | None
    group_concurrency: int | None
    group_rate_limit: int | None
    group_rate_per_seconds: int | None
    fair: bool | None
    ordered: bool | None
    max_pending: int | None
    timeout_seconds: int | None  # hard timeout of the queue's jobs that have none of their own
    spread: int | None  # keys an enqueue spreads the queue's jobs over (app/db/spread.py); stored 1 for None
    keys_used: int  # keys the queue has ever been spread over: a claim takes from every one of them
    limited: bool
    grouped: bool
    changed_at: datetime | None


_COLUMNS = "queue_name AS queue, " + ", ".join(CONFIG_FIELDS) + ", keys_used, limited, grouped, changed_at"

QUEUE_CONFIG_GET = f"SELECT {_COLUMNS} FROM jobq.queue_state WHERE queue_name = %(queue)s"


async def queue_config_get(conn: psycopg.AsyncConnection[Any], queue: str) -> QueueConfigRow | None:
    cur = conn.cursor(row_factory=rows_of(QueueConfigRow))
    await cur.execute(QUEUE_CONFIG_GET, {"queue": queue})
    return await cur.fetchone()


QUEUE_CONFIG_LOCK = f"""
-- The row to change, created when the queue has none, and locked until the change commits (DO UPDATE
-- locks the row it finds): two changes of one queue apply one after the other, each to what the other left.
INSERT INTO jobq.queue_state AS s (queue_name) VALUES (%(queue)s)
ON CONFLICT (queue_name) DO UPDATE SET queue_name = s.queue_name
RETURNING {_COLUMNS}
"""

QUEUE_CONFIG_SET = f"""
UPDATE jobq.queue_state SET {", ".join(f"{f} = %({f})s" for f in CONFIG_FIELDS if f != "spread")},
  spread = coalesce(%(spread)s, 1), keys_used = %(keys_used)s, changed_at = now()
WHERE queue_name = %(queue)s
RETURNING {_COLUMNS}
"""

# Delivered at commit: every process drops its cached configuration of this queue as soon as the change is
# durable (app/maintenance/listener.py). A statement of its own, on the session's own server: on Citus the
# change above runs on the node holding the queue's shard, where a NOTIFY inside it would reach nobody.
QUEUE_CONFIG_CHANGED = f"SELECT pg_notify('{CHANNEL}', '{CONFIG_CHANGED} ' || %(queue)s::text)"


async def queue_config_lock(conn: psycopg.AsyncConnection[Any], queue: str) -> QueueConfigRow:
    """In a transaction: the queue's configuration, locked for a change."""
    cur = conn.cursor(row_factory=rows_of(QueueConfigRow))
    await cur.execute(QUEUE_CONFIG_LOCK, {"queue": queue})
    row = await cur.fetchone()
    assert row is not None
    return row


async def queue_config_set(
    conn: psycopg.AsyncConnection[Any], queue: str, values: dict[str, Any], keys_used: int
) -> QueueConfigRow:
    """In the transaction of queue_config_lock: write every field (None clears it) and tell every process.
    `keys_used`: the keys a claim takes from (app/db/spread.py), at least the spread."""
    cur = conn.cursor(row_factory=rows_of(QueueConfigRow))
    params = {"queue": queue, "keys_used": keys_used, **{f: values.get(f) for f in CONFIG_FIELDS}}
    await cur.execute(QUEUE_CONFIG_SET, params)
    row = await cur.fetchone()
    assert row is not None
    await conn.execute(QUEUE_CONFIG_CHANGED, {"queue": queue})
    return row


# --- a queue spread over several keys (app/db/spread.py) ---------------------------------------------------
# Each key k >= 1 has a queue_state row of its own, a copy of key 0's configuration and pause, so that the claim
# of a key reads them in the row on its own shard, as every claim does. One statement per key: each names its
# key, so on Citus each is one write on that key's shard (a key's name hashes anywhere). No function in DO UPDATE
# SET (Citus refuses one that is not IMMUTABLE there): every value comes from key 0's row.
_COPIED = ("paused", *(f for f in CONFIG_FIELDS if f != "spread"), "changed_at")

QUEUE_KEY_SOURCE = f"""SELECT {", ".join(_COPIED)} FROM jobq.queue_state WHERE queue_name = %(queue)s"""

QUEUE_KEY_COPY = f"""
INSERT INTO jobq.queue_state AS s (queue_name, {", ".join(_COPIED)})
VALUES (%(key)s, {", ".join(f"%({c})s" for c in _COPIED)})
ON CONFLICT (queue_name) DO UPDATE SET {", ".join(f"{c} = EXCLUDED.{c}" for c in _COPIED)}
"""


async def queue_keys_sync(conn: psycopg.AsyncConnection[Any], queue: str, keys: Sequence[str]) -> None:
    """Copy key 0's configuration and pause onto the queue's other keys (`keys`: their names), creating their rows.
    In the transaction that changed key 0, after the change."""
    if not keys:
        return
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(QUEUE_KEY_SOURCE, {"queue": queue})
    source = await cur.fetchone()
    if source is None:
        return
    await cur.executemany(QUEUE_KEY_COPY, [{"key": k, **source} for k in keys])


# A key holds a job not yet finished: one look down each partial index of the unfinished statuses.
QUEUE_KEY_BUSY = f"""
SELECT EXISTS (SELECT FROM jobq.jobs WHERE queue_name = %(key)s AND status = 'pending')
    OR EXISTS (SELECT FROM jobq.jobs WHERE queue_name = %(key)s AND status = {RUNNING_C})
    OR EXISTS (SELECT FROM jobq.jobs WHERE queue_name = %(key)s AND status = 'waiting')
"""


async def queue_keys_busy(conn: psycopg.AsyncConnection[Any], keys: Sequence[str]) -> int:
    """How many of `keys` (in order) to keep: up to the last that holds a job not yet finished (0: none does)."""
    for n in range(len(keys), 0, -1):
        cur = await conn.execute(QUEUE_KEY_BUSY, {"key": keys[n - 1]})
        row = await cur.fetchone()
        if row is not None and row[0]:
            return n
    return 0


QUEUES_SPREAD = (
    "SELECT queue_name, keys_used FROM jobq.queue_state WHERE queue_name = ANY(%(queues)s) AND keys_used > 1"
)


async def queues_spread(conn: psycopg.AsyncConnection[Any], queues: Sequence[str]) -> dict[str, int]:
    """Of these queues, those spread over several keys, and how many keys they have used (app/db/spread.py)."""
    cur = await conn.execute(QUEUES_SPREAD, {"queues": list(queues)})
    return {str(name): int(n) for name, n in await cur.fetchall()}


QUEUE_CONFIGS_RETENTION = """
-- Queues whose retention differs from the global setting in some status.
SELECT queue_name, retention_completed_seconds, retention_failed_seconds, retention_cancelled_seconds
FROM jobq.queue_state
WHERE retention_completed_seconds IS NOT NULL OR retention_failed_seconds IS NOT NULL
   OR retention_cancelled_seconds IS NOT NULL
"""


async def queue_retention_overrides(conn: psycopg.AsyncConnection[Any]) -> dict[str, tuple[int | None, ...]]:
    cur = await conn.execute(QUEUE_CONFIGS_RETENTION)
    return {r[0]: (r[1], r[2], r[3]) for r in await cur.fetchall()}


# The ledger's queues. On Citus a read of every shard, once per retention pass (not a hot path); each queue's
# ledger is then pruned on its own shard.
QUEUE_CLAIMS_QUEUES = "SELECT queue_name FROM jobq.queue_claims GROUP BY queue_name"

QUEUE_CLAIMS_PRUNE = """
-- One queue's ledger rows older than every rate window of the queue (a day when it has none any more).
DELETE FROM jobq.queue_claims c
WHERE c.queue_name = %(queue)s AND c.claimed_at < now() - make_interval(secs => coalesce(
  (SELECT greatest(coalesce(s.rate_per_seconds, 0), coalesce(s.group_rate_per_seconds, 0))
   FROM jobq.queue_state s WHERE s.queue_name = %(queue)s), 86400))
"""


async def queue_claims_queues(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    cur = await conn.execute(QUEUE_CLAIMS_QUEUES)
    return sorted(str(r[0]) for r in await cur.fetchall())


async def queue_claims_prune(conn: psycopg.AsyncConnection[Any], queue: str) -> int:
    cur = await conn.execute(QUEUE_CLAIMS_PRUNE, {"queue": queue})
    return cur.rowcount
