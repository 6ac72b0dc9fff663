"""The lease rescue's statements: lapsed leases back to pending, or failed on their last attempt (rescuer.py).

One queue at a time: JOB_LAPSED_QUEUES finds the queues with lapsed leases (a bounded, index-only read),
then JOB_RESCUE_EXPIRED and JOB_FAIL_EXHAUSTED work on one queue each, through jobs_queue_lease_idx
(migrations/0018_release_indexes.sql), so that one queue's trouble (a statement that fails or runs past its
budget) stops no other queue's rescue, and each would be a single-shard statement with `jobs` distributed
by queue name. Each runs in a transaction of its own with its own statement_timeout (the budget)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from app.db.finishing import counts_add, releases_record

# --- lease rescue ---------------------------------------------------------------------------------------------

JOB_LAPSED_QUEUES = """
-- The queues among the oldest `scan` lapsed leases, other than those in `skip` (done or failed in this pass):
-- an index-only read of jobs_lease_idx, no lock. A queue done this pass is skipped even when some of its
-- lapsed jobs are left (locked by a worker finishing them: SKIP LOCKED left them), so a pass always ends.
SELECT DISTINCT queue_name FROM (
  SELECT queue_name FROM jobq.jobs
  WHERE status = 'running'
    AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    AND queue_name <> ALL(%(skip)s::text[])
  ORDER BY lease_expires_at
  LIMIT %(scan)s
) lapsed
"""

JOB_RESCUE_EXPIRED = """
WITH expired AS (
  -- One queue's leases that lapsed while attempts remain, oldest first through jobs_queue_lease_idx. SKIP
  -- LOCKED: replicas rescuing at once split the work, and a job that a worker is completing right now is
  -- left to that worker.
  SELECT id FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = 'running'
    AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    AND attempts < max_attempts
  ORDER BY lease_expires_at
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
)
UPDATE jobq.jobs AS j
SET status = 'pending', run_at = now(), lease_expires_at = NULL, claim_token = NULL,
    last_error = 'lease expired'
FROM expired
WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM expired)) AND j.id = expired.id
RETURNING j.queue_name
"""

JOB_FAIL_EXHAUSTED = """
WITH exhausted AS (
  -- One queue's lapsed leases on the last attempt: the terminal path, kept separate so it is easy to see.
  SELECT id FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = 'running'
    AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    AND attempts >= max_attempts
  ORDER BY lease_expires_at
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), failed AS (
  UPDATE jobq.jobs AS j
  SET status = 'failed', finished_at = now(), lease_expires_at = NULL,
      last_error = 'lease expired on the last attempt'
  FROM exhausted
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM exhausted)) AND j.id = exhausted.id
  RETURNING j.queue_name AS queue, j.status, j.id, coalesce(j.has_dependants, false) AS has_dependants
  -- The jobs waiting for these are released (cancelled) afterwards, by the dependency release: recorded, and
  -- counted, by statements of their own in this transaction (app/db/finishing.py).
)
SELECT queue, id, has_dependants FROM failed
"""


async def _budgeted(
    conn: psycopg.AsyncConnection[Any], budget_ms: int, query: str, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """Run one statement in a transaction of its own, cancelled past `budget_ms` (statement_timeout)."""
    async with conn.transaction():
        await conn.execute("SELECT set_config('statement_timeout', %s, true)", (str(budget_ms),))
        cur = await conn.execute(query, params)
        return await cur.fetchall()


async def lapsed_queues(
    conn: psycopg.AsyncConnection[Any], now: datetime | None, skip: Sequence[str], scan: int, budget_ms: int
) -> list[str]:
    """Queues with lapsed leases (among the oldest `scan`), other than `skip`."""
    rows = await _budgeted(conn, budget_ms, JOB_LAPSED_QUEUES, {"now": now, "skip": list(skip), "scan": scan})
    return sorted(str(r[0]) for r in rows)


async def jobs_rescue_expired(
    conn: psycopg.AsyncConnection[Any], queue: str, now: datetime | None, batch: int, budget_ms: int
) -> int:
    """One batch of one queue's lapsed leases back to pending; returns how many moved."""
    params = {"queue": queue, "now": now, "batch": batch}
    return len(await _budgeted(conn, budget_ms, JOB_RESCUE_EXPIRED, params))


async def jobs_fail_exhausted(
    conn: psycopg.AsyncConnection[Any], queue: str, now: datetime | None, batch: int, budget_ms: int
) -> list[tuple[int, bool]]:
    """One batch of one queue's lapsed leases on their last attempt failed; returns (id, has_dependants)
    of each."""
    params = {"queue": queue, "now": now, "batch": batch}
    async with conn.transaction():
        await conn.execute("SELECT set_config('statement_timeout', %s, true)", (str(budget_ms),))
        cur = await conn.execute(JOB_FAIL_EXHAUSTED, params)
        gone = [(int(r[1]), bool(r[2])) for r in await cur.fetchall()]
        await counts_add(conn, queue, "failed", len(gone))
        await releases_record(conn, queue, [job_id for job_id, parent in gone if parent])
    return gone
