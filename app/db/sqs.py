"""The SQL of the SQS API (app/sqs/, app/core/sqs.py): SQS queues and their attributes, message attributes,
the FIFO deduplication window and PurgeQueue. Everything a message does after it is sent is jobq's own SQL
(app/db/jobs.py, app/db/writes.py): SQS adds no statement to a claim, a complete or a heartbeat.

On Citus (app/db/distribute.py): a message id is a job id, and a receipt handle `<job id>:<claim token>` carries
the queue in its token, so DeleteMessage and ChangeMessageVisibility are jobq's own writes, routed by the token
(app/db/writes.py); sqs_messages (message attributes, by job id) is a reference table, read where the statement
runs. Every statement here about one queue names it (one shard); ListQueues and the dead-letter sources read
sqs_queues on every shard (rare calls, not hot); the prunes loop over queues (sqs_dedup) or walk the reference
table a page at a time (sqs_messages)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from orjson import Fragment

from app.db.admin import COUNT_ADD, RELEASE_RECORD
from app.db.jobs import as_json
from app.db.rows import Status, rows_of

# --- queues -------------------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class SqsQueueRow:
    queue: str
    created_at: datetime
    modified_at: datetime
    delay_seconds: int
    receive_wait_seconds: int
    maximum_message_size: int
    retention_seconds: int
    content_based_dedup: bool
    redrive_policy: str | None
    tags: str  # JSON text: {key: value}
    move_task: str | None  # JSON text


_QUEUE_COLUMNS = (
    "queue_name AS queue, created_at, modified_at, delay_seconds, receive_wait_seconds, maximum_message_size, "
    "retention_seconds, content_based_dedup, redrive_policy, tags::text AS tags, move_task::text AS move_task"
)
# The columns SetQueueAttributes may write (the SQL names them from this list, never from input).
SETTABLE = (
    "delay_seconds",
    "receive_wait_seconds",
    "maximum_message_size",
    "retention_seconds",
    "content_based_dedup",
    "redrive_policy",
)

SQS_QUEUE_GET = f"SELECT {_QUEUE_COLUMNS} FROM jobq.sqs_queues WHERE queue_name = %(queue)s"

SQS_QUEUE_CREATE = f"""
-- CreateQueue of an existing queue answers with it (SQS compares the attributes: app/core/sqs.py does),
-- so a conflict inserts nothing and the row is read back as it is.
WITH made AS (
  INSERT INTO jobq.sqs_queues (queue_name, delay_seconds, receive_wait_seconds, maximum_message_size,
                          retention_seconds, content_based_dedup, redrive_policy, tags)
  VALUES (%(queue)s, %(delay_seconds)s, %(receive_wait_seconds)s, %(maximum_message_size)s,
          %(retention_seconds)s, %(content_based_dedup)s, %(redrive_policy)s, %(tags)s::jsonb)
  ON CONFLICT (queue_name) DO NOTHING
  RETURNING {_QUEUE_COLUMNS}, true AS created
)
SELECT * FROM made
UNION ALL
SELECT {_QUEUE_COLUMNS}, false FROM jobq.sqs_queues WHERE queue_name = %(queue)s AND NOT EXISTS (SELECT 1 FROM made)
"""

JOBQ_QUEUE_KNOWN = """
-- A queue with jobs to hand out (pending, waiting or running), enqueued over jobq's API: GetQueueUrl answers
-- for it, so that they can be received over SQS. A deleted SQS queue has none left (its purge cancelled them).
SELECT EXISTS (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status IN ('pending', 'running', 'waiting'))
"""

SQS_QUEUES_LIST = """
-- ListQueues: names in order, from a prefix, a page at a time (`after`: the last name of the page before).
SELECT queue_name FROM jobq.sqs_queues
WHERE queue_name LIKE %(prefix)s || '%%' AND (%(after)s::text IS NULL OR queue_name > %(after)s)
ORDER BY queue_name COLLATE "C"
LIMIT %(limit)s
"""

SQS_QUEUE_DELETE = "DELETE FROM jobq.sqs_queues WHERE queue_name = %(queue)s"

SQS_QUEUE_TAG = """
-- TagQueue adds and overwrites, UntagQueue removes keys; both keep the other tags.
UPDATE jobq.sqs_queues SET tags = (tags || %(add)s::jsonb) - %(remove)s::text[], modified_at = now()
WHERE queue_name = %(queue)s
"""

SQS_DEAD_LETTER_SOURCES = """
-- The queues whose RedrivePolicy names this queue's ARN as their dead-letter target. Its end compared
-- as text, not with LIKE: `_` in a queue name would match any character.
SELECT queue_name FROM jobq.sqs_queues
WHERE redrive_policy IS NOT NULL
  AND right(redrive_policy::jsonb ->> 'deadLetterTargetArn', length(%(queue)s) + 1) = ':' || %(queue)s
ORDER BY queue_name COLLATE "C"
"""

SQS_MOVE_TASK_SET = "UPDATE jobq.sqs_queues SET move_task = %(task)s::jsonb WHERE queue_name = %(queue)s"


async def sqs_queue_get(conn: psycopg.AsyncConnection[Any], queue: str) -> SqsQueueRow | None:
    cur = conn.cursor(row_factory=rows_of(SqsQueueRow))
    await cur.execute(SQS_QUEUE_GET, {"queue": queue})
    return await cur.fetchone()


async def sqs_queue_create(
    conn: psycopg.AsyncConnection[Any], queue: str, values: dict[str, Any], tags: dict[str, str]
) -> tuple[SqsQueueRow, bool]:
    """The queue, and whether this call made it."""
    cur = await conn.execute(SQS_QUEUE_CREATE, {"queue": queue, **values, "tags": as_json(tags)})
    found = await cur.fetchone()
    assert found is not None
    return SqsQueueRow(*found[:-1]), bool(found[-1])


async def jobq_queue_known(conn: psycopg.AsyncConnection[Any], queue: str) -> bool:
    cur = await conn.execute(JOBQ_QUEUE_KNOWN, {"queue": queue})
    found = await cur.fetchone()
    return bool(found and found[0])


async def sqs_queues_list(conn: psycopg.AsyncConnection[Any], prefix: str, after: str | None, limit: int) -> list[str]:
    # LIKE's own wildcards in a prefix match themselves (queue names hold `_`).
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    cur = await conn.execute(SQS_QUEUES_LIST, {"prefix": escaped, "after": after, "limit": limit})
    return [r[0] for r in await cur.fetchall()]


async def sqs_queue_set(conn: psycopg.AsyncConnection[Any], queue: str, values: dict[str, Any]) -> None:
    """SetQueueAttributes: the named columns (names from SETTABLE only) set, modified_at moved."""
    names = [n for n in values if n in SETTABLE]
    if len(names) != len(values):
        raise ValueError(f"not settable: {sorted(set(values) - set(SETTABLE))}")
    assignments = ", ".join(f"{n} = %({n})s" for n in names)
    statement = f"UPDATE jobq.sqs_queues SET {assignments}, modified_at = now() WHERE queue_name = %(queue)s"
    await conn.execute(statement, {"queue": queue, **values})


async def sqs_queue_delete(conn: psycopg.AsyncConnection[Any], queue: str) -> None:
    await conn.execute(SQS_QUEUE_DELETE, {"queue": queue})


async def sqs_queue_tag(
    conn: psycopg.AsyncConnection[Any], queue: str, add: dict[str, str], remove: Sequence[str]
) -> None:
    await conn.execute(SQS_QUEUE_TAG, {"queue": queue, "add": as_json(add), "remove": list(remove)})


async def sqs_dead_letter_sources(conn: psycopg.AsyncConnection[Any], queue: str) -> list[str]:
    cur = await conn.execute(SQS_DEAD_LETTER_SOURCES, {"queue": queue})
    return [r[0] for r in await cur.fetchall()]


async def sqs_move_task_set(conn: psycopg.AsyncConnection[Any], queue: str, task: dict[str, Any]) -> None:
    await conn.execute(SQS_MOVE_TASK_SET, {"queue": queue, "task": as_json(task)})


# --- PurgeQueue ---------------------------------------------------------------------------------------------

JOBS_PURGE = """
WITH stamp AS (
  SELECT clock_timestamp() AS now  -- here, not in the UPDATE: Citus refuses a VOLATILE function there
), target AS (
  -- A batch of the queue's unfinished jobs (ready, delayed, waiting, running); SKIP LOCKED: a job a worker
  -- is completing right now is left to it (it finishes, which is what a purge wants too).
  SELECT id, queue_name AS queue, status AS was FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status IN ('pending', 'running', 'waiting')
  ORDER BY id
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), purged AS (
  -- Cancelled, as DELETE /jobs/{{id}} would: kept for the dashboard until retention removes them; a running
  -- job keeps its token, so that its worker's heartbeat learns of the cancel and its complete is refused.
  UPDATE jobq.jobs AS j
  SET status = 'cancelled', finished_at = st.now, lease_expires_at = NULL,
      last_error = 'purged (SQS PurgeQueue)'
  FROM target t CROSS JOIN stamp st WHERE j.queue_name = %(queue)s AND j.id = t.id
  RETURNING t.queue, j.status, j.id, t.was, coalesce(j.has_dependants, false) AS has_dependants
)
-- What each job was before (app/core/effects.py: a running or pending job frees its slot or group's turn),
-- and whether jobs depend on it (the release then has work; jobs_purge records them for it and counts the
-- batch, in the same transaction: app/db/admin.py says why not here).
SELECT id, was, has_dependants FROM purged
"""


async def jobs_purge(
    conn: psycopg.AsyncConnection[Any], queue: str, batch: int
) -> tuple[dict[str, list[int]], list[int]]:
    """Cancel every unfinished job of the queue, a batch per statement; the ids cancelled, by the status
    each had, and the ids of those that other jobs depend on."""
    purged: dict[str, list[int]] = {}
    parents: list[int] = []
    while True:
        async with conn.transaction():
            cur = await conn.execute(JOBS_PURGE, {"queue": queue, "batch": batch})
            rows = await cur.fetchall()
            if rows:
                cancelled = str(Status.cancelled)
                await conn.execute(COUNT_ADD, {"queue": queue, "status": cancelled, "n": len(rows)})
                recorded = [{"queue": queue, "id": job_id, "status": cancelled} for job_id, _, dep in rows if dep]
                if recorded:
                    async with conn.cursor() as rec:
                        await rec.executemany(RELEASE_RECORD, recorded)
        for job_id, was, has_dependants in rows:
            purged.setdefault(was, []).append(job_id)
            if has_dependants:
                parents.append(job_id)
        if len(rows) < batch:
            return purged, parents


# --- messages: attributes and the deduplication window -----------------------------------------------------

DEDUP_WINDOW_SECONDS = 300  # SQS's FIFO deduplication interval

SQS_DEDUP_TAKE = f"""
-- Take each deduplication id for five minutes (the window), in the sending transaction. A live row (another
-- send's, committed, or in flight: the unique index makes this wait for it) is left alone and not returned:
-- that message is a duplicate. An expired row is taken over in place.
INSERT INTO jobq.sqs_dedup AS d (queue_name, dedup_id, job_id, expires_at)
SELECT %(queue)s, t.id, 0, now() + make_interval(secs => {DEDUP_WINDOW_SECONDS})
FROM unnest(%(ids)s::text[]) AS t(id)
ORDER BY t.id COLLATE "C"  -- keys taken in one order: two batches cannot wait on each other in a cycle
ON CONFLICT (queue_name, dedup_id) DO UPDATE SET job_id = 0, expires_at = EXCLUDED.expires_at
  -- Expired: d.expires_at <= now(), said with IMMUTABLE functions and no parameter, as Citus requires here:
  -- EXCLUDED's expiry less the window is now(), and times at a named zone compare exactly as timestamptz do.
  WHERE (d.expires_at AT TIME ZONE 'UTC')
        <= (EXCLUDED.expires_at AT TIME ZONE 'UTC') - make_interval(secs => {DEDUP_WINDOW_SECONDS})
RETURNING d.dedup_id
"""

SQS_DEDUP_FOUND = """
-- The jobs the live deduplication ids already name.
SELECT dedup_id, job_id FROM jobq.sqs_dedup WHERE queue_name = %(queue)s AND dedup_id = ANY(%(ids)s::text[])
"""

SQS_DEDUP_BIND = """
-- The ids just taken, bound to the jobs this transaction inserted.
UPDATE jobq.sqs_dedup AS d SET job_id = b.job_id
FROM json_to_recordset(%(binds)s::json) AS b(dedup_id text, job_id bigint)
WHERE d.queue_name = %(queue)s AND d.dedup_id = b.dedup_id
"""

SQS_DEDUP_EXPIRED_QUEUES = """
-- The queues with expired deduplication ids (the retention service); on Citus a read of every shard of a small
-- table (ids live five minutes).
SELECT DISTINCT queue_name FROM jobq.sqs_dedup WHERE expires_at <= coalesce(%(now)s::timestamptz, now())
"""

SQS_DEDUP_PRUNE = """
-- Expired deduplication ids of one queue, a batch at a time (the retention service).
DELETE FROM jobq.sqs_dedup WHERE queue_name = %(queue)s AND ctid = ANY(ARRAY(
  SELECT ctid FROM jobq.sqs_dedup
  WHERE queue_name = %(queue)s AND expires_at <= coalesce(%(now)s::timestamptz, now())
  LIMIT %(batch)s
))
"""

# The rows of jobs that are gone (deleted by retention, or by hand), oldest ids first: a job id is never reused,
# so a row without its job is never wanted again. sqs_messages is a reference table on Citus, which cannot be
# joined with jobs by a correlated subquery: a page of its rows, then which of their jobs exist (on Citus a read
# of every shard), then the others deleted.
SQS_MESSAGES_PAGE = """
SELECT job_id FROM jobq.sqs_messages WHERE job_id > %(after)s ORDER BY job_id LIMIT %(batch)s
"""
SQS_MESSAGES_JOBS = "SELECT id FROM jobq.jobs WHERE id = ANY(%(ids)s::bigint[])"
SQS_MESSAGES_DELETE = "DELETE FROM jobq.sqs_messages WHERE job_id = ANY(%(ids)s::bigint[])"

SQS_MESSAGES_INSERT = """
INSERT INTO jobq.sqs_messages (job_id, attributes, dedup_id)
SELECT job_id, attributes, dedup_id
FROM json_to_recordset(%(rows)s::json) AS t(job_id bigint, attributes jsonb, dedup_id text)
"""

SQS_MESSAGES_GET = """
SELECT job_id, attributes::text, dedup_id FROM jobq.sqs_messages WHERE job_id = ANY(%(ids)s::bigint[])
"""


async def sqs_dedup_take(
    conn: psycopg.AsyncConnection[Any], queue: str, ids: Sequence[str]
) -> tuple[set[str], dict[str, int]]:
    """(the ids taken now, the jobs of the ids already live). Run inside the sending transaction."""
    taken: set[str] = set()
    found: dict[str, int] = {}
    wanted = list(ids)
    while wanted:
        cur = await conn.execute(SQS_DEDUP_TAKE, {"queue": queue, "ids": wanted})
        taken.update(r[0] for r in await cur.fetchall())
        others = [i for i in wanted if i not in taken]
        if others:
            cur = await conn.execute(SQS_DEDUP_FOUND, {"queue": queue, "ids": others})
            found.update((r[0], int(r[1])) for r in await cur.fetchall())
        # An id live when taken and gone (pruned, expired) when looked up is neither: take it again.
        wanted = [i for i in others if i not in found]
    return taken, found


async def sqs_dedup_bind(conn: psycopg.AsyncConnection[Any], queue: str, binds: dict[str, int]) -> None:
    rows = [{"dedup_id": k, "job_id": v} for k, v in binds.items()]
    await conn.execute(SQS_DEDUP_BIND, {"queue": queue, "binds": as_json(rows)})


async def sqs_dedup_prune(conn: psycopg.AsyncConnection[Any], batch: int, now: datetime | None = None) -> int:
    """At most `batch` expired ids deleted, one statement per queue; fewer: none is left."""
    cur = await conn.execute(SQS_DEDUP_EXPIRED_QUEUES, {"now": now})
    deleted = 0
    for (queue,) in await cur.fetchall():
        cur = await conn.execute(SQS_DEDUP_PRUNE, {"queue": queue, "batch": batch - deleted, "now": now})
        deleted += cur.rowcount
        if deleted >= batch:
            break
    return deleted


async def sqs_messages_prune(conn: psycopg.AsyncConnection[Any], batch: int) -> int:
    """At most `batch` rows of gone jobs deleted, walking the rows a page at a time until that many are found;
    fewer: none is left."""
    deleted, after = 0, 0
    while deleted < batch:
        cur = await conn.execute(SQS_MESSAGES_PAGE, {"after": after, "batch": batch})
        page = [int(r[0]) for r in await cur.fetchall()]
        if not page:
            break
        cur = await conn.execute(SQS_MESSAGES_JOBS, {"ids": page})
        live = {int(r[0]) for r in await cur.fetchall()}
        gone = [i for i in page if i not in live][: batch - deleted]
        if gone:
            cur = await conn.execute(SQS_MESSAGES_DELETE, {"ids": gone})
            deleted += cur.rowcount
        if len(page) < batch:
            break
        after = page[-1]
    return deleted


async def sqs_messages_insert(
    conn: psycopg.AsyncConnection[Any], rows: Sequence[tuple[int, str | None, str | None]]
) -> None:
    """(job id, attributes as JSON text or None, deduplication id or None) per message."""
    doc = [{"job_id": j, "attributes": Fragment(a) if a is not None else None, "dedup_id": d} for j, a, d in rows]
    await conn.execute(SQS_MESSAGES_INSERT, {"rows": as_json(doc)})


async def sqs_messages_get(
    conn: psycopg.AsyncConnection[Any], ids: Sequence[int]
) -> dict[int, tuple[str | None, str | None]]:
    cur = await conn.execute(SQS_MESSAGES_GET, {"ids": list(ids)})
    return {int(r[0]): (r[1], r[2]) for r in await cur.fetchall()}
