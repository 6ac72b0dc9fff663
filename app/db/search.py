"""SQL of job search: by id, by idempotency key, by text in the last error, by JSON containment on the
payload, narrowed by queue and status, a page at a time.

Every search walks one index in its order and is bounded twice: it examines at most `budget` jobs per
page (the scan, not the hits, is limited), and runs under a statement timeout of its own. A key limited to
some queues walks the jobs of those queues only: jobs of other queues are passed over without counting
against the budget (the statement timeout bounds that), so that nothing of a page (its jobs, how many it
examined, whether it stopped at its budget, where its cursor points) depends on jobs the key cannot see. A page that
stops at its budget before it is full says where it stopped, and the next page starts there; so a rare
match deep in a big table costs the caller more pages, never the database a long scan. The walks:

  * `id`: the primary key; `idempotency_key`: jobs_idempotency_idx, one lookup per queue (with no queue
    given, the queues come from a loose index scan of jobs_claim_idx plus the running jobs and
    queue_counts, so no queue is missed and none is scanned);
  * a payload filter on failed or cancelled jobs: jobs_payload_idx (GIN, jsonb_path_ops), which holds
    those jobs only (migrations/0012_history_and_search.sql says why);
  * a queue and one status: that status's listing (app/db/operations.py LISTINGS), in its index order;
  * anything else: every job by id, newest first (of the queue, when one is given), the other conditions checked
    on each job examined.

On Citus (app/db/distribute.py): a search that names a queue is one statement on that queue's one shard (one
task): its walk and the read of its matches both name the queue (`in_queue`). A search across queues reads
every shard (a fan-out: not a hot path, bounded as above). By idempotency key across queues, the loose scans of
QUEUES_WITH_JOBS are recursive CTEs, which Citus refuses without one queue named: there, once refused, a process
searches every shard's jobs by that key instead (SEARCH_BY_KEY_EVERY_SHARD; PostgreSQL keeps the loose scans)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from app.db import finishing
from app.db.jobs import JOB_COLUMNS
from app.db.operations import LISTINGS, Listing
from app.db.rows import JobRow, Status, outcome_rows
from app.db.scope import queue_allowed

# What every search checks on each job it examines (all parameters may be NULL: no condition).
MATCHES = f"""(%(queue)s::text IS NULL OR j.queue_name = %(queue)s)
    AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
    AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s)
    AND (%(error)s::text IS NULL OR strpos(j.last_error, %(error)s) > 0)
    AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
    AND {queue_allowed("j.queue_name", "%(allowed)s::text")}"""
# The caller may see this job's queue: part of every walk. Were jobs of other queues examined, a walk that is
# itself a condition (an id, a key, a payload) would tell one there from none by how many it examined; and
# any walk stopped at its budget by them would say so (`partial`) with a cursor pointing into their queue.
VISIBLE = queue_allowed("j.queue_name", "%(allowed)s::text")

# Newest first across every queue and status: the primary key, backwards.
BY_ID = Listing("(%(after)s::boolean IS NOT TRUE OR j.id < %(k1)s::bigint)", "j.id DESC", ("id",))

# With no queue given: every queue that holds a job. Pending and waiting jobs by loose scans of
# jobs_claim_idx and jobs_waiting_idx (one index descent per queue, however long the queue); running jobs
# are few (one per busy worker); a queue whose jobs all finished has its rows in queue_counts.
QUEUES_WITH_JOBS = """
RECURSIVE pending_queues(name) AS (
  (SELECT queue_name FROM jobq.jobs WHERE status = 'pending' ORDER BY queue_name LIMIT 1)
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = 'pending' AND queue_name > p.name ORDER BY queue_name LIMIT 1)
  FROM pending_queues p WHERE p.name IS NOT NULL
), waiting_queues(name) AS (
  (SELECT queue_name FROM jobq.jobs WHERE status = 'waiting' ORDER BY queue_name LIMIT 1)
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = 'waiting' AND queue_name > w.name ORDER BY queue_name LIMIT 1)
  FROM waiting_queues w WHERE w.name IS NOT NULL
), queues AS (
  SELECT name FROM pending_queues WHERE name IS NOT NULL
  UNION SELECT name FROM waiting_queues WHERE name IS NOT NULL
  UNION SELECT queue_name FROM jobq.jobs WHERE status = 'running'
  UNION SELECT queue_name FROM jobq.queue_counts
),"""


def _search(walk: str, order: str, keys: Sequence[str], prefix: str = "", in_queue: bool = False) -> str:
    """A page of a search: `walk` (FROM ... WHERE ... over `jobs j`, the caller's queues only) gives the jobs
    to examine, in `order`, at most %(budget)s of them; the page is the first %(limit)s that match. Every row
    of the answer carries how many jobs were examined and
    the sort key of the last one (for the next page); with no match, one row carries them alone. `in_queue`:
    the walk is of the queue %(queue)s only, and the matches are read there too (one shard on Citus)."""
    read = "j.id = h.id AND j.queue_name = %(queue)s" if in_queue else "j.id = h.id"
    k = [f"k{i + 1}" for i in range(len(keys))]
    selected = ", ".join(f"j.{key} AS {name}" for key, name in zip(keys, k, strict=True))
    ordered = order
    for key, name in zip(keys, k, strict=True):
        ordered = ordered.replace(f"j.{key}", f"s.{name}")
    return f"""
WITH {prefix} examined AS MATERIALIZED (
  SELECT j.id, {selected}, ({MATCHES}) AS hit
  {walk}
  ORDER BY {order}
  LIMIT %(budget)s
), numbered AS (
  SELECT s.id, s.hit, row_number() OVER (ORDER BY {ordered}) AS n,
         json_build_array({", ".join(f"s.{n}" for n in k)}) AS key
  FROM examined s
), summary AS (
  SELECT count(*) AS examined,
         (SELECT key FROM numbered ORDER BY n DESC LIMIT 1) AS last_key
  FROM examined s
), hits AS (
  SELECT id, n FROM numbered WHERE hit ORDER BY n LIMIT %(limit)s
)
SELECT s.examined, s.last_key, {JOB_COLUMNS}
FROM summary s
LEFT JOIN (hits h JOIN jobq.jobs j ON {read}) ON true
ORDER BY h.n
"""


def _walk(where: str) -> str:
    return f"FROM jobq.jobs j WHERE {where} AND {VISIBLE}"


SEARCH_BY_ID = _search(_walk("j.id = %(id)s"), "j.id DESC", ("id",))
SEARCH_BY_ID_IN_QUEUE = _search(
    _walk("j.queue_name = %(queue)s AND j.id = %(id)s"), "j.id DESC", ("id",), in_queue=True
)
SEARCH_BY_KEY = _search(
    _walk("j.queue_name = %(queue)s AND j.idempotency_key = %(key)s AND j.idempotency_key IS NOT NULL"),
    "j.id DESC",
    ("id",),
    in_queue=True,
)
SEARCH_BY_KEY_ANY_QUEUE = _search(
    f"""FROM queues q CROSS JOIN LATERAL (
    -- OFFSET 0: one lookup per queue through jobs_idempotency_idx, never flattened into a join
    SELECT * FROM jobq.jobs j
    WHERE j.queue_name = q.name AND j.idempotency_key = %(key)s AND j.idempotency_key IS NOT NULL
    OFFSET 0
  ) j
  WHERE {queue_allowed("q.name", "%(allowed)s::text")}""",
    "j.id DESC",
    ("id",),
    prefix=QUEUES_WITH_JOBS,
)
# Where the loose scans above cannot run (Citus: a recursive CTE must name one queue), each shard looks for the key
# among its own jobs, by jobs_idempotency_idx read whole (the key is its second column) or by its table: bounded
# by the search's statement timeout; an operator's question, not a hot path. PostgreSQL keeps the loose scans.
SEARCH_BY_KEY_EVERY_SHARD = _search(
    _walk("j.idempotency_key = %(key)s AND j.idempotency_key IS NOT NULL"), "j.id DESC", ("id",)
)
_walk_refused = False  # the engine refused SEARCH_BY_KEY_ANY_QUEUE once (Citus): this process searches every shard

# The literal statuses let the planner prove jobs_payload_idx's predicate.
_BY_PAYLOAD = (
    "j.payload @> %(payload)s::jsonb AND j.status IN ('failed', 'cancelled') AND j.status = ANY(%(statuses)s)"
    f" AND ({BY_ID.where})"
)
SEARCH_BY_PAYLOAD = _search(_walk(_BY_PAYLOAD), BY_ID.order, BY_ID.keys)
SEARCH_BY_PAYLOAD_IN_QUEUE = _search(
    _walk(f"j.queue_name = %(queue)s AND {_BY_PAYLOAD}"), BY_ID.order, BY_ID.keys, in_queue=True
)
SEARCH_LISTING = {
    status: _search(_walk(listing.where), listing.order, listing.keys, in_queue=True)
    for status, listing in LISTINGS.items()
    if status
}
SEARCH_BY_ID_DESC = _search(_walk(BY_ID.where), BY_ID.order, BY_ID.keys)
# A queue's jobs, newest first: its listing of every status (app/db/operations.py), with the same keys as above.
SEARCH_BY_ID_DESC_IN_QUEUE = _search(_walk(LISTINGS[None].where), BY_ID.order, BY_ID.keys, in_queue=True)
PAYLOAD_INDEXED = frozenset({Status.failed, Status.cancelled})


@dataclass(frozen=True, slots=True)
class Criteria:
    """What a search looks for; None: no condition. `payload` is JSON text."""

    queue: str | None = None
    statuses: tuple[str, ...] | None = None
    id: int | None = None
    idempotency_key: str | None = None
    error_contains: str | None = None
    payload: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """How a search walks: its statement, the listing whose cursor it uses (cursors.py), and its keys."""

    statement: str
    cursor_kind: str | None
    keys: tuple[str, ...]
    pages: bool  # False: one page holds every match (an id, a key per queue)
    bitmap: bool  # the GIN index is read by bitmap scans, which pooled sessions have off


def plan(c: Criteria) -> Plan:
    in_queue = c.queue is not None  # then every walk is of that queue only: one shard on Citus
    if c.id is not None:
        return Plan(SEARCH_BY_ID_IN_QUEUE if in_queue else SEARCH_BY_ID, None, ("id",), False, False)
    if c.idempotency_key is not None:
        return Plan(SEARCH_BY_KEY if in_queue else SEARCH_BY_KEY_ANY_QUEUE, None, ("id",), False, False)
    if c.payload is not None and c.statuses is not None and set(c.statuses) <= PAYLOAD_INDEXED:
        return Plan(SEARCH_BY_PAYLOAD_IN_QUEUE if in_queue else SEARCH_BY_PAYLOAD, None, BY_ID.keys, True, True)
    if in_queue and c.statuses is not None and len(c.statuses) == 1:
        status = c.statuses[0]
        return Plan(SEARCH_LISTING[status], status, LISTINGS[status].keys, True, False)
    return Plan(SEARCH_BY_ID_DESC_IN_QUEUE if in_queue else SEARCH_BY_ID_DESC, None, BY_ID.keys, True, False)


@dataclass(frozen=True, slots=True)
class SearchRow:
    """A row of a search page: how many jobs it examined (all of the caller's queues),
    the sort key of the last, and a match (None: the page has none)."""

    examined: int
    last_key: list[Any] | None
    job: JobRow | None


async def jobs_search(
    conn: psycopg.AsyncConnection[Any],
    how: Plan,
    c: Criteria,
    allowed: str | None,
    after: Sequence[Any] | None,
    limit: int,
    budget: int,
    timeout_ms: int,
) -> list[SearchRow]:
    """One page: at most `limit` matches among at most `budget` jobs examined after `after` (a sort key
    of `how`), within `timeout_ms`. The first row always exists."""
    keys = list(after or [None] * len(how.keys))
    params: dict[str, Any] = {
        "queue": c.queue,
        "status": c.statuses[0] if c.statuses and len(c.statuses) == 1 else None,
        "statuses": list(c.statuses) if c.statuses is not None else None,
        "id": c.id,
        "key": c.idempotency_key,
        "error": c.error_contains,
        "payload": c.payload,
        "allowed": allowed,
        "after": after is not None,
        "limit": limit,
        "budget": budget,
    }
    params.update({f"k{i + 1}": v for i, v in enumerate(keys)})
    global _walk_refused
    statement = how.statement
    if statement is SEARCH_BY_KEY_ANY_QUEUE and _walk_refused:
        statement = SEARCH_BY_KEY_EVERY_SHARD
    cur = conn.cursor(row_factory=outcome_rows(SearchRow, JobRow))
    try:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
            if how.bitmap:
                await conn.execute("SET LOCAL enable_bitmapscan = on")
            await cur.execute(statement, params)
            return await cur.fetchall()
    except psycopg.errors.FeatureNotSupported:
        # Citus refusing the walk; 0A000 has other causes on plain PostgreSQL, which are not a refusal.
        if statement is not SEARCH_BY_KEY_ANY_QUEUE or not finishing.on_citus(conn):
            raise
        _walk_refused = True
    return await jobs_search(conn, how, c, allowed, after, limit, budget, timeout_ms)
