"""Claim tokens that name their queue, so that a worker's heartbeat, complete, fail or release finds the job's
shard with no lookup (on Citus every statement about a job must name its queue: app/db/distribute.py).

A token is 43 random URL-safe characters (244 bits from the server's RNG, as in every release) followed by
the queue's name in unpadded base64url: `[A-Za-z0-9_-]` only, like every token before (ClaimToken in
app/models/fields.py), and opaque to workers. Tokens of releases before 1.2.0 are the 43 random characters
alone; a write that carries one finds the job's queue by its id first (`queue_of`: one lookup, on Citus a
read of every shard), and is otherwise served the same. The queue part only routes the statement: the
statement still matches the whole token, so a token edited to name another queue matches no job."""

from __future__ import annotations

import base64
import binascii
import re
from functools import lru_cache
from typing import Any

import psycopg

RANDOM_CHARS = 43
# As the CHECK on queue_state.queue_name (migrations/0051_queue_spread.sql): a queue's name, or the name of a key of
# a spread queue (app/db/spread.py), where the claims of that key's jobs are.
_QUEUE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}(#([1-9]|[1-5][0-9]|6[0-3]))?$")

# The longest token: 43 random characters and the longest key name (a 128-character queue's `#63`) in base64url.
MAX_CHARS = RANDOM_CHARS + (131 * 4 + 2) // 3


@lru_cache(maxsize=4096)
def queue_suffix(queue: str) -> str:
    """What follows the random part in the tokens of `queue`'s claims (a parameter of the claim statement)."""
    return base64.urlsafe_b64encode(queue.encode()).decode().rstrip("=")


def queue_of(token: str) -> str | None:
    """The queue a token names, or None for a token without one (a release before 1.2.0) or a malformed one."""
    if len(token) <= RANDOM_CHARS:
        return None
    tail = token[RANDOM_CHARS:]
    try:
        name = base64.urlsafe_b64decode(tail + "=" * (-len(tail) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return name if _QUEUE.match(name) else None


# The queue of a job known by its id alone (a call by bare id, or a token from before 1.2.0): the primary key on
# plain PostgreSQL; on Citus a read of every shard, once, before the call's own statement goes to one shard.
JOB_QUEUE = "SELECT queue_name FROM jobq.jobs WHERE id = %(id)s"


async def queue_of_job(conn: psycopg.AsyncConnection[Any], job_id: int) -> str | None:
    cur = await conn.execute(JOB_QUEUE, {"id": job_id})
    row = await cur.fetchone()
    return None if row is None else str(row[0])
