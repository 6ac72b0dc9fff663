"""All SQL of a job's life but its claim (enqueue, heartbeat, complete, fail, release, lease rescue; the
claim is app/db/claim.py) and the typed rows it returns. Every statement runs in autocommit: one
statement, one short transaction, no lock held across a round trip to a client.

Statements take a batch (a JSON document unpacked by json_to_recordset) so that concurrent requests can
share one statement and one commit (see app/core/coalesce.py); a single request is the batch-of-one case.

Plans that cannot fall off a cliff. Statistics lag the table (every bulk load until an ANALYZE; any
table that grew fast), and with stale statistics a partial index (jobs_claim_idx, jobs_lease_idx) can
look empty to the planner, which then prefers it for everything: a complete hash-joined every running
job through jobs_lease_idx, a claim read every ready job through a bitmap scan and sorted them. So:
  * a statement addressed by job id restricts jobs by id alone: the guards that name a status compare
    it with RUNNING, a value the planner cannot see (an InitPlan), so no partial index can be proven to
    apply, and batches add `id = ANY(<the batch's ids>)`: the primary key is the only way in;
  * lookups of "the row as found" are per-row subqueries behind OFFSET 0, a fence the planner does not
    flatten into a join;
  * claims and the lease rescue keep their partial index and its order, and the pool's sessions run
    with enable_bitmapscan off (app/db/pool.py), so the only other way to serve their ORDER BY ... LIMIT
    is a sort of the whole table, which no statistics make look cheap.
tests/test_plans.py checks every hot statement's plan on a 300,000-row table whose statistics were
taken while it was nearly empty."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson
import psycopg
from orjson import Fragment

from app.auth.policy import queue_allowed
from app.db.rows import FINISHED, Beat, ClaimRow, Inserted, JobRow, Status, Written, outcome_rows, rows_of

# A status the planner cannot see when it plans (see above): `j.status = RUNNING` proves no partial index.
RUNNING = "(SELECT 'running'::text)"
# Running, as jobs_running_idx's predicate says it (migrations/0008_flow_control.sql): only statements that
# write it this way may read that index.
RUNNING_C = "'running' COLLATE \"C\""
# FINISHED as an SQL list: ('completed', 'failed', 'cancelled').
FINISHED_SQL = "(" + ", ".join(f"'{s}'" for s in FINISHED) + ")"


def job_columns(full: str = "true") -> str:
    """The columns of JobRow, in order; `full` is an SQL boolean: false leaves payload and result out."""
    return (
        "j.id, j.queue_name AS queue, j.status, "
        f"CASE WHEN {full} THEN j.payload::text END AS payload, "
        "j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at, j.claimed_at, "
        "j.lease_expires_at, j.finished_at, j.locked_by AS worker, j.last_error, "
        f"CASE WHEN {full} THEN j.result::text END AS result, j.idempotency_key, j.claim_token, j.traceparent, "
        'j.schedule, j.scheduled_for, j.group_key AS "group", j.progress::text AS progress, j.depends_on, '
        # NULL means cancel, and says nothing for a job without dependencies; the count only while waiting.
        "CASE WHEN j.depends_on IS NOT NULL THEN coalesce(j.on_dependency_failure, 'cancel') END "
        "AS on_dependency_failure, "
        "CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies"
    )


JOB_COLUMNS = job_columns()


def count_finished(source: str, status: str = "status", delta: str = "1") -> str:
    """A data-modifying CTE body that adds `delta` to the finished-job counter of each (queue, status)
    row of `source`, in the same statement as the transition, so the counts never drift. Each backend
    writes its own shard (backend pid mod 64): concurrent statements do not queue on one row."""
    return f"""
  INSERT INTO queue_counts AS c (queue_name, status, shard, n)
  SELECT queue, {status}, mod(pg_backend_pid(), 64), sum({delta})
  FROM {source}
  WHERE {status} IN {FINISHED_SQL}
  GROUP BY 1, 2
  ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n"""


def as_json(doc: Any) -> str:
    """A batch parameter: one JSON document that the SQL unpacks with json_to_recordset. Far cheaper than
    arrays here: psycopg dumps text arrays in Python, element by element; orjson does this in C, and
    payloads already serialised go in as fragments, not as escaped strings."""
    return orjson.dumps(doc).decode()


def _fragment(text: str | None) -> Fragment | None:
    return Fragment(text) if text is not None else None


# Object-level authorisation: statements addressed by job id take `allowed`, the caller's anchored regex
# over queue names (NULL: every queue), and treat a job in another queue exactly like a missing one, in
# the same statement (no read before the write). See app/auth/policy.py.

# --- get ----------------------------------------------------------------------------------------------------

JOB_GET = f"""
SELECT {JOB_COLUMNS} FROM jobs j
WHERE j.id = %(id)s AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
"""


async def job_get(conn: psycopg.AsyncConnection[Any], job_id: int, allowed: str | None = None) -> JobRow | None:
    cur = conn.cursor(row_factory=rows_of(JobRow))
    await cur.execute(JOB_GET, {"id": job_id, "allowed": allowed})
    return await cur.fetchone()


JOBS_GET_WAITED = f"""
-- Jobs that requests wait for (app/core/results.py), each as it is now: with payload and result only when
-- it has finished, since only then is it an answer. A job that is gone is not in the result.
SELECT {job_columns(f"j.status IN {FINISHED_SQL}")} FROM jobs j WHERE j.id = ANY(%(ids)s)
"""


async def jobs_get_waited(conn: psycopg.AsyncConnection[Any], ids: Sequence[int]) -> list[JobRow]:
    cur = conn.cursor(row_factory=rows_of(JobRow))
    await cur.execute(JOBS_GET_WAITED, {"ids": list(ids)})
    return await cur.fetchall()


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
    traceparent: str | None = None  # the enqueue's W3C trace context (app/runtime/tracing.py)
    group: str | None = None


JOB_INSERT_MANY = f"""
WITH input AS (
  -- Ids are drawn in the input's order (a volatile select-list expression is evaluated after the
  -- ORDER BY): that is how rows without a key are matched back to their input, and ids are the last
  -- tie-break of claim order, so a batch keeps its order.
  SELECT t.*, nextval(pg_get_serial_sequence('jobs', 'id')) AS id
  FROM json_to_recordset(%(batch)s::json)
    AS t(ord int, queue_name text, payload jsonb, priority int, run_at timestamptz, delay float8,
         max_attempts int, idempotency_key text, traceparent text, group_key text)
  ORDER BY ord
)
INSERT INTO jobs AS j (id, queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent,
                       group_key)
OVERRIDING SYSTEM VALUE
SELECT id, queue_name, coalesce(payload, 'null'), priority,  -- json_to_recordset reads JSON null as NULL
       coalesce(run_at, now() + make_interval(secs => coalesce(delay, 0))),
       max_attempts, idempotency_key, traceparent, group_key
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
-- The jobs already holding these keys, one lookup each through jobs_idempotency_idx (the restriction
-- `IS NOT NULL` proves its predicate; OFFSET 0 keeps each lookup a lookup).
SELECT j.*
FROM json_to_recordset(%(keys)s::json) AS k(queue_name text, idempotency_key text)
CROSS JOIN LATERAL (
  SELECT {JOB_COLUMNS} FROM jobs j
  WHERE j.queue_name = k.queue_name AND j.idempotency_key = k.idempotency_key AND j.idempotency_key IS NOT NULL
  OFFSET 0
) j
"""


async def jobs_insert(conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob]) -> list[Inserted]:
    """Insert jobs in one statement; one Inserted per input. A job whose idempotency key is already used
    on its queue comes back as not created, with the existing row, also when the same key occurs twice
    here."""
    out: list[Inserted | None] = [None] * len(jobs)
    todo = list(range(len(jobs)))
    for _ in range(3):  # a conflicting row deleted between INSERT and SELECT (retention): rare, go again
        todo = await _insert_round(conn, jobs, todo, out)
        if not todo:
            return [o for o in out if o is not None]
    raise RuntimeError("idempotency key kept vanishing between insert and lookup")


async def _insert_round(
    conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob], todo: list[int], out: list[Inserted | None]
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
            "traceparent": j.traceparent,
            "group_key": j.group,
        }
        for n, j in enumerate(jobs[i] for i in todo)
    ]
    cur = conn.cursor(row_factory=rows_of(JobRow))
    await cur.execute(JOB_INSERT_MANY, {"batch": as_json(batch)})
    rows = await cur.fetchall()
    keyed = {(r.queue, r.idempotency_key): r for r in rows if r.idempotency_key is not None}
    unkeyed = iter(sorted((r for r in rows if r.idempotency_key is None), key=lambda r: r.id))
    taken = []
    for i in todo:
        job = jobs[i]
        if job.idempotency_key is None:
            out[i] = Inserted(True, next(unkeyed))
        elif (row := keyed.pop((job.queue, job.idempotency_key), None)) is not None:
            out[i] = Inserted(True, row)
        else:
            taken.append(i)
    if not taken:
        return []
    keys = [{"queue_name": jobs[i].queue, "idempotency_key": jobs[i].idempotency_key} for i in taken]
    await cur.execute(JOB_GET_BY_KEYS, {"keys": as_json(keys)})
    existing = {(r.queue, r.idempotency_key): r for r in await cur.fetchall()}
    left = []
    for i in taken:
        found = existing.get((jobs[i].queue, jobs[i].idempotency_key))
        if found is None:
            left.append(i)
        else:
            out[i] = Inserted(False, found)
    return left


# --- claims handed back ---------------------------------------------------------------------------------------

JOB_RELEASE = f"""
-- Claimed for a request that went away before it could be answered (timeout, disconnect, shutdown):
-- hand the job straight back. The attempt is returned too, since no worker ever saw the job.
WITH r AS (SELECT * FROM json_to_recordset(%(claims)s::json) AS r(id bigint, token text))
UPDATE jobs AS j
SET status = 'pending', attempts = j.attempts - 1, lease_expires_at = NULL, claim_token = NULL
FROM r
WHERE j.id = ANY(ARRAY(SELECT id FROM r)) AND j.id = r.id AND j.claim_token = r.token AND j.status = {RUNNING}
"""


async def jobs_release(conn: psycopg.AsyncConnection[Any], rows: Sequence[ClaimRow]) -> None:
    await conn.execute(JOB_RELEASE, {"claims": as_json([{"id": r.id, "token": r.claim_token} for r in rows])})


# --- heartbeat, complete, fail ------------------------------------------------------------------------------

Outcome = Literal["ok", "claim_lost", "not_found", "cancelled"]


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
    return "claim_lost"


JOB_HEARTBEAT_MANY = f"""
WITH input AS (
  SELECT * FROM json_to_recordset(%(beats)s::json)
    AS t(ord int, id bigint, token text, lease int, allowed text, progress text, set_progress bool, writes bool)
), renewed AS (
  -- Guarded by id + token + running (a stale claim renews nothing) + the caller's queues. A beat that
  -- carries progress replaces the job's (JSON null clears it); one without leaves it as it is. Beats of
  -- one claim that share this statement write once, through the one that `writes` (see jobs_heartbeat).
  UPDATE jobs AS j
  SET lease_expires_at = clock_timestamp() + make_interval(secs => coalesce(i.lease, j.lease_seconds)),
      lease_seconds = coalesce(i.lease, j.lease_seconds),
      progress = CASE WHEN i.set_progress THEN i.progress::jsonb ELSE j.progress END
  FROM input i
  WHERE j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id AND i.writes
    AND j.status = {RUNNING} AND j.claim_token = i.token AND {queue_allowed("j.queue_name", "i.allowed")}
  RETURNING j.id, j.claim_token, j.lease_expires_at
)
-- Per input: the new expiry, else the job's state as this statement found it (to tell why not); a job
-- outside the caller's queues is not found.
SELECT i.ord, r.lease_expires_at, c.status, c.claim_token
FROM input i
LEFT JOIN renewed r ON r.id = i.id AND r.claim_token = i.token
LEFT JOIN LATERAL (
  SELECT j.status, j.claim_token FROM jobs j
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


async def jobs_heartbeat(
    conn: psycopg.AsyncConnection[Any], beats: Sequence[Heartbeat]
) -> list[tuple[Outcome, datetime | None]]:
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
    out: list[tuple[Outcome, datetime | None]] = []
    for beat, row in zip(beats, await cur.fetchall(), strict=True):
        if row.lease_expires_at is not None:
            out.append(("ok", row.lease_expires_at))
        elif row.status == Status.running and row.claim_token == beat.token:
            # Changed by a concurrent statement after our snapshot (a cancel, the sweeper, a complete):
            # look again, so that a cancel is reported as such and not as a lost claim.
            job = await job_get(conn, beat.id, beat.allowed)
            out.append((outcome_of(beat.token, job, ()), None))
        else:
            out.append((_outcome(beat.token, row.status, row.claim_token, ()), None))
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
  SELECT {job_columns(full)} FROM jobs j
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
  UPDATE jobs AS j
  SET status = 'completed', finished_at = clock_timestamp(), lease_expires_at = NULL, result = i.result
  -- The same job and token twice in one statement (a retry coalesced with its original): the first
  -- item's result is kept, as for a retry that comes later.
  FROM (SELECT DISTINCT ON (id, token) * FROM input ORDER BY id, token, ord) i
  WHERE j.id = ANY(ARRAY(SELECT id FROM input)) AND j.id = i.id
    AND j.status = {RUNNING} AND j.claim_token = i.token AND {queue_allowed("j.queue_name", "i.allowed")}
  RETURNING {job_columns("%(full)s")}
), counted AS ({count_finished("done", "'completed'")}
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
SELECT 0, false, {JOB_COLUMNS} FROM jobs j
WHERE j.id = %(id)s AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
  AND NOT EXISTS (SELECT FROM {written})
"""


JOB_FAIL = f"""
WITH failed AS (
  UPDATE jobs AS j
  SET status = CASE WHEN %(retry)s AND j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
      -- Retry later: the caller's delay, else exponential backoff with "equal jitter" (half fixed,
      -- half random) so that jobs failed together do not come back together; the queue's backoff
      -- settings (queue_state, one lookup by key) else the global ones.
      run_at = CASE WHEN %(retry)s AND j.attempts < j.max_attempts
                    THEN clock_timestamp() + make_interval(secs => coalesce(%(retry_in)s::float8,
                         least(coalesce((SELECT backoff_max_seconds FROM queue_state WHERE queue_name = j.queue_name),
                                        %(cap)s::float8),
                               coalesce((SELECT backoff_base_seconds FROM queue_state WHERE queue_name = j.queue_name),
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
  UPDATE jobs AS j
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
