"""A job's row: the shared SQL fragments (columns, the status the planner cannot see, the finished
counter), its reads by id and its enqueue. A worker's writes are app/db/writes.py, the lease rescue
app/db/rescue.py, the claim app/db/claim.py. Every statement runs in autocommit: one statement, one
short transaction, no lock held across a round trip to a client.

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

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from itertools import pairwise
from typing import Any, NamedTuple

import orjson
import psycopg
import psycopg.rows
from orjson import Fragment

from app.db import finishing
from app.db.rows import FINISHED, Inserted, JobRow, Made, outcome_rows, rows_of
from app.db.scope import queue_allowed
from app.db.tokens import queue_of_job

# A status the planner cannot see when it plans (see above): `j.status = RUNNING` proves no partial index.
RUNNING = "(SELECT 'running'::text)"
# Running, as jobs_running_idx's predicate says it (migrations/0008_flow_control.sql): only statements that
# write it this way may read that index.
RUNNING_C = "'running' COLLATE \"C\""
# FINISHED as an SQL list: ('completed', 'failed', 'cancelled').
FINISHED_SQL = "(" + ", ".join(f"'{s}'" for s in FINISHED) + ")"


def job_columns(full: str = "true", keyed: bool = True) -> str:
    """The columns of JobRow, in order; `full` is an SQL boolean: false leaves payload and result out.
    keyed=False: for rows that have neither a unique key nor a debounce key (a new job of the plain insert),
    whose `unique` and `debounce` are NULL without json_build_object: every column is then IMMUTABLE, as
    Citus requires of a RETURNING clause."""
    if not keyed:
        columns = job_columns(full)
        start, end = columns.index("CASE WHEN j.unique_key"), columns.index("coalesce(j.has_dependants")
        return columns[:start] + 'NULL::text AS "unique", NULL::text AS debounce, ' + columns[end:]
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
        "CASE WHEN j.status = 'waiting' THEN j.pending_dependencies END AS pending_dependencies, "
        "j.timeout_seconds, "
        # A unique job's key and window (migrations/0040_unique_jobs.sql), as JSON; NULL for the others.
        "CASE WHEN j.unique_key IS NOT NULL THEN json_build_object('key', j.unique_key, "
        "'for_seconds', j.unique_for_seconds, 'while', j.unique_states, "
        "'window_start', CASE WHEN j.unique_for_seconds IS NOT NULL THEN j.unique_from END, "
        "'window_end', j.unique_from + make_interval(secs => j.unique_for_seconds))::text END AS \"unique\", "
        # A debounced job's key and options (migrations/0042_debounce.sql), as JSON; NULL for the others.
        "CASE WHEN j.debounce_key IS NOT NULL THEN json_build_object('key', j.debounce_key, "
        "'seconds', j.debounce_seconds, 'max_wait_seconds', j.debounce_max_wait_seconds, "
        "'run_by', j.created_at + make_interval(secs => j.debounce_max_wait_seconds))::text END AS debounce, "
        # Not shown by the API: whether a job enqueued later depends on this one (the release, app/db/releases.py).
        "coalesce(j.has_dependants, false) AS has_dependants"
    )


JOB_COLUMNS = job_columns()


def count_finished(source: str, status: str = "status", delta: str = "1") -> str:
    """A data-modifying CTE body that adds `delta` to the finished-job counter of each (queue, status)
    row of `source`, in the same statement as the transition, so the counts never drift. Each backend
    writes its own shard (backend pid mod 64): concurrent statements do not queue on one row."""
    return f"""
  INSERT INTO jobq.queue_counts AS c (queue_name, status, shard, n)
  SELECT queue, {status}, mod(pg_backend_pid(), 64), sum({delta})
  FROM {source}
  WHERE {status} IN {FINISHED_SQL}
  GROUP BY 1, 2
  ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n"""


def record_finished(source: str) -> str:
    """A data-modifying CTE body that records, in the dependency release's outbox, each job of `source` (with
    columns queue, id, status, has_dependants) that finished while some job depends on it: the release
    (app/db/releases.py) then releases or cancels its dependants. Same statement as the finish, so a finish
    never commits without its record; the row stays in the finished job's queue."""
    return f"""
  INSERT INTO jobq.dependency_releases (queue_name, job_id, status)
  SELECT queue, id, status FROM {source}
  WHERE has_dependants AND status IN {FINISHED_SQL}"""


def as_json(doc: Any) -> str:
    """A batch parameter: one JSON document that the SQL unpacks with json_to_recordset. Far cheaper than
    arrays here: psycopg dumps text arrays in Python, element by element; orjson does this in C, and
    payloads already serialised go in as fragments, not as escaped strings."""
    return orjson.dumps(doc).decode()


# Object-level authorisation: statements addressed by job id take `allowed`, the caller's anchored regex
# over queue names (NULL: every queue), and treat a job in another queue exactly like a missing one, in
# the same statement (no read before the write). See app/db/scope.py and app/auth/policy.py.

# --- get ----------------------------------------------------------------------------------------------------

JOB_GET = f"""
SELECT {JOB_COLUMNS} FROM jobq.jobs j
WHERE j.id = %(id)s AND j.queue_name = %(queue)s AND {queue_allowed("j.queue_name", "%(allowed)s::text")}
"""


async def job_get(
    conn: psycopg.AsyncConnection[Any], job_id: int, allowed: str | None = None, queue: str | None = None
) -> JobRow | None:
    """The job (None: no such job, or none in the caller's queues). `queue`: the job's queue when the caller
    knows it (a claim token names it); otherwise it is looked up by id first (app/db/tokens.py queue_of_job),
    so that the read itself goes to the one shard of the job's queue on Citus (app/db/distribute.py)."""
    if queue is None:
        queue = await queue_of_job(conn, job_id)
        if queue is None:
            return None
    cur = conn.cursor(row_factory=rows_of(JobRow))
    await cur.execute(JOB_GET, {"id": job_id, "queue": queue, "allowed": allowed})
    return await cur.fetchone()


JOBS_GET_WAITED = f"""
-- Jobs that requests wait for (app/core/results.py), each as it is now: with payload and result only when
-- it has finished, since only then is it an answer. A job that is gone is not in the result. `queues`: the
-- queues of those jobs, known since each wait began; on Citus the read goes to their shards only (one task
-- when they are of one queue), still one statement for every job woken at once.
SELECT {job_columns(f"j.status IN {FINISHED_SQL}")} FROM jobq.jobs j
WHERE j.id = ANY(%(ids)s) AND j.queue_name = ANY(%(queues)s::text[])
"""


async def jobs_get_waited(
    conn: psycopg.AsyncConnection[Any], ids: Sequence[int], queues: Sequence[str]
) -> list[JobRow]:
    """The jobs among `ids` (of the queues `queues`), as they are now."""
    cur = conn.cursor(row_factory=rows_of(JobRow))
    await cur.execute(JOBS_GET_WAITED, {"ids": list(ids), "queues": sorted(set(queues))})
    return await cur.fetchall()


# --- enqueue ------------------------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Unique:
    """A unique job's options (docs/producers.md): its key (None: a hash of its payload), its window's
    length (None: no window), and the states in which a job holds the key."""

    key: str | None
    for_seconds: int | None
    states: tuple[str, ...]


@dataclass(slots=True, frozen=True)
class Debounce:
    """A debounced job's options (docs/producers.md): its key, the quiet time after the latest enqueue, and
    the longest time from the first enqueue (None: no limit)."""

    key: str
    seconds: float
    max_wait_seconds: float | None


class NewJob(NamedTuple):
    """A job to insert. A tuple: a batch makes a thousand, and a frozen dataclass's fields cost a call each
    (4.1 µs a job against 0.9)."""

    queue: str
    payload: str  # serialised JSON
    priority: int
    run_at: datetime | None
    delay_seconds: float | None
    max_attempts: int
    idempotency_key: str | None
    traceparent: str | None = None  # the enqueue's W3C trace context (app/observability/tracing.py)
    group: str | None = None
    timeout_seconds: int | None = None  # the job's own hard timeout (None: its queue's, if any)
    unique: Unique | None = None  # inserted by jobs_insert_unique, never by the shared statement
    debounce: Debounce | None = None  # inserted or replaced by app/db/debounce.py, never by the shared statement


# The plain insert of up to VALUES_MAX jobs is a VALUES list, which Citus runs as one single-shard task per queue
# named (a router INSERT; an INSERT ... SELECT, of json_to_recordset say, goes through the coordinator in several
# round trips). PostgreSQL initialises every expression of a VALUES list at each execution and plans each row:
# past a few dozen rows that costs more than json_to_recordset (2-3x at 64-1,000 rows), so larger batches take
# JOB_INSERT_BATCH. Each row is written for its job: a field the job leaves unset is DEFAULT, not a parameter,
# and the run time is an expression only for a delay (a plain job is four parameters). On Citus only: on plain
# PostgreSQL JOB_INSERT_BATCH serves every enqueue, as before Citus, since the VALUES list cost about 10% of
# single-enqueue throughput there (15-20 us more API CPU per job: docs/benchmarks-history.md, "Citus, first part").
VALUES_MAX = 32
_INSERT_COLUMNS = (
    "queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent, group_key, timeout_seconds"
)


# A row's shape: how its run time is written (0: DEFAULT, 1: a time, 2: a delay) and which of the optional
# fields are set. The statement's text depends on the shapes only, so it is built once per list of shapes
# (_values_sql) and a request only fills in its parameters: building the text per request cost several
# microseconds of the API's CPU per enqueue (docs/benchmarks-history.md, "Citus, first part").
_Shape = tuple[int, bool, bool, bool, bool]
_OPTIONAL = (("k", "text"), ("t", "text"), ("g", "text"), ("o", "int"))


def _shape(job: NewJob) -> _Shape:
    run = 1 if job.run_at is not None else 2 if job.delay_seconds is not None else 0
    return (run, job.idempotency_key is not None, job.traceparent is not None, job.group is not None,
            job.timeout_seconds is not None)  # fmt: skip


def _row_sql(k: int, shape: _Shape) -> str:
    """Row k of a VALUES list for a job of this shape (its id: drawn by the identity column, in the list's
    order). A field the job leaves unset is DEFAULT, not a parameter."""
    run_at = ("DEFAULT", f"%(r{k})s::timestamptz", f"now() + make_interval(secs => %(d{k})s::float8)")[shape[0]]
    cells = [f"%(q{k})s::text", f"%(p{k})s::jsonb", f"%(pr{k})s::int", run_at, f"%(m{k})s::int"]
    for (name, cast), present in zip(_OPTIONAL, shape[1:], strict=True):
        cells.append(f"%({name}{k})s::{cast}" if present else "DEFAULT")
    return "(" + ", ".join(cells) + ")"


# The parameter names of row k, made once.
_NAMES = [tuple(f"{n}{k}" for n in ("q", "p", "pr", "m", "r", "d", "k", "t", "g", "o")) for k in range(VALUES_MAX)]


def _row_params(k: int, job: NewJob, params: dict[str, Any]) -> None:
    """Row k's parameters (as _row_sql names them for the job's shape), added to `params`."""
    q, p, pr, m, r, d, key, t, g, o = _NAMES[k]
    params[q], params[p], params[pr], params[m] = job.queue, job.payload, job.priority, job.max_attempts
    if job.run_at is not None:
        params[r] = job.run_at
    elif job.delay_seconds is not None:
        params[d] = job.delay_seconds
    if job.idempotency_key is not None:
        params[key] = job.idempotency_key
    if job.traceparent is not None:
        params[t] = job.traceparent
    if job.group is not None:
        params[g] = job.group
    if job.timeout_seconds is not None:
        params[o] = job.timeout_seconds


def _insert_row(k: int, job: NewJob, params: dict[str, Any]) -> str:
    """Row k of the VALUES list for `job`; adds its parameters to `params`."""
    _row_params(k, job, params)
    return _row_sql(k, _shape(job))


@lru_cache(maxsize=1024)
def _values_sql(shapes: tuple[_Shape, ...], full: bool) -> str:
    """The plain insert of jobs of these shapes (job_insert_values), made once per list of shapes: a single
    job has 48 shapes, and the batches a producer sends mostly repeat."""
    return job_insert_values([_row_sql(k, shape) for k, shape in enumerate(shapes)], full)


def job_insert_values(rows: Sequence[str], full: bool = True) -> str:
    """The plain insert of `rows` (VALUES rows from _insert_row, at most VALUES_MAX), in their order: ids
    drawn in that order. full = false: for a minimal answer (Prefer: return=minimal), the payload does not
    travel back. Every RETURNING column is IMMUTABLE, as Citus requires."""
    values = ",\n       ".join(rows)
    return f"""
INSERT INTO jobq.jobs AS j ({_INSERT_COLUMNS})
VALUES {values}
-- A key already taken on this queue: insert nothing, the caller fetches the existing job.
ON CONFLICT (queue_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {job_columns("true" if full else "false", keyed=False)}
"""


# The statement for one job with a delay and every other field set (sql/jobs.sql shows it): a batch has a row per
# job; an unset field is DEFAULT, a run time `%(r0)s::timestamptz`, no delay DEFAULT (now()).
JOB_INSERT_ONE = job_insert_values([_insert_row(0, NewJob("q", "null", 0, None, 1.0, 1, "k", "t", "g", 1), {})])


# The jobs' identity sequence, looked up once per statement: a scalar subquery is an initplan, evaluated once,
# where pg_get_serial_sequence in nextval's argument would be evaluated for every row (a catalog lookup: 2.4 ms
# of a 1,000-job insert's 16, bench/returning.py).
_JOBS_SEQ = "(SELECT pg_get_serial_sequence('jobq.jobs', 'id')::regclass)"


def _job_insert_batch(full: str) -> str:
    return f"""
WITH input AS (
  -- A batch of more than VALUES_MAX jobs (see job_insert_values for the others). On Citus an INSERT ... SELECT
  -- is pulled through the coordinator: the rows are sent to each shard named, then inserted there (a few round
  -- trips, for many rows). Ids are drawn in the input's order (a volatile select-list expression is evaluated after the
  -- ORDER BY): that is how rows without a key are matched back to their input, and ids are the last
  -- tie-break of claim order, so a batch keeps its order.
  SELECT t.*, nextval({_JOBS_SEQ}) AS id
  FROM json_to_recordset(%(batch)s::json)
    AS t(ord int, queue_name text, payload jsonb, priority int, run_at timestamptz, delay float8,
         max_attempts int, idempotency_key text, traceparent text, group_key text, timeout_seconds int)
  ORDER BY ord
)
INSERT INTO jobq.jobs AS j (id, queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent,
                       group_key, timeout_seconds)
OVERRIDING SYSTEM VALUE
SELECT id, queue_name, coalesce(payload, 'null'), priority,  -- json_to_recordset reads JSON null as NULL
       coalesce(run_at, now() + make_interval(secs => coalesce(delay, 0))),
       max_attempts, idempotency_key, traceparent, group_key, timeout_seconds
FROM input
-- Rows are inserted in key order, not input order: every statement then takes the keys it waits on
-- (a key inserted by a transaction still in flight) in one global order, so two batches holding the
-- same keys in different orders cannot wait on each other in a cycle (a deadlock: one would fail).
-- The first occurrence of a key twice in the input still wins (ord breaks the tie).
ORDER BY queue_name COLLATE "C", idempotency_key COLLATE "C", ord
-- A key already taken on this queue: insert nothing, the caller fetches the existing job.
ON CONFLICT (queue_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {job_columns(full, keyed=False)}
"""


# The plain insert of a batch of more than VALUES_MAX jobs; "brief": for a minimal answer (Prefer:
# return=minimal), the payload does not travel back.
JOB_INSERT_BATCH = {"full": _job_insert_batch("true"), "brief": _job_insert_batch("false")}


# A batch of at least COPY_MIN jobs none of which has an idempotency key (nothing to look up or skip; unique and
# debounced jobs never come here, a dependent batch comes inside its own transaction) is written on plain
# PostgreSQL with COPY: its ids drawn first in one statement (with the time that becomes each job's created_at, and
# its run_at unless delayed or given), then the rows copied in as text, and the answer made from what was written:
# no statement to plan, no JSON batch to take apart, no rows to send back. Measured on a 1,000-job batch
# (BENCHMARKS.md, "Kept: batches of 200 jobs or more copied in"): 21 ms against 34 from the client's side, the
# client's CPU 6.4 ms against 10.9. Below a hundred or so jobs the extra round trip costs more than it saves. Not on
# Citus (JOB_INSERT_BATCH and the VALUES lists there).
COPY_MIN = 200
JOB_IDS = f"SELECT now(), array(SELECT nextval({_JOBS_SEQ}) FROM generate_series(1, %(n)s))"
JOB_COPY = (
    "COPY jobq.jobs (id, queue_name, payload, priority, run_at, max_attempts, created_at, traceparent, group_key,"
    " timeout_seconds) FROM STDIN"
)


_COPY_NULL = "\\N"
_tuple_new = tuple.__new__
_ROW_DEFAULTS = tuple(JobRow._field_defaults.values())  # the fields after timeout_seconds
# The fields _copy_insert writes in order, then the defaulted ones: a row made with tuple.__new__ is not checked
# against its class, so the order is, once.
_COPY_ROW = [
    "id", "queue", "status", "payload", "priority", "attempts", "max_attempts", "run_at", "created_at", "claimed_at",
    "lease_expires_at", "finished_at", "worker", "last_error", "result", "idempotency_key", "claim_token",
    "traceparent", "schedule", "scheduled_for", "group", "progress", "depends_on", "on_dependency_failure",
    "pending_dependencies", "timeout_seconds",
]  # fmt: skip
if list(JobRow._fields) != _COPY_ROW + list(JobRow._field_defaults):
    raise TypeError("JobRow's fields changed: _copy_insert writes its rows by position")


def _copy_text(value: str | None) -> str:
    """A text field of COPY's text format: NULL is \\N; a backslash, tab, newline or carriage return escaped."""
    if value is None:
        return _COPY_NULL
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return value


async def _copy_insert(conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob], full: bool) -> list[JobRow]:
    """Plain jobs (no key) inserted by COPY, in their order, as JOB_INSERT_BATCH would insert them; their rows as
    it would return them (the payload as this service serialised it: the same JSON value jsonb holds). The COPY is
    one statement: all of them or none."""
    cur = await conn.execute(JOB_IDS, {"n": len(jobs)})
    drawn = await cur.fetchone()
    assert drawn is not None
    now, ids = drawn[0], sorted(drawn[1])  # sorted: ids are claim order's last tie-break, so the batch keeps its order
    now_text, null = now.isoformat(), _COPY_NULL
    lines, rows = [], []
    for id_, (queue, payload, priority, run_at, delay, max_attempts, _, traceparent, group, timeout, _, _) in zip(
        ids, jobs, strict=True
    ):
        if run_at is not None:
            run_text = run_at.isoformat()
        elif delay:
            run_at = now + timedelta(seconds=delay)
            run_text = run_at.isoformat()
        else:
            run_at, run_text = now, now_text
        lines.append(
            f"{id_}\t{_copy_text(queue)}\t{_copy_text(payload)}\t{priority}\t{run_text}\t{max_attempts}\t{now_text}\t"
            f"{null if traceparent is None else _copy_text(traceparent)}\t"
            f"{null if group is None else _copy_text(group)}\t{null if timeout is None else timeout}\n"
        )
        # JobRow's fields in order: what JOB_INSERT_BATCH's RETURNING gives for a new pending job. Made as a tuple
        # (tuple.__new__, as namedtuple's _make does): a call with 26 arguments costs a thousand of them 0.3 ms.
        rows.append(
            _tuple_new(JobRow, (
                id_, queue, "pending", payload if full else None, priority, 0, max_attempts, run_at, now, None, None,
                None, None, None, None, None, None, traceparent, None, None, group, None, None, None, None, timeout,
                *_ROW_DEFAULTS,
            ))
        )  # fmt: skip
    async with conn.cursor().copy(JOB_COPY) as copy:
        await copy.write("".join(lines))  # encoded as the connection's encoding, as every other statement's text
    return rows


JOB_GET_BY_KEYS = f"""
-- The jobs of one queue already holding these keys, one lookup each through jobs_idempotency_idx (the
-- restriction `IS NOT NULL` proves its predicate; OFFSET 0 keeps each lookup a lookup). One queue per
-- statement: on Citus, a router query on that queue's shard (app/db/distribute.py).
SELECT j.*
FROM json_array_elements_text(%(keys)s::json) AS k(idempotency_key)
CROSS JOIN LATERAL (
  SELECT {JOB_COLUMNS} FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.idempotency_key = k.idempotency_key AND j.idempotency_key IS NOT NULL
  OFFSET 0
) j
"""


async def jobs_insert(
    conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob], *, full: bool = True
) -> list[Inserted]:
    """Insert jobs in one statement; one Inserted per input. A job whose idempotency key is already used
    on its queue comes back as not created, with the existing row, also when the same key occurs twice
    here. With full=False the inserted rows carry no payload (an existing row still does)."""
    out: list[Inserted | None] = [None] * len(jobs)
    todo = list(range(len(jobs)))
    for _ in range(3):  # a conflicting row deleted between INSERT and SELECT (retention): rare, go again
        todo = await _insert_round(conn, jobs, todo, out, full)
        if not todo:
            return [o for o in out if o is not None]
    raise RuntimeError("idempotency key kept vanishing between insert and lookup")


def _job_doc(ord_: int, j: NewJob) -> dict[str, Any]:
    """A job as the json_to_recordset inserts read it (JOB_INSERT_BATCH, JOB_INSERT_UNIQUE)."""
    return {
        "ord": ord_,
        "queue_name": j.queue,
        "payload": Fragment(j.payload),
        "priority": j.priority,
        "run_at": j.run_at,
        "delay": j.delay_seconds,
        "max_attempts": j.max_attempts,
        "idempotency_key": j.idempotency_key,
        "traceparent": j.traceparent,
        "group_key": j.group,
        "timeout_seconds": j.timeout_seconds,
    }


def _c_order(text: str | None) -> bytes:
    """A key's place in COLLATE "C" order (its UTF-8 bytes)."""
    return b"" if text is None else text.encode()


async def _insert_round(
    conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob], todo: list[int], out: list[Inserted | None], full: bool
) -> list[int]:
    """Insert jobs[todo], fill `out`; returns the indexes still without a row.

    Ids are the last tie-break of claim order, so a batch keeps its order: they are drawn in the batch's order.
    The keyed jobs are inserted in key order: every statement then takes the keys it waits on (a key inserted
    by a transaction still in flight) in one global order, so two batches holding the same keys in different
    orders cannot wait on each other in a cycle (a deadlock: one would fail); of equal keys, the first wins.
    On Citus a VALUES list is inserted, and draws its ids, in its own order: it serves batches of at most
    VALUES_MAX jobs whose keyed jobs already come in key order (no keys, one job, keys in order); the others
    take their ids first and are inserted in key order, in chunks (_citus_insert). JOB_INSERT_BATCH, which draws
    ids in the batch's order and inserts in key order, serves every enqueue on plain PostgreSQL."""
    cur = conn.cursor(row_factory=rows_of(JobRow))
    keyed = [i for i in todo if jobs[i].idempotency_key is not None] if len(todo) <= VALUES_MAX else []
    in_order = all(
        (_c_order(jobs[a].queue), _c_order(jobs[a].idempotency_key))
        <= (_c_order(jobs[b].queue), _c_order(jobs[b].idempotency_key))
        for a, b in pairwise(keyed)
    )
    citus = finishing.on_citus(conn)
    if len(todo) <= VALUES_MAX and in_order and citus:
        params: dict[str, Any] = {}
        for k, i in enumerate(todo):
            _row_params(k, jobs[i], params)
        await cur.execute(_values_sql(tuple(_shape(jobs[i]) for i in todo), full), params)
        rows = await cur.fetchall()
    elif citus:
        rows = await _citus_insert(conn, jobs, todo, full)
    elif len(todo) >= COPY_MIN and all(jobs[i].idempotency_key is None for i in todo):
        for i, copied in zip(todo, await _copy_insert(conn, [jobs[i] for i in todo], full), strict=True):
            out[i] = Inserted(True, copied)
        return []
    else:
        batch = [_job_doc(n, jobs[i]) for n, i in enumerate(todo)]
        await cur.execute(JOB_INSERT_BATCH["full" if full else "brief"], {"batch": as_json(batch)})
        rows = await cur.fetchall()
    by_key = {(r.queue, r.idempotency_key): r for r in rows if r.idempotency_key is not None}
    unkeyed = iter(sorted((r for r in rows if r.idempotency_key is None), key=lambda r: r.id))
    taken = []
    for i in todo:
        job = jobs[i]
        if job.idempotency_key is None:
            out[i] = Inserted(True, next(unkeyed))
        elif (row := by_key.pop((job.queue, job.idempotency_key), None)) is not None:
            out[i] = Inserted(True, row)
        else:
            taken.append(i)
    if not taken:
        return []
    existing = {(r.queue, r.idempotency_key): r for r in await _by_keys(conn, [jobs[i] for i in taken])}
    left = []
    for i in taken:
        found = existing.get((jobs[i].queue, jobs[i].idempotency_key))
        if found is None:
            left.append(i)
        else:
            out[i] = Inserted(False, found)
    return left


# --- unique jobs ---------------------------------------------------------------------------------------------

# A unique job's key and window start, from its input row `t` (docs/producers.md). The key defaults to a
# hash of the payload as jsonb prints it (keys sorted, whitespace normalised: the same JSON value gives the
# same key however it was written); the queue is the index's first column. Windows are aligned, as River's
# ByPeriod and pg-boss's singletonSeconds are: for_seconds=3600 means clock hours (UTC), each window starts at
# a multiple of for_seconds since the Unix epoch, on the database's clock. '-infinity': no window.
_UNIQUE_KEY = "coalesce(t.unique_key, encode(sha256(convert_to(coalesce(t.payload, 'null')::text, 'UTF8')), 'hex'))"
_UNIQUE_FROM = (
    "CASE WHEN t.unique_for IS NULL THEN '-infinity'::timestamptz "
    "ELSE to_timestamp(floor(extract(epoch FROM now())::float8 / t.unique_for) * t.unique_for) END"
)
_UNIQUE_INPUT = """json_to_recordset(%(batch)s::json)
    AS t(ord int, queue_name text, payload jsonb, priority int, run_at timestamptz, delay float8,
         max_attempts int, idempotency_key text, traceparent text, group_key text, timeout_seconds int,
         is_unique bool, unique_key text, unique_for int, unique_states text[])"""

JOB_INSERT_UNIQUE = f"""
WITH input AS (
  -- As JOB_INSERT_BATCH, for a batch in which some job is unique: its own statement, so that the shared one
  -- stays as it is for every other enqueue. Ids in input order; each input row keeps its id, and the answer
  -- is one row per input, in order, with the job when this statement inserted it.
  SELECT t.*, nextval({_JOBS_SEQ}) AS id,
         CASE WHEN t.is_unique THEN {_UNIQUE_KEY} END AS ukey,
         CASE WHEN t.is_unique THEN {_UNIQUE_FROM} END AS ufrom
  FROM {_UNIQUE_INPUT}
  ORDER BY ord
), inserted AS (
  INSERT INTO jobq.jobs AS j (id, queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent,
                         group_key, timeout_seconds, unique_key, unique_from, unique_for_seconds, unique_states)
  OVERRIDING SYSTEM VALUE
  SELECT id, queue_name, coalesce(payload, 'null'), priority,
         coalesce(run_at, now() + make_interval(secs => coalesce(delay, 0))),
         max_attempts, idempotency_key, traceparent, group_key, timeout_seconds,
         ukey, ufrom, CASE WHEN is_unique THEN unique_for END, CASE WHEN is_unique THEN unique_states END
  FROM input
  -- Keys in one global order (see JOB_INSERT_BATCH: no deadlock between batches); the first of equal keys wins.
  ORDER BY queue_name COLLATE "C", idempotency_key COLLATE "C", ukey COLLATE "C", ufrom, ord
  -- A key taken (an idempotency key, or a unique key in this window by a job in one of its states): insert
  -- nothing, the caller looks the job up. Without a target, both unique indexes are arbiters; a job has at
  -- most one of the two keys (the API refuses both).
  ON CONFLICT DO NOTHING
  RETURNING {JOB_COLUMNS}
)
SELECT i.ord, j.id IS NOT NULL AS created, j.* FROM input i LEFT JOIN inserted j ON j.id = i.id ORDER BY i.ord
"""

JOB_GET_BY_UNIQUE = f"""
-- The jobs holding these unique keys in the window that is current now, one lookup each through
-- jobs_unique_idx (the restriction repeats its predicate; OFFSET 0 keeps each lookup a lookup). A holder that
-- finished or was deleted since the insert is not found here: the caller inserts again. (The window cannot turn
-- in between: the caller runs both in one transaction, and the window is taken from its now().) The jobs of
-- one queue per statement: on Citus, a router query on that queue's shard.
SELECT t.ord, false AS created, j.*
FROM {_UNIQUE_INPUT}
CROSS JOIN LATERAL (
  SELECT {JOB_COLUMNS} FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.unique_key = {_UNIQUE_KEY} AND j.unique_from = {_UNIQUE_FROM}
    AND coalesce(j.unique_for_seconds, 0) = coalesce(t.unique_for, 0)
    AND j.unique_key IS NOT NULL AND j.status = ANY(j.unique_states)
  OFFSET 0
) j
"""


def _unique_batch(jobs: Sequence[NewJob], todo: Sequence[int]) -> str:
    return as_json(
        [
            {
                **_job_doc(i, j),
                "is_unique": j.unique is not None,
                "unique_key": j.unique.key if j.unique else None,
                "unique_for": j.unique.for_seconds if j.unique else None,
                "unique_states": list(j.unique.states) if j.unique else None,
            }
            for i, j in ((i, jobs[i]) for i in todo)
        ]
    )


async def jobs_insert_unique(conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob]) -> list[Inserted]:
    """As jobs_insert, for a batch in which some jobs are unique: a unique job whose key is held (in its
    window, by a job in one of its states) comes back as not created, with the job that holds it, also when
    the same key occurs twice here. One statement when every job is new."""
    out: list[Inserted | None] = [None] * len(jobs)
    todo = list(range(len(jobs)))
    cur = conn.cursor(row_factory=outcome_rows(Made, JobRow))
    citus = finishing.on_citus(conn)
    for _ in range(3):  # the holder gone between INSERT and SELECT (finished, deleted): again
        if citus:
            made = await _citus_insert_unique(conn, jobs, todo)
        else:
            await cur.execute(JOB_INSERT_UNIQUE, {"batch": _unique_batch(jobs, todo)})
            made = await cur.fetchall()
        taken = []
        for row in made:
            if row.job is not None:
                out[row.ord] = Inserted(True, row.job)
            else:
                taken.append(row.ord)
        keyed = [i for i in taken if jobs[i].unique is None]
        if keyed:  # idempotency keys
            by_key = {(r.queue, r.idempotency_key): r for r in await _by_keys(conn, [jobs[i] for i in keyed])}
            for i in keyed:
                if (job := by_key.get((jobs[i].queue, jobs[i].idempotency_key))) is not None:
                    out[i] = Inserted(False, job)
        held = [i for i in taken if jobs[i].unique is not None]
        for queue in dict.fromkeys(jobs[i].queue for i in held):  # one statement per queue (in practice one)
            of_queue = [i for i in held if jobs[i].queue == queue]
            await cur.execute(JOB_GET_BY_UNIQUE, {"queue": queue, "batch": _unique_batch(jobs, of_queue)})
            for found in await cur.fetchall():
                if found.job is not None:
                    out[found.ord] = Inserted(False, found.job)
        todo = [i for i in taken if out[i] is None]
        if not todo:
            return [o for o in out if o is not None]
    raise RuntimeError("a unique key kept vanishing between insert and lookup")


# --- on Citus: a batch the VALUES list above does not serve, unique jobs --------------------------------------
# Citus runs an INSERT ... SELECT (JOB_INSERT_BATCH, JOB_INSERT_UNIQUE) through the coordinator: the rows go to
# each shard named, then are inserted there, a few round trips. On connections where finishing.on_citus holds,
# those enqueues send VALUES lists instead, each a router INSERT (one task on the queue's shard):
#   * the ids first, drawn in the batch's order (and, for unique jobs, each job's unique key and window) by
#     CITUS_IDS or CITUS_UNIQUE_IDS, which read no table: the coordinator answers them alone;
#   * then the rows with those ids, in key order (as JOB_INSERT_BATCH: the keys a statement waits on are taken
#     in one global order, so two batches cannot wait on each other in a cycle), at most CHUNK rows a statement
#     (a statement takes at most 65,535 parameters; the cached texts stay small), in one transaction: the batch
#     is still all or nothing.
# Every row has the same form (an unset field is NULL, which is every optional column's default; no run time is
# now()), so a statement's text depends on its number of rows only.
CHUNK = 500

CITUS_IDS = f"""
-- On Citus: ids for a batch of n jobs, in order, from the jobs' identity sequence (no table read).
SELECT nextval({_JOBS_SEQ}) AS id FROM generate_series(1, %(n)s) ORDER BY 1
"""

CITUS_UNIQUE_IDS = f"""
-- On Citus: ids for a batch with unique jobs, in input order, and each unique job's key and window start (as
-- JOB_INSERT_UNIQUE computes them; the window as text, '-infinity' for none). No table read; the insert that
-- follows, in the same transaction, has the same now().
SELECT t.ord, nextval({_JOBS_SEQ}) AS id,
       CASE WHEN t.is_unique THEN {_UNIQUE_KEY} END AS ukey,
       CASE WHEN t.is_unique THEN ({_UNIQUE_FROM})::text END AS ufrom
FROM {_UNIQUE_INPUT}
ORDER BY ord
"""

_CITUS_ROW = (
    "(%(i{k})s::bigint, %(q{k})s::text, %(p{k})s::jsonb, %(pr{k})s::int, "
    "coalesce(%(r{k})s::timestamptz, now() + make_interval(secs => coalesce(%(d{k})s::float8, 0))), "
    "%(m{k})s::int, %(k{k})s::text, %(t{k})s::text, %(g{k})s::text, %(o{k})s::int"
)
_CITUS_UNIQUE_CELLS = ", %(uk{k})s::text, %(uf{k})s::timestamptz, %(us{k})s::int, %(ut{k})s::text[]"


@lru_cache(maxsize=64)
def citus_insert_values(n: int, full: bool = True, unique: bool = False) -> str:
    """On Citus: the insert of n rows with their ids (CITUS_IDS), one task on their queue's shard. unique: with
    each job's unique key, window and states; a key taken (an idempotency key, or a unique key in this window)
    inserts nothing, and only ids come back (the caller reads the rows made: Citus allows no STABLE function,
    such as json_build_object, in a RETURNING clause)."""
    cells = _CITUS_ROW + (_CITUS_UNIQUE_CELLS if unique else "") + ")"
    rows = ",\n       ".join(cells.format(k=k) for k in range(n))
    columns = _INSERT_COLUMNS + (", unique_key, unique_from, unique_for_seconds, unique_states" if unique else "")
    if unique:
        tail = """-- Without a target, both unique indexes are arbiters; a job has at most one of the two keys.
ON CONFLICT DO NOTHING
RETURNING j.id"""
    else:
        tail = f"""-- A key already taken on this queue: insert nothing, the caller fetches the existing job.
ON CONFLICT (queue_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {job_columns("true" if full else "false", keyed=False)}"""
    return f"""
INSERT INTO jobq.jobs AS j (id, {columns})
OVERRIDING SYSTEM VALUE
VALUES {rows}
{tail}
"""


# On Citus, the statements for one job (sql/jobs.sql shows them): a chunk has a row per job.
JOB_INSERT_CITUS_ONE = citus_insert_values(1)
JOB_INSERT_UNIQUE_CITUS_ONE = citus_insert_values(1, unique=True)

JOBS_GET_MADE = f"""
-- On Citus: the jobs of one queue that a unique enqueue just made, by id (one task on the queue's shard).
SELECT {JOB_COLUMNS} FROM jobq.jobs j WHERE j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[])
"""


def _citus_params(k: int, job_id: int, job: NewJob, params: dict[str, Any]) -> None:
    """Row k's parameters in citus_insert_values."""
    params[f"i{k}"], params[f"q{k}"], params[f"p{k}"], params[f"pr{k}"] = job_id, job.queue, job.payload, job.priority
    params[f"r{k}"], params[f"d{k}"], params[f"m{k}"] = job.run_at, job.delay_seconds, job.max_attempts
    params[f"k{k}"], params[f"t{k}"], params[f"g{k}"] = job.idempotency_key, job.traceparent, job.group
    params[f"o{k}"] = job.timeout_seconds


def _key_order(jobs: Sequence[NewJob], todo: Sequence[int]) -> list[int]:
    """todo in the order JOB_INSERT_BATCH inserts: queue, idempotency key, input order, in COLLATE "C" (NULLs last,
    as PostgreSQL sorts them)."""
    return sorted(todo, key=lambda i: _unique_order(jobs[i], (None, None), i))


def _unique_order(job: NewJob, ukey: tuple[str | None, str | None], i: int) -> tuple[Any, ...]:
    """A job's place in the order JOB_INSERT_UNIQUE inserts: queue, idempotency key, unique key, window start,
    input order (COLLATE "C", NULLs last; the window as text, which orders one key's windows as time does)."""
    key, (unique_key, start) = job.idempotency_key, ukey
    return (_c_order(job.queue), key is None, _c_order(key), unique_key is None, _c_order(unique_key),
            start is None, _c_order(start), i)  # fmt: skip


async def _citus_chunks(
    conn: psycopg.AsyncConnection[Any],
    jobs: Sequence[NewJob],
    order: Sequence[int],
    ids: dict[int, int],
    full: bool,
    unique: dict[int, tuple[str | None, str | None]] | None = None,
) -> list[Any]:
    """On Citus: insert jobs[order] with their ids, CHUNK rows a statement; more than one statement: in one
    transaction (a savepoint in the caller's, if any), so that the batch is all or nothing. The rows returned."""
    cur = conn.cursor(row_factory=psycopg.rows.tuple_row if unique is not None else rows_of(JobRow))
    rows: list[Any] = []
    async with conn.transaction() if len(order) > CHUNK else contextlib.nullcontext():
        for start in range(0, len(order), CHUNK):
            chunk = order[start : start + CHUNK]
            params: dict[str, Any] = {}
            for k, i in enumerate(chunk):
                _citus_params(k, ids[i], jobs[i], params)
                if unique is not None:
                    u = jobs[i].unique
                    params[f"uk{k}"], params[f"uf{k}"] = unique.get(i, (None, None))
                    params[f"us{k}"] = u.for_seconds if u is not None else None
                    params[f"ut{k}"] = list(u.states) if u is not None else None
            await cur.execute(citus_insert_values(len(chunk), full, unique is not None), params)
            rows += await cur.fetchall()
    return rows


async def _citus_insert(
    conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob], todo: Sequence[int], full: bool
) -> list[JobRow]:
    """On Citus, jobs[todo] that a single VALUES list does not serve: ids drawn in the batch's order (CITUS_IDS),
    rows inserted in key order. The rows made."""
    cur = conn.cursor()
    await cur.execute(CITUS_IDS, {"n": len(todo)})
    ids = dict(zip(todo, [r[0] for r in await cur.fetchall()], strict=True))
    return await _citus_chunks(conn, jobs, _key_order(jobs, todo), ids, full)


async def _citus_insert_unique(
    conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob], todo: Sequence[int]
) -> list[Made]:
    """On Citus, JOB_INSERT_UNIQUE's answer for jobs[todo] (in a transaction: the caller's): ids and unique keys
    and windows first (CITUS_UNIQUE_IDS), the rows in key order, then the jobs made read back (JOBS_GET_MADE)."""
    cur = conn.cursor()
    await cur.execute(CITUS_UNIQUE_IDS, {"batch": _unique_batch(jobs, todo)})
    ids: dict[int, int] = {}
    ukeys: dict[int, tuple[str | None, str | None]] = {}
    for ord_, job_id, ukey, ufrom in await cur.fetchall():
        ids[ord_] = job_id
        ukeys[ord_] = (ukey, ufrom)
    order = sorted(todo, key=lambda i: _unique_order(jobs[i], ukeys[i], i))
    made = {r[0] for r in await _citus_chunks(conn, jobs, order, ids, True, ukeys)}
    found: dict[int, JobRow] = {}
    by_queue: dict[str, list[int]] = {}
    for i in todo:
        if ids[i] in made:
            by_queue.setdefault(jobs[i].queue, []).append(ids[i])
    get = conn.cursor(row_factory=rows_of(JobRow))
    for queue, of_queue in by_queue.items():  # one statement per queue (in practice one)
        await get.execute(JOBS_GET_MADE, {"queue": queue, "ids": of_queue})
        found |= {r.id: r for r in await get.fetchall()}
    return [Made(i, ids[i] in made, found.get(ids[i])) for i in todo]


async def _by_keys(conn: psycopg.AsyncConnection[Any], jobs: Sequence[NewJob]) -> list[JobRow]:
    """The jobs holding the idempotency keys of `jobs`: one statement per queue (in practice one: a request
    enqueues to one queue, and only batches that share a statement mix queues)."""
    by_queue: dict[str, list[str | None]] = {}
    for j in jobs:
        by_queue.setdefault(j.queue, []).append(j.idempotency_key)
    cur = conn.cursor(row_factory=rows_of(JobRow))
    found: list[JobRow] = []
    for queue, keys in by_queue.items():
        await cur.execute(JOB_GET_BY_KEYS, {"queue": queue, "keys": as_json(keys)})
        found += await cur.fetchall()
    return found
