"""Debounced enqueues (docs/producers.md): while a job with the key is pending, an enqueue replaces its payload
and priority and moves its run time; otherwise it makes a new pending job.

Race-free two ways. Between enqueues with one key: a transaction-scoped advisory lock on (queue, key), taken
before the statement that looks for the pending job, so the statement's snapshot already shows whatever a
concurrent enqueue with the key committed (a statement that took the lock itself would still read with the
snapshot it started with, and both would insert). With a claim: the lookup locks the pending job FOR UPDATE.
When a claim locked it first, the lookup waits, finds it running, and the enqueue makes a new job: the claim
runs the old payload, the new job the new one. When the enqueue locked it first, the claim skips it (SKIP
LOCKED) and finds it later, replaced. Either way each payload runs once, or is replaced before any claim.

The run time only ever moves later, so a replaced job never has to wake a claim: greatest(its run time, the
new one). The new one is now + seconds, capped at the first enqueue (the job's created_at) + max_wait."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import psycopg

from app.db import finishing
from app.db.jobs import JOB_COLUMNS, NewJob, as_json, job_get, jobs_insert_unique
from app.db.rows import Inserted, JobRow, Made, outcome_rows

JOB_DEBOUNCE_LOCK = """
-- One advisory lock per (queue, key), in one order (no two enqueues wait on each other in a cycle); held to
-- the end of the transaction. A collision of two keys' hashes only makes them wait for each other.
SELECT count(pg_advisory_xact_lock(k)) FROM (
  SELECT DISTINCT hashtextextended(k.queue_name || '/' || k.debounce_key, 24) AS k
  FROM json_to_recordset(%(keys)s::json) AS k(queue_name text, debounce_key text)
  ORDER BY 1
) l
"""

# The pending job of a debounce key, locked, and its new run time: JOB_DEBOUNCE's first CTE, and on Citus a
# statement of its own (JOB_DEBOUNCE_TARGET).
_TARGET = """SELECT j.id,
       greatest(j.run_at, least(now() + make_interval(secs => %(seconds)s),
                                j.created_at + make_interval(secs => %(max_wait)s))) AS run_at
FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.debounce_key = %(key)s AND j.debounce_key IS NOT NULL AND j.status = 'pending'
ORDER BY j.id DESC
LIMIT 1
FOR UPDATE"""

JOB_DEBOUNCE = f"""
WITH target AS (
  -- The pending job of the key (the newest, should a retried one have come back beside it), through
  -- jobs_debounce_idx. FOR UPDATE: a claim that holds it makes this wait, then find it running: no target.
  -- Its new run time is computed here, not in the UPDATE (on Citus an UPDATE may not apply a STABLE
  -- function, such as timestamptz + interval, to a column).
{textwrap.indent(_TARGET, "  ")}
), replaced AS (
  UPDATE jobq.jobs AS j
  SET payload = %(payload)s::jsonb, priority = %(priority)s, debounce_seconds = %(seconds)s,
      debounce_max_wait_seconds = %(max_wait)s, run_at = t.run_at
  FROM target t WHERE j.queue_name = %(queue)s AND j.id = t.id
  RETURNING j.*
), inserted AS (
  INSERT INTO jobq.jobs AS j (queue_name, payload, priority, run_at, max_attempts, traceparent, group_key,
                         timeout_seconds, debounce_key, debounce_seconds, debounce_max_wait_seconds)
  SELECT %(queue)s, %(payload)s::jsonb, %(priority)s,
         now() + make_interval(secs => %(seconds)s),  -- max_wait is at least seconds (the API checks)
         %(max_attempts)s, %(traceparent)s, %(group)s, %(timeout)s, %(key)s, %(seconds)s, %(max_wait)s
  WHERE NOT EXISTS (SELECT FROM target)
  RETURNING j.*
)
-- The answer's columns computed here, not in RETURNING: Citus allows no STABLE function (json_build_object,
-- timestamptz + interval) in a RETURNING clause.
SELECT 0 AS ord, false AS created, {JOB_COLUMNS} FROM replaced j
UNION ALL
SELECT 0, true, {JOB_COLUMNS} FROM inserted j
"""


# On Citus, JOB_DEBOUNCE runs through the coordinator: its conditional INSERT ... SELECT and the CTEs beside it are
# subplans. There (finishing.on_citus) the enqueue sends its parts as statements of their own, in the same
# transaction and under the same advisory lock, each one task on the queue's shard: the pending job locked FOR
# UPDATE (JOB_DEBOUNCE_TARGET), then either its replacement (JOB_DEBOUNCE_REPLACE, the new run time as the target
# computed it) or a new job (JOB_DEBOUNCE_INSERT, a VALUES list), then the job as the answer shows it (JOB_GET:
# Citus allows no STABLE function, such as json_build_object, in a RETURNING clause).
JOB_DEBOUNCE_TARGET = f"""
-- On Citus: JOB_DEBOUNCE's target, a statement of its own (see there).
{_TARGET}
"""

JOB_DEBOUNCE_REPLACE = """
-- On Citus: the pending job that JOB_DEBOUNCE_TARGET locked, replaced.
UPDATE jobq.jobs AS j
SET payload = %(payload)s::jsonb, priority = %(priority)s, debounce_seconds = %(seconds)s,
    debounce_max_wait_seconds = %(max_wait)s, run_at = %(run_at)s
WHERE j.queue_name = %(queue)s AND j.id = %(id)s
"""

JOB_DEBOUNCE_INSERT = """
-- On Citus: a new pending job for the key, JOB_DEBOUNCE_TARGET having found none.
INSERT INTO jobq.jobs AS j (queue_name, payload, priority, run_at, max_attempts, traceparent, group_key,
                       timeout_seconds, debounce_key, debounce_seconds, debounce_max_wait_seconds)
VALUES (%(queue)s::text, %(payload)s::jsonb, %(priority)s::int,
        now() + make_interval(secs => %(seconds)s::float8),  -- max_wait is at least seconds (the API checks)
        %(max_attempts)s::int, %(traceparent)s::text, %(group)s::text, %(timeout)s::int, %(key)s::text,
        %(seconds)s::float8, %(max_wait)s::float8)
RETURNING j.id
"""


async def _debounce_citus(conn: psycopg.AsyncConnection[Any], params: dict[str, Any]) -> Inserted:
    """On Citus: one debounced enqueue, in the caller's transaction, under its advisory lock."""
    cur = conn.cursor()
    await cur.execute(JOB_DEBOUNCE_TARGET, params)
    target = await cur.fetchone()
    if target is not None:
        job_id, run_at = target
        await cur.execute(JOB_DEBOUNCE_REPLACE, {**params, "id": job_id, "run_at": run_at})
    else:
        await cur.execute(JOB_DEBOUNCE_INSERT, params)
        made = await cur.fetchone()
        assert made is not None
        job_id = made[0]
    job = await job_get(conn, job_id, queue=params["queue"])
    assert job is not None
    return Inserted(target is None, job, replaced=target is not None)


async def jobs_insert_debounced(conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob]) -> list[Inserted]:
    """Enqueue jobs of which some are debounced, all or nothing, in one transaction: the others as
    jobs_insert_unique does, then each debounced one in order (the same key twice: the second replaces the
    job the first made). `created` true: a new job; false with `replaced`: the pending job replaced."""
    out: list[Inserted | None] = [None] * len(jobs)
    debounced = [i for i, j in enumerate(jobs) if j.debounce is not None]
    others = [i for i, j in enumerate(jobs) if j.debounce is None]
    async with conn.transaction():
        keys = [{"queue_name": jobs[i].queue, "debounce_key": jobs[i].debounce.key} for i in debounced]  # type: ignore[union-attr]
        await conn.execute(JOB_DEBOUNCE_LOCK, {"keys": as_json(keys)})
        if others:
            for i, made in zip(others, await jobs_insert_unique(conn, [jobs[i] for i in others]), strict=True):
                out[i] = made
        cur = conn.cursor(row_factory=outcome_rows(Made, JobRow))
        for i in debounced:
            job, d = jobs[i], jobs[i].debounce
            assert d is not None
            params = {
                "queue": job.queue,
                "key": d.key,
                "payload": job.payload,
                "priority": job.priority,
                "seconds": d.seconds,
                "max_wait": d.max_wait_seconds,
                "max_attempts": job.max_attempts,
                "traceparent": job.traceparent,
                "group": job.group,
                "timeout": job.timeout_seconds,
            }
            if finishing.on_citus(conn):
                out[i] = await _debounce_citus(conn, params)
                continue
            await cur.execute(JOB_DEBOUNCE, params)
            row = await cur.fetchone()
            assert row is not None and row.job is not None
            out[i] = Inserted(row.created, row.job, replaced=not row.created)
    return [o for o in out if o is not None]
