"""All SQL on the api_keys table: the server's lookup and lazy last-use stamp, the CLI's create, list and
revoke. Every change to a key also sends a "keys changed" message on the wake-up channel, in the same
transaction, so that every process drops its cached keys when (and only when) the change commits. The message
is its own statement, on the session's own server: a statement that writes api_keys runs, on Citus, on the
nodes holding the reference table, and a NOTIFY inside it would be delivered there, not on the coordinator
where jobq listens (docs/scale-out.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from app.db.channels import CHANNEL, KEYS_CHANGED

KEYS_CHANGED_NOTIFY = f"SELECT pg_notify('{CHANNEL}', '{KEYS_CHANGED}')"


def _changed(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run a change to api_keys and, when it changed a key, the message, in one transaction."""
    with conn.transaction():
        rows = conn.execute(query, params).fetchall()
        if rows:
            conn.execute(KEYS_CHANGED_NOTIFY)
    return rows


@dataclass(frozen=True, slots=True)
class KeyRow:
    id: int
    name: str
    key_hash: bytes
    scopes: list[str]
    queue_patterns: list[str] | None
    rate_per_second: float | None = None  # None: JOBQ_KEY_RATE_PER_SECOND; 0: no limit
    rate_burst: int | None = None


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What `jobq keys list` shows: everything but the hash."""

    id: int
    name: str
    selector: str
    scopes: list[str]
    queue_patterns: list[str] | None
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    rate_per_second: float | None = None
    rate_burst: int | None = None


API_KEY_BY_SELECTOR = """
-- Live keys only: a revoked key is unknown from the moment its revocation commits.
SELECT id, name, key_hash, scopes, queue_patterns, rate_per_second, rate_burst
FROM jobq.api_keys
WHERE selector = %s AND revoked_at IS NULL
"""


API_KEY_SELECTORS = """
-- Every live key's selector (not secret): whether a selector may be a key, without a lookup per selector.
SELECT selector FROM jobq.api_keys WHERE revoked_at IS NULL
"""


async def api_key_selectors(conn: psycopg.AsyncConnection[Any]) -> frozenset[str]:
    cur = await conn.execute(API_KEY_SELECTORS)
    return frozenset(row[0] for row in await cur.fetchall())


async def api_key_by_selector(conn: psycopg.AsyncConnection[Any], selector: str) -> KeyRow | None:
    cur = await conn.execute(API_KEY_BY_SELECTOR, (selector,))
    row = await cur.fetchone()
    return None if row is None else KeyRow(row[0], row[1], bytes(row[2]), list(row[3]), row[4], row[5], row[6])


API_KEYS_TOUCH = """
-- Batched and infrequent: a last-use stamp is diagnostics, not worth a write per request.
UPDATE jobq.api_keys SET last_used_at = now()
WHERE id = ANY(%s) AND revoked_at IS NULL
"""


async def api_keys_touch(conn: psycopg.AsyncConnection[Any], ids: Sequence[int]) -> None:
    await conn.execute(API_KEYS_TOUCH, (list(ids),))


API_KEYS_COUNT_LIVE = "SELECT count(*) FROM jobq.api_keys WHERE revoked_at IS NULL"


async def api_keys_count_live(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute(API_KEYS_COUNT_LIVE)
    row = await cur.fetchone()
    return int(row[0]) if row else 0


# --- the CLI (synchronous) ----------------------------------------------------------------------------------

API_KEY_INSERT = """
WITH created AS (
  INSERT INTO jobq.api_keys (name, selector, key_hash, scopes, queue_patterns)
  VALUES (%(name)s, %(selector)s, %(hash)s, %(scopes)s, %(queues)s)
  RETURNING id
)
-- A process may have cached "no such key" for this selector: every process is told to forget it (_changed).
SELECT id FROM created
"""

# With a rate of its own (migrations/0020_key_rates.sql); the statement above still works on a schema from
# before it.
API_KEY_INSERT_RATED = """
WITH created AS (
  INSERT INTO jobq.api_keys (name, selector, key_hash, scopes, queue_patterns, rate_per_second, rate_burst)
  VALUES (%(name)s, %(selector)s, %(hash)s, %(scopes)s, %(queues)s, %(rate)s, %(burst)s)
  RETURNING id
)
SELECT id FROM created
"""


def api_key_insert(
    conn: psycopg.Connection[Any],
    name: str,
    selector: str,
    key_hash: bytes,
    scopes: Sequence[str],
    queue_patterns: Sequence[str] | None,
    rate: float | None = None,
    burst: int | None = None,
) -> int:
    (row,) = _changed(
        conn,
        API_KEY_INSERT if rate is None and burst is None else API_KEY_INSERT_RATED,
        {
            "name": name,
            "selector": selector,
            "hash": key_hash,
            "scopes": list(scopes),
            "queues": list(queue_patterns) if queue_patterns is not None else None,
            "rate": rate,
            "burst": burst,
        },
    )
    return int(row[0])


API_KEYS_LIST = """
SELECT id, name, selector, scopes, queue_patterns, created_at, last_used_at, revoked_at, rate_per_second,
       rate_burst
FROM jobq.api_keys
WHERE %(all)s OR revoked_at IS NULL
ORDER BY id
"""


def api_keys_list(conn: psycopg.Connection[Any], *, include_revoked: bool) -> list[KeyInfo]:
    rows = conn.execute(API_KEYS_LIST, {"all": include_revoked}).fetchall()
    return [KeyInfo(r[0], r[1], r[2], list(r[3]), r[4], r[5], r[6], r[7], r[8], r[9]) for r in rows]


API_KEY_REVOKE = """
WITH revoked AS (
  UPDATE jobq.api_keys SET revoked_at = now()
  WHERE (id = %(id)s OR name = %(name)s) AND revoked_at IS NULL
  RETURNING id, name
)
-- The message (_changed) is delivered at commit: every process drops its cached keys as soon as the revocation
-- is durable.
SELECT id, name FROM revoked
"""


def api_key_revoke(conn: psycopg.Connection[Any], id_or_name: str) -> list[tuple[int, str]]:
    """Revoke the live key with this id or name; returns what was revoked (empty: no such live key)."""
    by_id = id_or_name.isdigit()
    if by_id and len(id_or_name) > 18:
        return []  # beyond bigint: no such key
    params = {"id": int(id_or_name) if by_id else None, "name": None if by_id else id_or_name}
    rows = _changed(conn, API_KEY_REVOKE, params)
    return [(int(r[0]), str(r[1])) for r in rows]


API_KEY_SET_RATE = """
WITH changed AS (
  UPDATE jobq.api_keys SET rate_per_second = %(rate)s, rate_burst = %(burst)s
  WHERE (id = %(id)s OR name = %(name)s) AND revoked_at IS NULL
  RETURNING id, name
)
-- The message (_changed) is delivered at commit: every process reads the key again, with its new rate.
SELECT id, name FROM changed
"""


def api_key_set_rate(
    conn: psycopg.Connection[Any], id_or_name: str, rate: float | None, burst: int | None
) -> list[tuple[int, str]]:
    """Set the live key's own rate and burst (None: the global settings); returns what changed."""
    by_id = id_or_name.isdigit()
    if by_id and len(id_or_name) > 18:
        return []
    params = {"id": int(id_or_name) if by_id else None, "name": None if by_id else id_or_name}
    rows = _changed(conn, API_KEY_SET_RATE, {**params, "rate": rate, "burst": burst})
    return [(int(r[0]), str(r[1])) for r in rows]


API_KEY_FIND = """
-- A live key by id or name, for `jobq keys sqs` (its AWS pair is derived from the id and the selector).
SELECT id, name, selector FROM jobq.api_keys
WHERE (id = %(id)s OR name = %(name)s) AND revoked_at IS NULL
"""


def api_key_find(conn: psycopg.Connection[Any], id_or_name: str) -> tuple[int, str, str] | None:
    """(id, name, selector) of the live key with this id or name, else None."""
    by_id = id_or_name.isdigit()
    if by_id and len(id_or_name) > 18:
        return None  # beyond bigint: no such key
    params = {"id": int(id_or_name) if by_id else None, "name": None if by_id else id_or_name}
    row = conn.execute(API_KEY_FIND, params).fetchone()
    return None if row is None else (int(row[0]), str(row[1]), str(row[2]))
