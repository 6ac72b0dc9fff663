"""What the sweeps write beside the jobs they finish or delete, in the same transaction: the finished-job
counters (queue_counts) and the dependency release's outbox (dependency_releases).

The request paths write both from data-modifying CTEs of their own statement (app/db/jobs.py count_finished,
record_finished). On Citus an INSERT inside a data-modifying CTE is always planned through the coordinator
(a subplan per CTE), so the sweeps, which may take a statement more, write them with statements of their own
on the queue's shard, each a single task, after the statement that moved the jobs and before it commits: a
finish still never commits without its count and its record.

On Citus the request paths do the same (complete, fail: app/db/writes.py), on connections the pool marks
(`mark_citus`, when the citus extension is installed in the database): their statements there leave out the
two CTEs, and the counter and the record follow in the same transaction, two single-shard statements more. On
plain PostgreSQL they keep the one statement, which costs no round trip more."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any
from weakref import WeakSet

import psycopg

# Connections to a database with the citus extension (the pool's configure step reads it from the server).
_CITUS: WeakSet[psycopg.AsyncConnection[Any]] = WeakSet()


def mark_citus(conn: psycopg.AsyncConnection[Any], citus: bool) -> None:
    if citus:
        _CITUS.add(conn)
    else:
        _CITUS.discard(conn)


def on_citus(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the request paths write counts and records by statements of their own on this connection."""
    return conn in _CITUS


COUNTS_ADD = """
-- `n` (negative: deleted) to one queue's counter of one status; each backend its own shard of the counter
-- (backend pid mod 64), as count_finished.
INSERT INTO jobq.queue_counts AS c (queue_name, status, shard, n)
VALUES (%(queue)s, %(status)s, mod(pg_backend_pid(), 64), %(n)s)
ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n
"""

RELEASES_RECORD = """
-- The jobs of one queue just finished that other jobs depend on, as they are now in this transaction: the
-- dependency release (app/db/releases.py) releases or cancels their dependants.
INSERT INTO jobq.dependency_releases (queue_name, job_id, status)
SELECT j.queue_name, j.id, j.status FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[]) AND j.status IN ('completed', 'failed', 'cancelled')
"""


async def counts_add(conn: psycopg.AsyncConnection[Any], queue: str, status: str, n: int) -> None:
    if n:
        await conn.execute(COUNTS_ADD, {"queue": queue, "status": status, "n": n})


async def releases_record(conn: psycopg.AsyncConnection[Any], queue: str, ids: Sequence[int]) -> None:
    if ids:
        await conn.execute(RELEASES_RECORD, {"queue": queue, "ids": list(ids)})


@lru_cache(maxsize=32)
def releases_record_values(n: int) -> str:
    """The outbox rows of `n` jobs of one queue that a request path just finished, as its statement returned
    them: a VALUES list, which Citus runs as one task on the queue's shard (RELEASES_RECORD, an INSERT ...
    SELECT with parameters, it cannot plan as one)."""
    rows = ",\n       ".join(f"(%(queue)s::text, %(i{k})s::bigint, %(s{k})s::text)" for k in range(n))
    return f"""
-- The jobs of one queue a request just finished that other jobs depend on, with how they finished: the
-- dependency release (app/db/releases.py) releases or cancels their dependants.
INSERT INTO jobq.dependency_releases (queue_name, job_id, status)
VALUES {rows}
"""


# Rows of one such statement: a settle may cancel up to JOBQ_DEPENDENCY_BATCH_SIZE (100,000) jobs, and a statement
# takes at most 65,535 parameters; the cached texts stay small.
RECORD_CHUNK = 500


async def releases_written(conn: psycopg.AsyncConnection[Any], queue: str, jobs: Sequence[tuple[int, str]]) -> None:
    """Record (job id, status) of jobs of `queue` just finished, whose finishing statement returned them."""
    for start in range(0, len(jobs), RECORD_CHUNK):
        chunk = jobs[start : start + RECORD_CHUNK]
        params: dict[str, Any] = {"queue": queue}
        for k, (job_id, status) in enumerate(chunk):
            params[f"i{k}"], params[f"s{k}"] = job_id, status
        await conn.execute(releases_record_values(len(chunk)), params)
