"""The lease rescue's statements: lapsed leases back to pending, or failed on their last attempt (rescuer.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from app.db.jobs import count_finished

# --- lease rescue ---------------------------------------------------------------------------------------------

JOB_RESCUE_EXPIRED = """
WITH expired AS (
  -- Leases that lapsed while attempts remain, oldest first through jobs_lease_idx. SKIP LOCKED:
  -- replicas rescuing at once split the work, and a job that a worker is completing right now is left
  -- to that worker.
  SELECT id FROM jobs
  WHERE status = 'running'
    AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    AND attempts < max_attempts
  ORDER BY lease_expires_at
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
)
UPDATE jobs AS j
SET status = 'pending', run_at = now(), lease_expires_at = NULL, claim_token = NULL,
    last_error = 'lease expired'
FROM expired
WHERE j.id = ANY(ARRAY(SELECT id FROM expired)) AND j.id = expired.id
RETURNING j.queue_name
"""

JOB_FAIL_EXHAUSTED = f"""
WITH exhausted AS (
  -- Lapsed leases on the last attempt: the terminal path, kept separate so it is easy to see.
  SELECT id FROM jobs
  WHERE status = 'running'
    AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    AND attempts >= max_attempts
  ORDER BY lease_expires_at
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), failed AS (
  UPDATE jobs AS j
  SET status = 'failed', finished_at = clock_timestamp(), lease_expires_at = NULL,
      last_error = 'lease expired on the last attempt'
  FROM exhausted
  WHERE j.id = ANY(ARRAY(SELECT id FROM exhausted)) AND j.id = exhausted.id
  RETURNING j.queue_name AS queue, j.status, j.id
), counted AS ({count_finished("failed")}
)
SELECT queue, id FROM failed
"""


async def jobs_rescue_expired(conn: psycopg.AsyncConnection[Any], now: datetime | None, batch: int) -> list[str]:
    """One batch of lapsed leases back to pending; returns the queue of each row moved."""
    cur = await conn.execute(JOB_RESCUE_EXPIRED, {"now": now, "batch": batch})
    return [r[0] for r in await cur.fetchall()]


async def jobs_fail_exhausted(
    conn: psycopg.AsyncConnection[Any], now: datetime | None, batch: int
) -> list[tuple[str, int]]:
    """One batch of lapsed leases on their last attempt failed; returns (queue, id) of each."""
    cur = await conn.execute(JOB_FAIL_EXHAUSTED, {"now": now, "batch": batch})
    return [(r[0], r[1]) for r in await cur.fetchall()]
