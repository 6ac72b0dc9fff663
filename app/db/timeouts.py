"""The hard-timeout sweep: running jobs that have run longer than their timeout since their claim are failed
with last_error 'timeout', whatever their heartbeats, and retried after a backoff or failed for good as a
worker's fail would have them (app/maintenance/timeouts.py runs it).

A job's timeout is its own (`timeout_seconds` on enqueue), else its queue's (queue_state.timeout_seconds),
read here, so a queue's change applies to its running jobs at once. A job failed for good that other jobs
depend on is recorded in the dependency release's outbox by the same statement (app/db/releases.py). The
claim's token is kept with a suffix (app/db/writes.py TIMED_OUT_SUFFIX): it holds nothing any more, and the
worker's next heartbeat, complete, fail or release learns why (409 job-timed-out)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from app.db.jobs import RUNNING, RUNNING_C, count_finished, record_finished
from app.db.rows import rows_of
from app.db.writes import TIMED_OUT_SUFFIX

# How long a running job may run: its own timeout, else its queue's (one lookup by key).
_TIMEOUT = (
    "coalesce(j.timeout_seconds, (SELECT q.timeout_seconds FROM jobq.queue_state q WHERE q.queue_name = j.queue_name))"
)

JOB_FAIL_TIMED_OUT = f"""
WITH over AS (
  -- Jobs with a timeout of their own, oldest claim first (jobs_timeout_idx: running jobs with a timeout).
  (SELECT j.id FROM jobq.jobs j
   WHERE j.status = 'running' AND j.timeout_seconds IS NOT NULL
     AND j.claimed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => j.timeout_seconds)
   ORDER BY j.claimed_at
   LIMIT %(batch)s)
  UNION
  -- Jobs without one, of the queues that have one (jobs_running_idx, per queue).
  (SELECT r.id FROM jobq.queue_state q CROSS JOIN LATERAL (
     SELECT j.id FROM jobq.jobs j
     WHERE j.queue_name = q.queue_name AND j.status = {RUNNING_C} AND j.timeout_seconds IS NULL
       AND j.claimed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => q.timeout_seconds)
     LIMIT %(batch)s) r
   WHERE q.timeout_seconds IS NOT NULL)
), locked AS (
  -- Locked by primary key; SKIP LOCKED leaves a job its worker is finishing right now to that worker, and
  -- the conditions are checked again on the locked row (it may have been finished and claimed again).
  SELECT j.id FROM jobq.jobs j
  WHERE j.id = ANY(ARRAY(SELECT id FROM over)) AND j.status = {RUNNING}
    AND j.claimed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => {_TIMEOUT})
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), failed AS (
  -- As a worker's fail with retry: back to pending after the queue's backoff (else the global one) while
  -- attempts remain, else failed for good.
  UPDATE jobq.jobs AS j
  SET status = CASE WHEN j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
      run_at = CASE WHEN j.attempts < j.max_attempts
                    THEN clock_timestamp() + make_interval(secs =>
                         least(coalesce((SELECT backoff_max_seconds FROM jobq.queue_state
                                         WHERE queue_name = j.queue_name),
                                        %(cap)s::float8),
                               coalesce((SELECT backoff_base_seconds FROM jobq.queue_state
                                         WHERE queue_name = j.queue_name),
                                        %(base)s::float8) * power(2, least(j.attempts - 1, 60)))
                         * (0.5 + random() / 2))
                    ELSE j.run_at END,
      finished_at = CASE WHEN j.attempts < j.max_attempts THEN NULL ELSE clock_timestamp() END,
      lease_expires_at = NULL,
      claim_token = j.claim_token || '{TIMED_OUT_SUFFIX}',
      last_error = 'timeout'
  FROM locked
  WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = locked.id
  RETURNING j.id, j.queue_name AS queue, j.status, j.locked_by AS worker,
            coalesce(j.has_dependants, false) AS has_dependants
), counted AS ({count_finished("failed")}
), recorded AS ({record_finished("failed")}
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


async def jobs_fail_timed_out(
    conn: psycopg.AsyncConnection[Any], now: datetime | None, batch: int, backoff_base: float, backoff_cap: float
) -> list[TimedOut]:
    """One batch of jobs past their timeout failed. `now` replaces the database clock for deciding which
    (tests move time forward instead of sleeping)."""
    cur = conn.cursor(row_factory=rows_of(TimedOut))
    params = {"now": now, "batch": batch, "base": backoff_base, "cap": backoff_cap}
    await cur.execute(JOB_FAIL_TIMED_OUT, params)
    return await cur.fetchall()
