"""A worker's writes on the job it holds (heartbeat, complete, fail, release) and the server's hand-back.

Each statement is about one queue (`%(queue)s`), named on every reference to `jobs` and the tables co-located
with it, so that on Citus it runs on the one shard holding that queue as one task (docs/scale-out.md); on plain
PostgreSQL the extra predicate costs nothing (the job is found by its id as before). The queue comes from the
claim token (app/db/tokens.py): a call whose items name several queues runs one statement per queue, and a
token from before 1.2.0, which names none, is routed by the job's id first (one lookup for all such items).

Citus refuses, in an UPDATE's SET and WHERE, a VOLATILE function (clock_timestamp(), random()) and a STABLE
one applied to a column (timestamptz + interval): the clock is read once in a CTE (`stamp`), and a time
that depends on a column is made with to_timestamp(float8), which is IMMUTABLE: `to_timestamp(epoch + secs)`
is `clock + make_interval(secs => secs)` to the microsecond."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple, TypeVar

import psycopg
from orjson import Fragment

from app.db import finishing, tokens
from app.db.jobs import JOB_COLUMNS, RUNNING, as_json, count_finished, job_columns, job_get, record_finished
from app.db.rows import FINISHED, Beat, ClaimRow, JobRow, Status, Written, outcome_rows, rows_of
from app.db.scope import queue_allowed


def _fragment(text: str | None) -> Fragment | None:
    return Fragment(text) if text is not None else None


# --- routing ----------------------------------------------------------------------------------------------------

# The clock, read once per statement in a CTE: as a timestamp, and as seconds since the Unix epoch for the times
# that add a column's seconds to it (to_timestamp(epoch + secs): see above).
STAMP = "SELECT c.now, extract(epoch FROM c.now) AS epoch FROM (SELECT clock_timestamp() AS now) c"

# The queues of jobs known by id alone (tokens from before 1.2.0, which name no queue), in one statement: the
# primary key on plain PostgreSQL; on Citus a read of every shard, once per call that carries such tokens.
JOB_QUEUES = "SELECT id, queue_name FROM jobq.jobs WHERE id = ANY(%(ids)s)"

# What an UPDATE returns: the row, as the statement's tail turns it into a JobRow (job_columns), and its queue as
# count_finished and record_finished read it. Not job_columns itself: Citus allows only IMMUTABLE functions in
# RETURNING, and job_columns builds JSON and adds intervals to times (STABLE).
RETURNED = "j.*, j.queue_name AS queue"


def _side(source: str, status: str = "status") -> str:
    """The CTEs of a finishing statement that count and record the jobs it finished (plain PostgreSQL)."""
    return f""", counted AS ({count_finished(source, status)}
), recorded AS ({record_finished(source)}
)"""


T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True, frozen=True)
class Routed:
    """Where each item of a call goes: its queue (None: a job known by id alone that does not exist), and
    whether the queue came from the token (then a miss is looked up by id: a token edited to name another
    queue is a wrong token like any other, not a missing job)."""

    queues: list[str | None]
    from_token: list[bool]


async def route(conn: psycopg.AsyncConnection[Any], refs: Sequence[tuple[int, str]]) -> Routed:
    """The queue of each (job id, claim token): the token's, else the job's, looked up by id in one statement
    for all of them."""
    queues = [tokens.queue_of(token) for _, token in refs]
    legacy = sorted({job_id for (job_id, _), q in zip(refs, queues, strict=True) if q is None})
    from_token = [q is not None for q in queues]
    if legacy:
        if len(legacy) == 1:
            found = {legacy[0]: await tokens.queue_of_job(conn, legacy[0])}
        else:
            cur = await conn.execute(JOB_QUEUES, {"ids": legacy})
            found = {int(i): str(q) for i, q in await cur.fetchall()}
        queues = [q if q is not None else found.get(job_id) for (job_id, _), q in zip(refs, queues, strict=True)]
    return Routed(queues, from_token)


async def per_queue(
    items: Sequence[T], queues: Sequence[str | None], run: Callable[[str, list[T]], Awaitable[list[R]]]
) -> list[R | None]:
    """`run` once per queue (in the order the queues first occur) on that queue's items, in their order; the
    answers in the items' order, None for an item with no queue (run for none)."""
    groups: dict[str, list[int]] = {}
    for n, queue in enumerate(queues):
        if queue is not None:
            groups.setdefault(queue, []).append(n)
    out: list[R | None] = [None] * len(items)
    for queue, where in groups.items():
        for n, answer in zip(where, await run(queue, [items[n] for n in where]), strict=True):
            out[n] = answer
    return out


# --- claims handed back ---------------------------------------------------------------------------------------

JOB_RELEASE = f"""
-- Claimed for a request that went away before it could be answered (timeout, disconnect, shutdown):
-- hand the job straight back. The attempt is returned too, since no worker ever saw the job. One queue's claims.
WITH r AS (SELECT * FROM json_to_recordset(%(claims)s::json) AS r(id bigint, token text))
UPDATE jobq.jobs AS j
SET status = 'pending', attempts = j.attempts - 1, lease_expires_at = NULL, claim_token = NULL
FROM r
WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM r)) AND j.id = r.id AND j.claim_token = r.token
  AND j.status = {RUNNING}
"""


async def jobs_release(conn: psycopg.AsyncConnection[Any], rows: Sequence[ClaimRow]) -> None:
    """Hand back claims the server could not deliver: one statement per queue (a claim is of one queue)."""
    by_queue: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_queue.setdefault(r.queue, []).append({"id": r.id, "token": r.claim_token})
    for queue, claims in by_queue.items():
        await conn.execute(JOB_RELEASE, {"queue": queue, "claims": as_json(claims)})


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
), stamp AS ({STAMP}
), renewed AS (
  -- Guarded by id + token + running (a stale claim renews nothing) + the caller's queues. A beat that
  -- carries progress replaces the job's (JSON null clears it); one without leaves it as it is. Beats of
  -- one claim that share this statement write once, through the one that `writes` (see jobs_heartbeat).
  UPDATE jobq.jobs AS j
  SET lease_expires_at = to_timestamp(st.epoch + coalesce(i.lease, j.lease_seconds)),
      lease_seconds = coalesce(i.lease, j.lease_seconds),
      progress = CASE WHEN i.set_progress THEN i.progress::jsonb ELSE j.progress END
  FROM input i, stamp st
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id AND i.writes
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
  WHERE j.queue_name = %(queue)s AND j.id = i.id AND {queue_allowed("j.queue_name", "i.allowed")}
  OFFSET 0
) c ON r.id IS NULL
ORDER BY i.ord
"""


class Heartbeat(NamedTuple):
    id: int
    token: str
    lease_seconds: int | None
    allowed: str | None = None  # the caller's queue regex; None: every queue
    progress: str | None = None  # JSON text; stored only when set_progress (None then: clear it)
    set_progress: bool = False


class Renewed(NamedTuple):
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
    routed = await route(conn, [(b.id, b.token) for b in beats])

    async def run(queue: str, items: list[dict[str, Any]]) -> list[Beat]:
        cur = conn.cursor(row_factory=rows_of(Beat))
        await cur.execute(JOB_HEARTBEAT_MANY, {"queue": queue, "beats": as_json(items)})
        return await cur.fetchall()

    out: list[Renewed] = []
    rows = await per_queue(doc, routed.queues, run)
    for beat, row, from_token in zip(beats, rows, routed.from_token, strict=True):
        if row is None:
            out.append(Renewed("not_found", None))  # known by id alone, and no such job
        elif row.lease_expires_at is not None:
            out.append(Renewed("ok", row.lease_expires_at, row.worker, row.queue))
        elif (row.status == Status.running and row.claim_token == beat.token) or (row.status is None and from_token):
            # Changed by a concurrent statement after our snapshot (a cancel, the sweeper, a complete), or not
            # in the queue the token names (a token edited: the job's own tells why not): look again, so that
            # a cancel is reported as such and not as a lost claim.
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
SELECT i.ord, true AS written, {job_columns(full)} FROM input i JOIN {done} j ON j.id = i.id AND j.claim_token = i.token
UNION ALL
SELECT i.ord, false, c.*
FROM input i
LEFT JOIN LATERAL (
  SELECT {job_columns(full)} FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.id = i.id AND {queue_allowed("j.queue_name", "i.allowed")}
  OFFSET 0
) c ON true
WHERE NOT EXISTS (SELECT FROM {done} d WHERE d.id = i.id AND d.claim_token = i.token)
ORDER BY 1
"""


def _job_complete_many(side: str) -> str:
    """`side`: the CTEs that count and record what the statement finished (empty on Citus: see
    app/db/finishing.py)."""
    return f"""
WITH input AS (
  SELECT * FROM json_to_recordset(%(items)s::json)
    AS t(ord int, id bigint, token text, result jsonb, allowed text)
), stamp AS ({STAMP}
), done AS (
  UPDATE jobq.jobs AS j
  SET status = 'completed', finished_at = st.now, lease_expires_at = NULL, result = i.result
  -- The same job and token twice in one statement (a retry coalesced with its original): the first
  -- item's result is kept, as for a retry that comes later.
  FROM (SELECT DISTINCT ON (id, token) * FROM input ORDER BY id, token, ord) i, stamp st
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id
    AND j.status = {RUNNING} AND j.claim_token = i.token AND {queue_allowed("j.queue_name", "i.allowed")}
  RETURNING {RETURNED}
){side}
{_written_many("done", "%(full)s")}
"""


JOB_COMPLETE_MANY = _job_complete_many(_side("done", "'completed'"))
# On Citus: the finished-job counter and the outbox written by statements of their own (app/db/finishing.py).
JOB_COMPLETE_MANY_CITUS = _job_complete_many("")


class Completion(NamedTuple):
    id: int
    token: str
    result: str | None  # serialised JSON
    allowed: str | None = None  # the caller's queue regex; None: every queue


class Done(NamedTuple):
    outcome: Outcome
    job: JobRow | None  # the job's row (None: not found)
    changed: bool  # whether this call changed it


async def jobs_complete(
    conn: psycopg.AsyncConnection[Any], items: Sequence[Completion], *, full: bool = True
) -> list[Done]:
    """Complete jobs in one statement per queue. A retried complete with the token that completed the job is "ok"
    (the first result is kept). With full=False rows carry no payload/result (batch answers)."""
    doc = [
        {"ord": n, "id": c.id, "token": c.token, "result": _fragment(c.result), "allowed": c.allowed}
        for n, c in enumerate(items)
    ]
    routed = await route(conn, [(c.id, c.token) for c in items])

    citus = finishing.on_citus(conn)

    async def run(queue: str, part: list[dict[str, Any]]) -> list[Written]:
        cur = conn.cursor(row_factory=outcome_rows(Written, JobRow))
        params = {"queue": queue, "items": as_json(part), "full": full}
        if not citus:
            await cur.execute(JOB_COMPLETE_MANY, params)
            return await cur.fetchall()
        async with conn.transaction():
            await cur.execute(JOB_COMPLETE_MANY_CITUS, params)
            rows = await cur.fetchall()
            await _finished(conn, queue, [r.job for r in rows if r.written])
        return rows

    out: list[Done] = []
    recheck = []
    changed: set[int] = set()
    rows = await per_queue(doc, routed.queues, run)
    for n, (item, row, from_token) in enumerate(zip(items, rows, routed.from_token, strict=True)):
        if row is None:
            out.append(Done("not_found", None, False))  # known by id alone, and no such job
            continue
        if row.written:
            # The same job twice in this statement was completed once: only its first item changed it.
            out.append(Done("ok", row.job, item.id not in changed))
            changed.add(item.id)
            continue
        job = row.job
        if job is None and from_token:
            recheck.append(n)  # not in the queue its token names (a token edited): the job's own tells why not
        elif job is not None and job.status == Status.running and job.claim_token == item.token:
            recheck.append(n)  # a concurrent statement finished it after our snapshot: look again
        out.append(Done(outcome_of(item.token, job, (Status.completed,)), job, False))
    for n in recheck:
        job = await job_get(conn, items[n].id, items[n].allowed)
        out[n] = Done(outcome_of(items[n].token, job, (Status.completed,)), job, False)
    return out


def _written_one(written: str) -> str:
    """The tail of a single-job write: (0, true, row as written), else (0, false, row as found)."""
    return f"""
SELECT 0 AS ord, true AS written, {JOB_COLUMNS} FROM {written} j
UNION ALL
-- Else the row as found (to tell why not); a job outside the caller's queues is not found.
SELECT 0, false, {JOB_COLUMNS} FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  AND NOT EXISTS (SELECT FROM {written})
"""


def _job_fail(side: str) -> str:
    return f"""
WITH stamp AS (
  -- The clock, a random draw, and the queue's backoff settings (queue_state, one lookup by key) else the
  -- global ones.
  SELECT c.now, extract(epoch FROM c.now) AS epoch, random() AS draw,
         coalesce((SELECT backoff_max_seconds FROM jobq.queue_state WHERE queue_name = %(queue)s),
                  %(cap)s::float8) AS cap,
         coalesce((SELECT backoff_base_seconds FROM jobq.queue_state WHERE queue_name = %(queue)s),
                  %(base)s::float8) AS base
  FROM (SELECT clock_timestamp() AS now) c
), failed AS (
  UPDATE jobq.jobs AS j
  SET status = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
      -- Retry later: the caller's delay, else exponential backoff with "equal jitter" (half fixed,
      -- half random) so that jobs failed together do not come back together.
      run_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts
                    THEN to_timestamp(st.epoch + coalesce(%(retry_in)s::float8,
                         least(st.cap, st.base * power(2, least(j.attempts - 1, 60))) * (0.5 + st.draw / 2)))
                    ELSE j.run_at END,
      finished_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN NULL ELSE st.now END,
      lease_expires_at = NULL,
      last_error = %(error)s
  FROM stamp st
  WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND j.status = {RUNNING} AND j.claim_token = %(token)s
    AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  RETURNING {RETURNED}
){side}
{_written_one("failed")}
"""


JOB_FAIL = _job_fail(_side("failed"))
JOB_FAIL_CITUS = _job_fail("")  # as JOB_COMPLETE_MANY_CITUS


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
WITH stamp AS (SELECT clock_timestamp() + make_interval(secs => %(delay)s::float8) AS run_at
), released AS (
  -- A worker hands back a job it did not try (shutting down, lacking a resource). Guarded like fail:
  -- id + token + running + the caller's queues. The claim counted an attempt; untried, it is given
  -- back, so the attempt budget and last_error stay as they were. The token, lease and claimed_at go
  -- with the claim: a repeated release finds no claim (409), as would any other write with it.
  UPDATE jobq.jobs AS j
  SET status = 'pending', attempts = j.attempts - 1,
      run_at = st.run_at, claimed_at = NULL, lease_expires_at = NULL, claim_token = NULL
  FROM stamp st
  WHERE j.queue_name = %(queue)s AND j.id = %(id)s AND j.status = {RUNNING} AND j.claim_token = %(token)s
    AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  RETURNING {RETURNED}
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


# The statements whose Citus form leaves the counter and the record to _finished.
CITUS_FORMS = {JOB_FAIL: JOB_FAIL_CITUS}


async def _finished(conn: psycopg.AsyncConnection[Any], queue: str, jobs: Sequence[JobRow | None]) -> None:
    """On Citus, in the finishing statement's transaction: what its plain form's CTEs write (count_finished,
    record_finished) for the jobs of `queue` it wrote, once each; those it finished are counted by status."""
    seen: dict[int, JobRow] = {j.id: j for j in jobs if j is not None and j.status in FINISHED}
    by_status: dict[str, int] = {}
    for j in seen.values():
        by_status[str(j.status)] = by_status.get(str(j.status), 0) + 1
    for status, n in sorted(by_status.items()):
        await finishing.counts_add(conn, queue, status, n)
    await finishing.releases_written(
        conn, queue, [(i, str(j.status)) for i, j in sorted(seen.items()) if j.has_dependants]
    )


async def _guarded_write(
    conn: psycopg.AsyncConnection[Any], query: str, params: dict[str, Any], done: tuple[str, ...]
) -> Done:
    """Run a guarded write on one job (id + token + running + the caller's queues) whose SQL answers
    Written(written=True, row) when it wrote, else (False, row as found), and tell why it did not write.
    `done`: the statuses in which a repeat with the same token is a success (see _outcome). Routed to the
    queue its token names, else (a token from before 1.2.0) to the job's."""
    routed = await route(conn, [(params["id"], params["token"])])
    queue = routed.queues[0]
    if queue is None:
        return Done("not_found", None, False)  # known by id alone, and no such job
    cur = conn.cursor(row_factory=outcome_rows(Written, JobRow))
    citus = CITUS_FORMS.get(query) if finishing.on_citus(conn) else None
    if citus is None:
        await cur.execute(query, {**params, "queue": queue})
        row = await cur.fetchone()
    else:
        async with conn.transaction():
            await cur.execute(citus, {**params, "queue": queue})
            row = await cur.fetchone()
            await _finished(conn, queue, [row.job] if row is not None and row.written else [])
    job: JobRow | None = None if row is None else row.job
    if row is not None and row.written:
        return Done("ok", job, True)
    if job is None and routed.from_token[0]:
        # Not in the queue its token names (a token edited to name another): the job's own row tells why not.
        job = await job_get(conn, params["id"], params["allowed"])
    elif job is not None and job.status == Status.running and job.claim_token == params["token"]:
        job = await job_get(conn, params["id"], params["allowed"])  # finished concurrently: look again
    if job is None:
        return Done("not_found", None, False)
    return Done(outcome_of(params["token"], job, done), job, False)
