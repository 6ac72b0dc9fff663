"""A worker's writes on the job it holds (heartbeat, complete, fail, release) and the server's hand-back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
from orjson import Fragment

from app.db.jobs import JOB_COLUMNS, RUNNING, as_json, count_finished, job_columns, job_get, record_finished
from app.db.rows import Beat, ClaimRow, JobRow, Status, Written, outcome_rows, rows_of
from app.db.scope import queue_allowed


def _fragment(text: str | None) -> Fragment | None:
    return Fragment(text) if text is not None else None


# --- claims handed back ---------------------------------------------------------------------------------------

JOB_RELEASE = f"""
-- Claimed for a request that went away before it could be answered (timeout, disconnect, shutdown):
-- hand the job straight back. The attempt is returned too, since no worker ever saw the job.
WITH r AS (SELECT * FROM json_to_recordset(%(claims)s::json) AS r(id bigint, token text))
UPDATE jobq.jobs AS j
SET status = 'pending', attempts = j.attempts - 1, lease_expires_at = NULL, claim_token = NULL
FROM r
WHERE j.id = ANY(ARRAY(SELECT id FROM r)) AND j.id = r.id AND j.claim_token = r.token AND j.status = {RUNNING}
"""


async def jobs_release(conn: psycopg.AsyncConnection[Any], rows: Sequence[ClaimRow]) -> None:
    await conn.execute(JOB_RELEASE, {"claims": as_json([{"id": r.id, "token": r.claim_token} for r in rows])})


# --- heartbeat, complete, fail ------------------------------------------------------------------------------

Outcome = Literal["ok", "claim_lost", "not_found", "cancelled", "timed_out"]

# What a claim's token becomes when the hard-timeout sweeper fails its job: the token with
# this suffix, which no token the claim hands out can end with (they are URL-safe base64). The token no longer
# holds the job, and the worker's next write learns why (job-timed-out) instead of claim-lost.
TIMED_OUT_SUFFIX = "~timeout"


def outcome_of(token: str, job: JobRow | None, done: tuple[str, ...]) -> Outcome:
    """Why a guarded write matched nothing, from the row as it was: gone, already done with this very
    token (a retried call: success), cancelled by an operator while this claim held it, or held by
    another claim."""
    return _outcome(token, job.status if job else None, job.claim_token if job else None, done)


def _outcome(token: str, status: str | None, held_by: str | None, done: tuple[str, ...]) -> Outcome:
    if status is None:
        return "not_found"
    if held_by == token and status in done:
        return "ok"
    if held_by == token and status == Status.cancelled:
        return "cancelled"
    if held_by is not None and held_by == token + TIMED_OUT_SUFFIX:
        return "timed_out"
    return "claim_lost"


JOB_HEARTBEAT_MANY = f"""
WITH input AS (
  SELECT * FROM json_to_recordset(%(beats)s::json)
    AS t(ord int, id bigint, token text, lease int, allowed text, progress text, set_progress bool, writes bool)
), renewed AS (
  -- Guarded by id + token + running (a stale claim renews nothing) + the caller's queues. A beat that
  -- carries progress replaces the job's (JSON null clears it); one without leaves it as it is. Beats of
  -- one claim that share this statement write once, through the one that `writes` (see jobs_heartbeat).
  UPDATE jobq.jobs AS j
  SET lease_expires_at = clock_timestamp() + make_interval(secs => coalesce(i.lease, j.lease_seconds)),
      lease_seconds = coalesce(i.lease, j.lease_seconds),
      progress = CASE WHEN i.set_progress THEN i.progress::jsonb ELSE j.progress END
  FROM input i
  WHERE j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id AND i.writes
    AND j.status = {RUNNING} AND j.claim_token = i.token AND {queue_allowed("j.queue_name", "i.allowed")}
  RETURNING j.id, j.claim_token, j.lease_expires_at, j.locked_by, j.queue_name
)
-- Per input: the new expiry, else the job's state as this statement found it (to tell why not); a job
-- outside the caller's queues is not found.
-- The worker and queue of a renewed claim go to the worker registry (app/core/workers.py).
SELECT i.ord, r.lease_expires_at, c.status, c.claim_token, r.locked_by AS worker, r.queue_name AS queue
FROM input i
LEFT JOIN renewed r ON r.id = i.id AND r.claim_token = i.token
LEFT JOIN LATERAL (
  SELECT j.status, j.claim_token FROM jobq.jobs j
  WHERE j.id = i.id AND {queue_allowed("j.queue_name", "i.allowed")}
  OFFSET 0
) c ON r.id IS NULL
ORDER BY i.ord
"""


@dataclass(slots=True, frozen=True)
class Heartbeat:
    id: int
    token: str
    lease_seconds: int | None
    allowed: str | None = None  # the caller's queue regex; None: every queue
    progress: str | None = None  # JSON text; stored only when set_progress (None then: clear it)
    set_progress: bool = False


@dataclass(slots=True, frozen=True)
class Renewed:
    outcome: Outcome
    lease_expires_at: datetime | None
    worker: str | None = None  # of the claim renewed, and its queue
    queue: str | None = None


async def jobs_heartbeat(conn: psycopg.AsyncConnection[Any], beats: Sequence[Heartbeat]) -> list[Renewed]:
    doc: list[dict[str, Any]] = [
        {
            "ord": n,
            "id": b.id,
            "token": b.token,
            "lease": b.lease_seconds,
            "allowed": b.allowed,
            "progress": b.progress,
            "set_progress": b.set_progress,
            "writes": True,
        }
        for n, b in enumerate(beats)
    ]
    # Beats of one claim in one statement (a worker's concurrent heartbeats, coalesced): an UPDATE joined to
    # several of them would apply one, chosen by the plan, and a newer progress could be dropped while its
    # beat answered ok. The last of them writes, carrying the lease it asked for and the latest progress
    # any of them reported; the others share its outcome.
    last: dict[tuple[Any, ...], dict[str, Any]] = {}
    for item in doc:
        key = (item["id"], item["token"], item["allowed"])
        before = last.get(key)
        if before is not None:
            before["writes"] = False
            if not item["set_progress"] and before["set_progress"]:
                item["progress"], item["set_progress"] = before["progress"], True
        last[key] = item
    cur = conn.cursor(row_factory=rows_of(Beat))
    await cur.execute(JOB_HEARTBEAT_MANY, {"beats": as_json(doc)})
    out: list[Renewed] = []
    for beat, row in zip(beats, await cur.fetchall(), strict=True):
        if row.lease_expires_at is not None:
            out.append(Renewed("ok", row.lease_expires_at, row.worker, row.queue))
        elif row.status == Status.running and row.claim_token == beat.token:
            # Changed by a concurrent statement after our snapshot (a cancel, the sweeper, a complete):
            # look again, so that a cancel is reported as such and not as a lost claim.
            job = await job_get(conn, beat.id, beat.allowed)
            out.append(Renewed(outcome_of(beat.token, job, ()), None))
        else:
            out.append(Renewed(_outcome(beat.token, row.status, row.claim_token, ()), None))
    return out


def _written_many(done: str, full: str) -> str:
    """The tail of a batch write's statement: per input item, in order, (ord, written, job) where job is
    the row as `done` wrote it, else as this statement found it (to tell why not; NULLs: no such job, or
    none in the caller's queues)."""
    return f"""
SELECT i.ord, true AS written, d.* FROM input i JOIN {done} d ON d.id = i.id AND d.claim_token = i.token
UNION ALL
SELECT i.ord, false, c.*
FROM input i
LEFT JOIN LATERAL (
  SELECT {job_columns(full)} FROM jobq.jobs j
  WHERE j.id = i.id AND {queue_allowed("j.queue_name", "i.allowed")}
  OFFSET 0
) c ON true
WHERE NOT EXISTS (SELECT FROM {done} d WHERE d.id = i.id AND d.claim_token = i.token)
ORDER BY 1
"""


JOB_COMPLETE_MANY = f"""
WITH input AS (
  SELECT * FROM json_to_recordset(%(items)s::json)
    AS t(ord int, id bigint, token text, result jsonb, allowed text)
), done AS (
  UPDATE jobq.jobs AS j
  SET status = 'completed', finished_at = clock_timestamp(), lease_expires_at = NULL, result = i.result
  -- The same job and token twice in one statement (a retry coalesced with its original): the first
  -- item's result is kept, as for a retry that comes later.
  FROM (SELECT DISTINCT ON (id, token) * FROM input ORDER BY id, token, ord) i
  WHERE j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id
    AND j.status = {RUNNING} AND j.claim_token = i.token AND {queue_allowed("j.queue_name", "i.allowed")}
  RETURNING {job_columns("%(full)s")}
), counted AS ({count_finished("done", "'completed'")}
), recorded AS ({record_finished("done")}
)
{_written_many("done", "%(full)s")}
"""


@dataclass(slots=True, frozen=True)
class Completion:
    id: int
    token: str
    result: str | None  # serialised JSON
    allowed: str | None = None  # the caller's queue regex; None: every queue


@dataclass(slots=True, frozen=True)
class Done:
    outcome: Outcome
    job: JobRow | None  # the job's row (None: not found)
    changed: bool  # whether this call changed it


async def jobs_complete(
    conn: psycopg.AsyncConnection[Any], items: Sequence[Completion], *, full: bool = True
) -> list[Done]:
    """Complete jobs in one statement. A retried complete with the token that completed the job is "ok"
    (the first result is kept). With full=False rows carry no payload/result (batch answers)."""
    doc = [
        {"ord": n, "id": c.id, "token": c.token, "result": _fragment(c.result), "allowed": c.allowed}
        for n, c in enumerate(items)
    ]
    cur = conn.cursor(row_factory=outcome_rows(Written, JobRow))
    await cur.execute(JOB_COMPLETE_MANY, {"items": as_json(doc), "full": full})
    out: list[Done] = []
    recheck = []
    changed: set[int] = set()
    for n, (item, row) in enumerate(zip(items, await cur.fetchall(), strict=True)):
        if row.written:
            # The same job twice in this statement was completed once: only its first item changed it.
            out.append(Done("ok", row.job, item.id not in changed))
            changed.add(item.id)
            continue
        job = row.job
        if job is not None and job.status == Status.running and job.claim_token == item.token:
            recheck.append(n)  # a concurrent statement finished it after our snapshot: look again
        out.append(Done(outcome_of(item.token, job, (Status.completed,)), job, False))
    for n in recheck:
        job = await job_get(conn, items[n].id, items[n].allowed)
        out[n] = Done(outcome_of(items[n].token, job, (Status.completed,)), job, False)
    return out


def _written_one(written: str) -> str:
    """The tail of a single-job write: (0, true, row as written), else (0, false, row as found)."""
    return f"""
SELECT 0 AS ord, true AS written, * FROM {written}
UNION ALL
-- Else the row as found (to tell why not); a job outside the caller's queues is not found.
SELECT 0, false, {JOB_COLUMNS} FROM jobq.jobs j
WHERE j.id = %(id)s AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  AND NOT EXISTS (SELECT FROM {written})
"""


JOB_FAIL = f"""
WITH failed AS (
  UPDATE jobq.jobs AS j
  SET status = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
      -- Retry later: the caller's delay, else exponential backoff with "equal jitter" (half fixed,
      -- half random) so that jobs failed together do not come back together; the queue's backoff
      -- settings (queue_state, one lookup by key) else the global ones.
      run_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts
                    THEN clock_timestamp() + make_interval(secs => coalesce(%(retry_in)s::float8,
                         least(coalesce((SELECT backoff_max_seconds FROM jobq.queue_state
                                         WHERE queue_name = j.queue_name),
                                        %(cap)s::float8),
                               coalesce((SELECT backoff_base_seconds FROM jobq.queue_state
                                         WHERE queue_name = j.queue_name),
                                        %(base)s::float8) * power(2, least(j.attempts - 1, 60)))
                         * (0.5 + random() / 2)))
                    ELSE j.run_at END,
      finished_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN NULL ELSE clock_timestamp() END,
      lease_expires_at = NULL,
      last_error = %(error)s
  WHERE j.id = %(id)s AND j.status = {RUNNING} AND j.claim_token = %(token)s
    AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  RETURNING {JOB_COLUMNS}
), counted AS ({count_finished("failed")}
), recorded AS ({record_finished("failed")}
)
{_written_one("failed")}
"""


async def job_fail(
    conn: psycopg.AsyncConnection[Any],
    job_id: int,
    token: str,
    error: str,
    *,
    allowed: str | None = None,
    retry: bool,
    retry_in: float | None,
    backoff_base: float,
    backoff_cap: float,
) -> Done:
    """Record a failed attempt: back to pending with a later run_at, or failed when no attempt is left
    or retry is false. A retried fail with the same token is "ok" and changes nothing."""
    params = {
        "id": job_id,
        "token": token,
        "error": error,
        "allowed": allowed,
        "retry": retry,
        "retry_in": retry_in,
        "base": backoff_base,
        "cap": backoff_cap,
    }
    return await _guarded_write(conn, JOB_FAIL, params, (Status.pending, Status.failed))


JOB_RELEASE_CLAIM = f"""
WITH released AS (
  -- A worker hands back a job it did not try (shutting down, lacking a resource). Guarded like fail:
  -- id + token + running + the caller's queues. The claim counted an attempt; untried, it is given
  -- back, so the attempt budget and last_error stay as they were. The token, lease and claimed_at go
  -- with the claim: a repeated release finds no claim (409), as would any other write with it.
  UPDATE jobq.jobs AS j
  SET status = 'pending', attempts = j.attempts - 1,
      run_at = clock_timestamp() + make_interval(secs => %(delay)s::float8),
      claimed_at = NULL, lease_expires_at = NULL, claim_token = NULL
  WHERE j.id = %(id)s AND j.status = {RUNNING} AND j.claim_token = %(token)s
    AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  RETURNING {JOB_COLUMNS}
)
{_written_one("released")}
"""


async def job_release_claim(
    conn: psycopg.AsyncConnection[Any], job_id: int, token: str, delay: float, allowed: str | None = None
) -> Done:
    """Hand a claimed job back to pending, due after `delay` seconds, without counting the attempt.
    Unlike complete and fail, a repeat is not "ok": the token is gone with the claim (claim_lost).
    (JOB_RELEASE above is the server's own hand-back of claims it could not deliver.)"""
    params = {"id": job_id, "token": token, "delay": delay, "allowed": allowed}
    return await _guarded_write(conn, JOB_RELEASE_CLAIM, params, ())


async def _guarded_write(
    conn: psycopg.AsyncConnection[Any], query: str, params: dict[str, Any], done: tuple[str, ...]
) -> Done:
    """Run a guarded write on one job (id + token + running + the caller's queues) whose SQL answers
    Written(written=True, row) when it wrote, else (False, row as found), and tell why it did not write.
    `done`: the statuses in which a repeat with the same token is a success (see _outcome)."""
    cur = conn.cursor(row_factory=outcome_rows(Written, JobRow))
    await cur.execute(query, params)
    row = await cur.fetchone()
    if row is None or row.job is None:
        return Done("not_found", None, False)
    if row.written:
        return Done("ok", row.job, True)
    job: JobRow | None = row.job
    if row.job.status == Status.running and row.job.claim_token == params["token"]:
        job = await job_get(conn, params["id"], params["allowed"])  # finished concurrently: look again
    return Done(outcome_of(params["token"], job, done), job, False)
