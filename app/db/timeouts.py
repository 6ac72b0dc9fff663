"""The hard-timeout sweep: running jobs that have run longer than their timeout since their claim are failed
with last_error 'timeout', whatever their heartbeats, and retried after a backoff or failed for good as a
worker's fail would have them (app/maintenance/timeouts.py runs it).

A job's timeout is its own (`timeout_seconds` on enqueue), else its queue's (queue_state.timeout_seconds),
read here, so a queue's change applies to its running jobs at once. A job failed for good that other jobs
depend on is recorded in the dependency release's outbox in the same transaction (app/db/finishing.py). The
claim's token is kept with a suffix (app/db/writes.py TIMED_OUT_SUFFIX): it holds nothing any more, and the
worker's next heartbeat, complete, fail or release learns why (409 job-timed-out).

One queue at a time, as the lease rescue (app/db/rescue.py): JOB_TIMEOUT_QUEUES finds the queues with jobs
past their timeout (a bounded read), then JOB_FAIL_TIMED_OUT sweeps one queue, every table it reads and
writes filtered by that queue: with `jobs` distributed by queue name, a single-shard statement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from app.db.finishing import counts_add, releases_record
from app.db.jobs import RUNNING, RUNNING_C
from app.db.rows import rows_of
from app.db.writes import TIMED_OUT_SUFFIX

NOW = "coalesce(%(now)s::timestamptz, now())"  # tests move time forward instead of waiting

JOB_TIMEOUT_QUEUES = f"""
-- The queues with running jobs past their timeout, other than those in `skip` (done in this pass): the queues
-- among the `scan` oldest claims of jobs with a timeout of their own (jobs_timeout_idx), and the queues with a
-- timeout of their own that have a running job without one past it (jobs_running_idx, one probe per queue).
-- A read, no lock. On Citus it goes to every shard, once per look (the sweep's look over all queues); each
-- queue is then swept by JOB_FAIL_TIMED_OUT on its own shard.
SELECT queue_name FROM (
  SELECT j.queue_name FROM jobq.jobs j
  WHERE j.status = 'running' AND j.timeout_seconds IS NOT NULL
    AND j.claimed_at < {NOW} - make_interval(secs => j.timeout_seconds)
    AND j.queue_name <> ALL(%(skip)s::text[])
  ORDER BY j.claimed_at
  LIMIT %(scan)s
) own
UNION
(SELECT q.queue_name FROM jobq.queue_state q
 WHERE q.timeout_seconds IS NOT NULL AND q.queue_name <> ALL(%(skip)s::text[])
   AND EXISTS (SELECT FROM jobq.jobs j
               WHERE j.queue_name = q.queue_name AND j.status = {RUNNING_C} AND j.timeout_seconds IS NULL
                 AND j.claimed_at < {NOW} - make_interval(secs => q.timeout_seconds))
 ORDER BY q.queue_name
 LIMIT %(scan)s)
"""

JOB_FAIL_TIMED_OUT = f"""
WITH over AS (
  -- The queue's jobs with a timeout of their own, oldest claim first (jobs_timeout_idx: running jobs with
  -- a timeout).
  (SELECT j.id FROM jobq.jobs j
   WHERE j.queue_name = %(queue)s AND j.status = 'running' AND j.timeout_seconds IS NOT NULL
     AND j.claimed_at < {NOW} - make_interval(secs => j.timeout_seconds)
   ORDER BY j.claimed_at
   LIMIT %(batch)s)
  UNION
  -- Its jobs without one, when the queue has one (jobs_running_idx).
  (SELECT j.id FROM jobq.queue_state q JOIN jobq.jobs j ON j.queue_name = q.queue_name
   WHERE q.queue_name = %(queue)s AND q.timeout_seconds IS NOT NULL
     AND j.queue_name = %(queue)s AND j.status = {RUNNING_C} AND j.timeout_seconds IS NULL
     AND j.claimed_at < {NOW} - make_interval(secs => q.timeout_seconds)
   LIMIT %(batch)s)
), locked AS (
  -- Locked by primary key; SKIP LOCKED leaves a job its worker is finishing right now to that worker, and
  -- the conditions are checked again on the locked row (it may have been finished and claimed again). As a
  -- worker's fail with retry: back to pending after the queue's backoff (else the global one) while attempts
  -- remain, else failed for good. What the UPDATE sets is computed here: on Citus an UPDATE may neither
  -- call a volatile function nor apply a stable one to a column (app/db/distribute.py).
  SELECT j.id, j.attempts < j.max_attempts AS retry,
         clock_timestamp() + make_interval(secs =>
           least(coalesce(q.backoff_max_seconds, %(cap)s::float8),
                 coalesce(q.backoff_base_seconds, %(base)s::float8) * power(2, least(j.attempts - 1, 60)))
           * (0.5 + random() / 2)) AS retry_at,
         clock_timestamp() AS now
  FROM jobq.jobs j
  LEFT JOIN jobq.queue_state q ON q.queue_name = j.queue_name AND q.queue_name = %(queue)s
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM over)) AND j.status = {RUNNING}
    AND j.claimed_at < {NOW} - make_interval(secs => coalesce(j.timeout_seconds, q.timeout_seconds))
  LIMIT %(batch)s
  FOR UPDATE OF j SKIP LOCKED
), failed AS (
  UPDATE jobq.jobs AS j
  SET status = CASE WHEN l.retry THEN 'pending' ELSE 'failed' END,
      run_at = CASE WHEN l.retry THEN l.retry_at ELSE j.run_at END,
      finished_at = CASE WHEN l.retry THEN NULL ELSE l.now END,
      lease_expires_at = NULL,
      claim_token = j.claim_token || '{TIMED_OUT_SUFFIX}',
      last_error = 'timeout'
  FROM locked l
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = l.id
  RETURNING j.id, j.queue_name AS queue, j.status, j.locked_by AS worker,
            coalesce(j.has_dependants, false) AS has_dependants
  -- Those failed for good are counted, and those with dependants recorded for the dependency release, by
  -- statements of their own in this transaction (app/db/finishing.py).
)
SELECT id, queue, status, worker, has_dependants FROM failed
"""


@dataclass(slots=True, frozen=True)
class TimedOut:
    id: int
    queue: str
    status: str  # pending (to be retried) or failed
    worker: str | None
    has_dependants: bool  # failed for good with dependants: recorded for the dependency release


async def timeout_queues(
    conn: psycopg.AsyncConnection[Any], now: datetime | None, skip: Sequence[str], scan: int
) -> list[str]:
    """Queues with running jobs past their timeout (among the oldest `scan` of each kind), other than `skip`."""
    cur = await conn.execute(JOB_TIMEOUT_QUEUES, {"now": now, "skip": list(skip), "scan": scan})
    return sorted(str(r[0]) for r in await cur.fetchall())


async def jobs_fail_timed_out(
    conn: psycopg.AsyncConnection[Any],
    queue: str,
    now: datetime | None,
    batch: int,
    backoff_base: float,
    backoff_cap: float,
) -> list[TimedOut]:
    """One batch of one queue's jobs past their timeout failed. `now` replaces the database clock for deciding
    which (tests move time forward instead of sleeping)."""
    cur = conn.cursor(row_factory=rows_of(TimedOut))
    params = {"queue": queue, "now": now, "batch": batch, "base": backoff_base, "cap": backoff_cap}
    async with conn.transaction():
        await cur.execute(JOB_FAIL_TIMED_OUT, params)
        timed_out = await cur.fetchall()
        failed = [t for t in timed_out if t.status == "failed"]
        await counts_add(conn, queue, "failed", len(failed))
        await releases_record(conn, queue, [t.id for t in failed if t.has_dependants])
    return timed_out
