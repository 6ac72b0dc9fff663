"""What the sweeps write beside the jobs they finish or delete, in the same transaction: the finished-job
counters (queue_counts) and the dependency release's outbox (dependency_releases).

The request paths write both from data-modifying CTEs of their own statement (app/db/jobs.py count_finished,
record_finished). On Citus an INSERT inside a data-modifying CTE is always planned through the coordinator
(a subplan per CTE), so the sweeps, which may take a statement more, write them with statements of their own
on the queue's shard, each a single task, after the statement that moved the jobs and before it commits: a
finish still never commits without its count and its record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

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
