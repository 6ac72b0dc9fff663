"""Enqueue inside your own database transaction (the server's docs/producers.md, "Enqueue from SQL, in your own
transaction"): the job commits if and only if your transaction does, as River's `InsertTx` or Oban's insert in
a `Repo.transaction`. These call the SQL functions jobq's migrations install (`jobq.enqueue`,
`jobq.enqueue_batch`) through the connection or cursor you are already using; they need no HTTP and no client.

    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("INSERT INTO orders (id) VALUES (%s)", (42,))
        job_id = enqueue_in_transaction(conn, "emails", {"order": 42}, delay_seconds=10)

`db` is anything with `execute(sql, params)` and the `%s` parameter style: a psycopg 3 connection or cursor, a
psycopg2 cursor, an SQLAlchemy `connection.connection.cursor()`. A refusal is a database error (SQLSTATE 22023
for a bad argument, JQ429 for a full queue: the server's docs) and aborts your transaction, as any failed
statement does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from jobq_client.models import Debounce, NewJob, OnDependencyFailure, Unique

_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# The parameters of jobq.enqueue (migrations/0045_sql_enqueue.sql) and their types.
_TYPES = {
    "priority": "integer",
    "run_at": "timestamptz",
    "delay_seconds": "double precision",
    "max_attempts": "integer",
    "idempotency_key": "text",
    "group_key": "text",
    "depends_on": "bigint[]",
    "on_dependency_failure": "text",
    "timeout_seconds": "integer",
    "unique_job": "boolean",
    "unique_key": "text",
    "unique_for_seconds": "integer",
    "unique_while": "text[]",
    "debounce_key": "text",
    "debounce_seconds": "double precision",
    "debounce_max_wait_seconds": "double precision",
}


class Executes(Protocol):
    def execute(self, query: Any, params: Any = ..., /) -> Any: ...


def enqueue_in_transaction(
    db: Executes,
    queue: str,
    payload: Any,
    *,
    priority: int | None = None,
    run_at: datetime | str | None = None,
    delay_seconds: float | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    group: str | None = None,
    depends_on: Sequence[int] | None = None,
    on_dependency_failure: OnDependencyFailure | None = None,
    timeout_seconds: int | None = None,
    unique: Unique | Mapping[str, Any] | bool | None = None,
    debounce: Debounce | Mapping[str, Any] | None = None,
    schema: str = "jobq",
) -> int:
    """Make one job in `db`'s transaction; its id (the existing job's on an idempotency or unique hit, the
    replaced one's on a debounce). `unique=True` (or `Unique()`) keys on the payload's hash. `schema`: jobq's
    (JOBQ_DB_SCHEMA)."""
    args: dict[str, Any] = {
        "priority": priority,
        "run_at": run_at.isoformat() if isinstance(run_at, datetime) else run_at,
        "delay_seconds": delay_seconds,
        "max_attempts": max_attempts,
        "idempotency_key": idempotency_key,
        "group_key": group,
        "depends_on": list(depends_on) if depends_on is not None else None,
        "on_dependency_failure": on_dependency_failure,
        "timeout_seconds": timeout_seconds,
    }
    if unique is not None and unique is not False:
        doc = {} if unique is True else unique.to_json() if isinstance(unique, Unique) else dict(unique)
        args.update(
            unique_job=True,
            unique_key=doc.get("key"),
            unique_for_seconds=doc.get("for_seconds"),
            unique_while=list(doc["while"]) if doc.get("while") is not None else None,
        )
    if debounce is not None:
        doc = debounce.to_json() if isinstance(debounce, Debounce) else dict(debounce)
        args.update(
            debounce_key=doc.get("key"),
            debounce_seconds=doc.get("seconds"),
            debounce_max_wait_seconds=doc.get("max_wait_seconds"),
        )
    given = {name: value for name, value in args.items() if value is not None}
    named = "".join(f", {name} => %s::{_TYPES[name]}" for name in given)
    query = f"SELECT {_schema(schema)}.enqueue(%s::text, %s::jsonb{named})"
    return int(_one(db, query, [queue, json.dumps(payload), *given.values()]))


def enqueue_batch_in_transaction(
    db: Executes, queue: str, jobs: Sequence[NewJob | Mapping[str, Any]], *, schema: str = "jobq"
) -> list[int]:
    """Make a batch of jobs in `db`'s transaction, all or none; their ids in the batch's order. Items are
    `NewJob`s or the HTTP batch's item documents (`ref` and `depends_on` by ref included)."""
    items = [job.to_json() if isinstance(job, NewJob) else dict(job) for job in jobs]
    query = f"SELECT {_schema(schema)}.enqueue_batch(%s::text, %s::jsonb)"
    return [int(i) for i in _one(db, query, [queue, json.dumps(items)])]


def _schema(name: str) -> str:
    if not _SCHEMA.match(name):
        raise ValueError(f"{name!r} is not a schema name jobq accepts (lower-case letters, digits and _)")
    return name


def _one(db: Executes, query: str, params: list[Any]) -> Any:
    result: Any = db.execute(query, params)
    cursor: Any = result if hasattr(result, "fetchone") else db  # psycopg 3 returns the cursor, psycopg2 None
    return cursor.fetchone()[0]
