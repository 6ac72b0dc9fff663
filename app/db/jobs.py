"""All SQL on the jobs table and the mapping of its rows. Every statement runs in autocommit: one
statement, one short transaction, no lock held across a round trip to a client.

Statements take a batch (a JSON document unpacked by json_to_recordset) so that concurrent requests can
share one statement and one commit (see app/core/coalesce.py); a single request is the batch-of-one case."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson
import psycopg
from orjson import Fragment

Row = tuple[Any, ...]


def _job_columns(with_payload: str = "true") -> str:
    return (
        "j.id, j.queue_name, j.status, "
        f"CASE WHEN {with_payload} THEN j.payload::text END, "
        "j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, "
        "j.lease_expires_at, j.finished_at, j.locked_by, j.last_error, "
        f"CASE WHEN {with_payload} THEN j.result::text END, j.idempotency_key, j.claim_token"
    )


JOB_COLUMNS = _job_columns()
_ID, _QUEUE, _STATUS, _PAYLOAD = 0, 1, 2, 3
_KEY, _TOKEN = 15, 16
JOB_WIDTH = 17


def count_finished(source: str, status: str = "status", delta: str = "1") -> str:
    """A data-modifying CTE body that adds `delta` to the finished-job counter of each (queue, status)
    row of `source`, in the same statement as the transition, so the counts never drift. Each backend
    writes its own shard (backend pid mod 64): concurrent statements do not queue on one row."""
    return f"""
  INSERT INTO queue_counts AS c (queue_name, status, shard, n)
  SELECT queue_name, {status}, mod(pg_backend_pid(), 64), sum({delta})
  FROM {source}
  WHERE {status} IN ('completed', 'failed', 'cancelled')
  GROUP BY 1, 2
  ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n"""


def as_json(doc: Any) -> str:
    """A batch parameter: one JSON document that the SQL unpacks with json_to_recordset. Far cheaper than
    arrays here: psycopg dumps text arrays in Python, element by element; orjson does this in C, and
    payloads already serialised go in as fragments, not as escaped strings."""
    return orjson.dumps(doc).decode()


def job_doc(row: Row) -> dict[str, Any]:
    """A jobs row (JOB_COLUMNS order) as the API's Job object. jsonb columns arrive as text and are
    passed through as JSON fragments: no parse and re-serialise of payloads on the way out.
    The claim token is never part of it."""
    return {
        "id": row[0],
        "queue": row[1],
        "status": row[2],
        "payload": Fragment(row[3]) if row[3] is not None else None,
        "priority": row[4],
        "attempts": row[5],
        "max_attempts": row[6],
        "run_at": row[7],
        "created_at": row[8],
        "claimed_at": row[9],
        "lease_expires_at": row[10],
        "finished_at": row[11],
        "worker": row[12],
        "last_error": row[13],
        "result": Fragment(row[14]) if row[14] is not None else None,
        "idempotency_key": row[15],
    }


# Object-level authorisation: statements addressed by job id take `allowed`, the caller's anchored regex
# over queue names (NULL: every queue), and treat a job in another queue exactly like a missing one, in
# the same statement (no read before the write). See app/auth/policy.py.

# --- get ----------------------------------------------------------------------------------------------------

JOB_GET = f"""
SELECT {JOB_COLUMNS} FROM jobs j
WHERE j.id = %(id)s AND (%(allowed)s::text IS NULL OR j.queue_name ~ %(allowed)s::text)
"""


async def job_get(conn: psycopg.AsyncConnection[Any], job_id: int, allowed: str | None = None) -> Row | None:
    cur = await conn.execute(JOB_GET, {"id": job_id, "allowed": allowed})
    return await cur.fetchone()


# --- enqueue ------------------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class NewJob:
    queue: str
    payload: str  # serialised JSON
    priority: int
    run_at: datetime | None
    delay_seconds: float | None
    max_attempts: int
    idempotency_key: str | None


JOB_INSERT_MANY = f"""
WITH input AS (
  -- Ids are drawn in the input's order (a volatile select-list expression is evaluated after the
  -- ORDER BY): that is how rows without a key are matched back to their input, and ids are the last
  -- tie-break of claim order, so a batch keeps its order.
  SELECT t.*, nextval(pg_get_serial_sequence('jobs', 'id')) AS id
  FROM json_to_recordset(%(batch)s::json)
    AS t(ord int, queue_name text, payload jsonb, priority int, run_at timestamptz, delay float8,
         max_attempts int, idempotency_key text)
  ORDER BY ord
)
INSERT INTO jobs AS j (id, queue_name, payload, priority, run_at, max_attempts, idempotency_key)
OVERRIDING SYSTEM VALUE
SELECT id, queue_name, coalesce(payload, 'null'), priority,  -- json_to_recordset reads JSON null as NULL
       coalesce(run_at, now() + make_interval(secs => coalesce(delay, 0))),
       max_attempts, idempotency_key
FROM input
-- Rows are inserted in key order, not input order: every statement then takes the keys it waits on
-- (a key inserted by a transaction still in flight) in one global order, so two batches holding the
-- same keys in different orders cannot wait on each other in a cycle (a deadlock: one would fail).
-- The first occurrence of a key twice in the input still wins (ord breaks the tie).
ORDER BY queue_name COLLATE "C", idempotency_key COLLATE "C", ord
-- A key already taken on this queue: insert nothing, the caller fetches the existing job.
ON CONFLICT (queue_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {JOB_COLUMNS}
"""

JOB_GET_BY_KEYS = f"""
SELECT {JOB_COLUMNS}
FROM jobs j
JOIN json_to_recordset(%(keys)s::json) AS k(queue_name text, idempotency_key text)
  ON j.queue_name = k.queue_name AND j.idempotency_key = k.idempotency_key
"""


async def jobs_insert(conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob]) -> list[tuple[bool, Row]]:
    """Insert jobs in one statement; per input, (created, row). A job whose idempotency key is already
    used on its queue comes back as (False, existing row), also when the same key occurs twice here."""
    out: list[tuple[bool, Row] | None] = [None] * len(jobs)
    todo = list(range(len(jobs)))
    for _ in range(3):  # a conflicting row deleted between INSERT and SELECT (retention): rare, go again
        todo = await _insert_round(conn, jobs, todo, out)
        if not todo:
            return [o for o in out if o is not None]
    raise RuntimeError("idempotency key kept vanishing between insert and lookup")


async def _insert_round(
    conn: psycopg.AsyncConnection[Any],
    jobs: Sequence[NewJob],
    todo: list[int],
    out: list[tuple[bool, Row] | None],
) -> list[int]:
    """Insert jobs[todo], fill `out`; returns the indexes still without a row."""
    batch = [
        {
            "ord": n,
            "queue_name": j.queue,
            "payload": Fragment(j.payload),
            "priority": j.priority,
            "run_at": j.run_at,
            "delay": j.delay_seconds,
            "max_attempts": j.max_attempts,
            "idempotency_key": j.idempotency_key,
        }
        for n, j in enumerate(jobs[i] for i in todo)
    ]
    cur = await conn.execute(JOB_INSERT_MANY, {"batch": as_json(batch)})
    rows = await cur.fetchall()
    keyed = {(r[_QUEUE], r[_KEY]): r for r in rows if r[_KEY] is not None}
    unkeyed = iter(sorted((r for r in rows if r[_KEY] is None), key=lambda r: r[_ID]))
    taken = []
    for i in todo:
        job = jobs[i]
        if job.idempotency_key is None:
            out[i] = (True, next(unkeyed))
        elif (row := keyed.pop((job.queue, job.idempotency_key), None)) is not None:
            out[i] = (True, row)
        else:
            taken.append(i)
    if not taken:
        return []
    keys = [{"queue_name": jobs[i].queue, "idempotency_key": jobs[i].idempotency_key} for i in taken]
    cur = await conn.execute(JOB_GET_BY_KEYS, {"keys": as_json(keys)})
    existing = {(r[_QUEUE], r[_KEY]): r for r in await cur.fetchall()}
    left = []
    for i in taken:
        row = existing.get((jobs[i].queue, jobs[i].idempotency_key))
        if row is None:
            left.append(i)
        else:
            out[i] = (False, row)
    return left


# --- claim --------------------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ClaimSlot:
    """One claim request inside a shared claim statement."""

    worker: str
    lease_seconds: int
    limit: int


JOB_CLAIM = """
WITH candidates AS (
  -- The article's claim: the literal 'pending' matches jobs_claim_idx's predicate and the ORDER BY
  -- its key order. Locked rows are skipped, not waited for. Pending jobs always have an attempt left
  -- (CHECK jobs_pending_shape), so no attempts filter is needed. A paused queue yields nothing.
  SELECT id, priority, run_at
  FROM jobs
  WHERE queue_name = %(queue)s
    AND status = 'pending'
    AND run_at <= clock_timestamp()
    AND NOT EXISTS (SELECT FROM queue_state WHERE queue_name = %(queue)s AND paused)
  ORDER BY priority DESC, run_at, id
  LIMIT %(total)s
  FOR UPDATE SKIP LOCKED
), ranked AS (
  SELECT id, row_number() OVER (ORDER BY priority DESC, run_at, id) AS rn FROM candidates
), slots AS (
  -- One slot per job a request may receive, oldest request first: slot k gets the k-th best job.
  SELECT row_number() OVER (ORDER BY r.ord, g) AS rn, r.ord, r.worker, r.lease
  FROM json_to_recordset(%(slots)s::json) AS r(ord int, worker text, lease int, lim int)
  CROSS JOIN LATERAL generate_series(1, r.lim) AS g
), claimed AS (
  UPDATE jobs AS j
  SET status = 'running',
      attempts = j.attempts + 1,
      -- One reading of the clock for the claim and its lease, so the lease is exactly what was asked.
      claimed_at = stamp.now,
      lease_seconds = s.lease,
      lease_expires_at = stamp.now + make_interval(secs => s.lease),
      locked_by = s.worker,
      -- 244 random bits from the server's strong RNG, URL-safe; only rows actually claimed pay for one.
      claim_token = rtrim(translate(encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()),
                                           'base64'), '+/', '-_'), '=')
  FROM ranked
  JOIN slots s USING (rn)
  CROSS JOIN (SELECT clock_timestamp() AS now) AS stamp
  WHERE j.id = ranked.id
  RETURNING s.ord, ranked.rn, j.id, j.queue_name, j.payload::text, j.priority, j.attempts, j.max_attempts,
            j.claim_token, j.lease_expires_at, j.run_at, j.created_at
)
SELECT * FROM claimed
UNION ALL
-- Nothing claimed: one marker row telling whether ready jobs existed anyway (all locked by other
-- claims, or the queue paused): the "empty claims while ready jobs exist" signal of the article.
SELECT -1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE NOT EXISTS (SELECT FROM claimed)
  AND EXISTS (SELECT FROM jobs WHERE queue_name = %(queue)s AND status = 'pending' AND run_at <= clock_timestamp())
"""


@dataclass(slots=True)
class ClaimResult:
    rows: list[list[Row]]  # per request, best job first
    ready_left_behind: bool  # nothing was claimed although ready jobs existed


async def jobs_claim(conn: psycopg.AsyncConnection[Any], queue: str, slots: Sequence[ClaimSlot]) -> ClaimResult:
    """Claim jobs for several requests in one statement; returns each request's rows, best job first."""
    doc = [{"ord": n, "worker": s.worker, "lease": s.lease_seconds, "lim": s.limit} for n, s in enumerate(slots)]
    cur = await conn.execute(JOB_CLAIM, {"queue": queue, "total": sum(s.limit for s in slots), "slots": as_json(doc)})
    per_slot: list[list[Row]] = [[] for _ in slots]
    rows = await cur.fetchall()
    if len(rows) == 1 and rows[0][0] == -1:
        return ClaimResult(per_slot, ready_left_behind=True)
    for row in sorted(rows, key=lambda r: r[1]):
        per_slot[row[0]].append(row[2:])
    return ClaimResult(per_slot, ready_left_behind=False)


def claim_doc(row: Row) -> dict[str, Any]:
    return {
        "id": row[0],
        "queue": row[1],
        "payload": Fragment(row[2]),
        "priority": row[3],
        "attempts": row[4],
        "max_attempts": row[5],
        "claim_token": row[6],
        "lease_expires_at": row[7],
        "run_at": row[8],
        "created_at": row[9],
    }


JOB_RELEASE = """
-- Claimed for a request that went away before it could be answered (timeout, disconnect, shutdown):
-- hand the job straight back. The attempt is returned too, since no worker ever saw the job.
UPDATE jobs AS j
SET status = 'pending', attempts = j.attempts - 1, lease_expires_at = NULL, claim_token = NULL
FROM json_to_recordset(%(claims)s::json) AS r(id bigint, token text)
WHERE j.id = r.id AND j.claim_token = r.token AND j.status = 'running'
"""


async def jobs_release(conn: psycopg.AsyncConnection[Any], rows: Sequence[Row]) -> None:
    await conn.execute(JOB_RELEASE, {"claims": as_json([{"id": r[0], "token": r[6]} for r in rows])})


# --- heartbeat, complete, fail ------------------------------------------------------------------------------

Outcome = Literal["ok", "claim_lost", "not_found", "cancelled"]


def _outcome(token: str, status: str | None, held_by: str | None, done: tuple[str, ...]) -> Outcome:
    """Why a guarded write matched nothing, from the row as it was: gone, already done with this very
    token (a retried call: success), cancelled by an operator while this claim held it, or held by
    another claim."""
    if status is None:
        return "not_found"
    if held_by == token and status in done:
        return "ok"
    if held_by == token and status == "cancelled":
        return "cancelled"
    return "claim_lost"


def _job_outcome(token: str, job: Row | None, done: tuple[str, ...]) -> Outcome:
    return _outcome(token, job[_STATUS] if job else None, job[_TOKEN] if job else None, done)


JOB_HEARTBEAT_MANY = """
WITH input AS (
  SELECT * FROM json_to_recordset(%(beats)s::json) AS t(ord int, id bigint, token text, lease int, allowed text)
), renewed AS (
  -- Guarded by id + token + running (a stale claim renews nothing) + the caller's queues.
  UPDATE jobs AS j
  SET lease_expires_at = clock_timestamp() + make_interval(secs => coalesce(i.lease, j.lease_seconds)),
      lease_seconds = coalesce(i.lease, j.lease_seconds)
  FROM input i
  WHERE j.id = i.id AND j.status = 'running' AND j.claim_token = i.token
    AND (i.allowed IS NULL OR j.queue_name ~ i.allowed)
  RETURNING j.id, j.claim_token, j.lease_expires_at
)
-- Per input: the new expiry, else the job's state as this statement found it (to tell why not); a job
-- outside the caller's queues is not found.
SELECT i.ord, r.lease_expires_at, c.status, c.claim_token
FROM input i
LEFT JOIN renewed r ON r.id = i.id AND r.claim_token = i.token
LEFT JOIN LATERAL (
  SELECT status, claim_token FROM jobs j
  WHERE j.id = i.id AND (i.allowed IS NULL OR j.queue_name ~ i.allowed)
) c ON r.id IS NULL
ORDER BY i.ord
"""


@dataclass(slots=True, frozen=True)
class Heartbeat:
    id: int
    token: str
    lease_seconds: int | None
    allowed: str | None = None  # the caller's queue regex; None: every queue


async def jobs_heartbeat(
    conn: psycopg.AsyncConnection[Any], beats: Sequence[Heartbeat]
) -> list[tuple[Outcome, datetime | None]]:
    doc = [
        {"ord": n, "id": b.id, "token": b.token, "lease": b.lease_seconds, "allowed": b.allowed}
        for n, b in enumerate(beats)
    ]
    cur = await conn.execute(JOB_HEARTBEAT_MANY, {"beats": as_json(doc)})
    out: list[tuple[Outcome, datetime | None]] = []
    for beat, row in zip(beats, await cur.fetchall(), strict=True):
        if row[1] is not None:
            out.append(("ok", row[1]))
        elif row[2] == "running" and row[3] == beat.token:
            # Changed by a concurrent statement after our snapshot (a cancel, the sweeper, a complete):
            # look again, so that a cancel is reported as such and not as a lost claim.
            job = await job_get(conn, beat.id, beat.allowed)
            out.append((_job_outcome(beat.token, job, ()), None))
        else:
            out.append((_outcome(beat.token, row[2], row[3], ()), None))
    return out


JOB_COMPLETE_MANY = f"""
WITH input AS (
  SELECT * FROM json_to_recordset(%(items)s::json)
    AS t(ord int, id bigint, token text, result jsonb, allowed text)
), done AS (
  UPDATE jobs AS j
  SET status = 'completed', finished_at = clock_timestamp(), lease_expires_at = NULL,
      result = i.result
  -- The same job and token twice in one statement (a retry coalesced with its original): the first
  -- item's result is kept, as for a retry that comes later.
  FROM (SELECT DISTINCT ON (id, token) * FROM input ORDER BY id, token, ord) i
  WHERE j.id = i.id AND j.status = 'running' AND j.claim_token = i.token
    AND (i.allowed IS NULL OR j.queue_name ~ i.allowed)
  RETURNING {_job_columns("%(full)s")}
), counted AS ({count_finished("done", "'completed'")}
)
-- Per input: the completed row, else the row as this statement found it (to tell why not); a job
-- outside the caller's queues is not found.
SELECT i.ord, d.*, c.*
FROM input i
LEFT JOIN done d ON d.id = i.id AND d.claim_token = i.token
LEFT JOIN LATERAL (
  SELECT {_job_columns("%(full)s")} FROM jobs j
  WHERE j.id = i.id AND (i.allowed IS NULL OR j.queue_name ~ i.allowed)
) c ON d.id IS NULL
ORDER BY i.ord
"""


@dataclass(slots=True, frozen=True)
class Completion:
    id: int
    token: str
    result: str | None  # serialised JSON
    allowed: str | None = None  # the caller's queue regex; None: every queue


Done = tuple[Outcome, Row | None, bool]  # outcome, the job's row, whether this call changed it


async def jobs_complete(
    conn: psycopg.AsyncConnection[Any], items: Sequence[Completion], *, full: bool = True
) -> list[Done]:
    """Complete jobs in one statement. A retried complete with the token that completed the job is "ok"
    (the first result is kept). With full=False rows carry no payload/result (batch answers)."""
    doc = [
        {
            "ord": n,
            "id": c.id,
            "token": c.token,
            "result": Fragment(c.result) if c.result is not None else None,
            "allowed": c.allowed,
        }
        for n, c in enumerate(items)
    ]
    cur = await conn.execute(JOB_COMPLETE_MANY, {"items": as_json(doc), "full": full})
    out: list[Done] = []
    recheck = []
    changed: set[int] = set()
    for n, (item, row) in enumerate(zip(items, await cur.fetchall(), strict=True)):
        if row[1] is not None:
            # The same job twice in this statement was completed once: only its first item changed it.
            out.append(("ok", row[1 : 1 + JOB_WIDTH], item.id not in changed))
            changed.add(item.id)
            continue
        job = row[1 + JOB_WIDTH :] if row[1 + JOB_WIDTH] is not None else None
        if job is not None and job[_STATUS] == "running" and job[_TOKEN] == item.token:
            recheck.append(n)  # a concurrent statement finished it after our snapshot: look again
        out.append((_job_outcome(item.token, job, ("completed",)), job, False))
    for n in recheck:
        job = await job_get(conn, items[n].id, items[n].allowed)
        out[n] = (_job_outcome(items[n].token, job, ("completed",)), job, False)
    return out


JOB_FAIL = f"""
WITH failed AS (
  UPDATE jobs AS j
  SET status = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
      -- Retry later: the caller's delay, else exponential backoff with "equal jitter" (half fixed,
      -- half random) so that jobs failed together do not come back together.
      run_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts
                    THEN clock_timestamp() + make_interval(secs => coalesce(%(retry_in)s::float8,
                         least(%(cap)s::float8, %(base)s::float8 * power(2, least(j.attempts - 1, 60)))
                         * (0.5 + random() / 2)))
                    ELSE j.run_at END,
      finished_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN NULL ELSE clock_timestamp() END,
      lease_expires_at = NULL,
      last_error = %(error)s
  WHERE j.id = %(id)s AND j.status = 'running' AND j.claim_token = %(token)s
    AND (%(allowed)s::text IS NULL OR j.queue_name ~ %(allowed)s::text)
  RETURNING {JOB_COLUMNS}
), counted AS ({count_finished("failed")}
)
SELECT true, * FROM failed
UNION ALL
-- Else the row as found (to tell why not); a job outside the caller's queues is not found.
SELECT false, {JOB_COLUMNS} FROM jobs j
WHERE j.id = %(id)s AND (%(allowed)s::text IS NULL OR j.queue_name ~ %(allowed)s::text)
  AND NOT EXISTS (SELECT FROM failed)
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
    return await _guarded_write(conn, JOB_FAIL, params, ("pending", "failed"))


JOB_RELEASE_CLAIM = f"""
WITH released AS (
  -- A worker hands back a job it did not try (shutting down, lacking a resource). Guarded like fail:
  -- id + token + running + the caller's queues. The claim counted an attempt; untried, it is given
  -- back, so the attempt budget and last_error stay as they were. The token, lease and claimed_at go
  -- with the claim: a repeated release finds no claim (409), as would any other write with it.
  UPDATE jobs AS j
  SET status = 'pending', attempts = j.attempts - 1,
      run_at = clock_timestamp() + make_interval(secs => %(delay)s::float8),
      claimed_at = NULL, lease_expires_at = NULL, claim_token = NULL
  WHERE j.id = %(id)s AND j.status = 'running' AND j.claim_token = %(token)s
    AND (%(allowed)s::text IS NULL OR j.queue_name ~ %(allowed)s::text)
  RETURNING {JOB_COLUMNS}
)
SELECT true, * FROM released
UNION ALL
-- Else the row as found (to tell why not); a job outside the caller's queues is not found.
SELECT false, {JOB_COLUMNS} FROM jobs j
WHERE j.id = %(id)s AND (%(allowed)s::text IS NULL OR j.queue_name ~ %(allowed)s::text)
  AND NOT EXISTS (SELECT FROM released)
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
    `(true, row)` when it wrote, else `(false, row as found)`, and tell why it did not write. `done`:
    the statuses in which a repeat with the same token is a success (see _outcome)."""
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    if row is None:
        return "not_found", None, False
    job: Row | None = row[1:]
    if row[0]:
        return "ok", job, True
    if job is not None and job[_STATUS] == "running" and job[_TOKEN] == params["token"]:
        job = await job_get(conn, params["id"], params["allowed"])  # finished concurrently: look again
    return _job_outcome(params["token"], job, done), job, False


# --- sweeper ------------------------------------------------------------------------------------------------

JOB_RESCUE_EXPIRED = """
WITH expired AS (
  -- Leases that lapsed while attempts remain. SKIP LOCKED: replicas sweeping at once split the work,
  -- and a job that a worker is completing right now is left to that worker.
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
WHERE j.id = expired.id
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
  WHERE j.id = exhausted.id
  RETURNING j.queue_name, j.status
), counted AS ({count_finished("failed")}
)
SELECT queue_name FROM failed
"""


async def jobs_rescue_expired(conn: psycopg.AsyncConnection[Any], now: datetime | None, batch: int) -> list[str]:
    """One batch of lapsed leases back to pending; returns the queue of each row moved."""
    cur = await conn.execute(JOB_RESCUE_EXPIRED, {"now": now, "batch": batch})
    return [r[0] for r in await cur.fetchall()]


async def jobs_fail_exhausted(conn: psycopg.AsyncConnection[Any], now: datetime | None, batch: int) -> list[str]:
    cur = await conn.execute(JOB_FAIL_EXHAUSTED, {"now": now, "batch": batch})
    return [r[0] for r in await cur.fetchall()]
