"""Where jobq's tables live: a schema of their own (`jobq` unless JOBQ_DB_SCHEMA names another), so that an
application sharing the database keeps its own `jobs` or `workers` table, and never through `search_path`.

Every statement of app/db names its tables schema-qualified, as `jobq.<table>`. A process whose tables are in
another schema rewrites that qualifier as it sends a statement (`SchemaCursor`, set on each of its connections;
a process on the default schema sends every statement as written and pays nothing). Two cases need it:

- JOBQ_DB_SCHEMA names another schema;
- an installation older than 1.2.0 keeps its tables in `public` until an operator moves them
  (`jobq migrate --move-into-schema`, docs/deployment.md#moving-into-a-schema): a release that moved them
  itself would break the previous release's processes still serving beside it (a rolling upgrade). Such a
  process finds them in `public` at start, and finds them again in the configured schema when a statement
  names a table that is no longer there (the move committed meanwhile): that request is answered 503, the
  next ones are served.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import sql

DEFAULT = "jobq"
LEGACY = "public"  # where releases before 1.2.0 made the tables
NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# The qualifier as app/db writes it: `jobq.` before a name, not part of a longer word or a quoted name.
_QUALIFIER = re.compile(r"(?<![\w.\"$])jobq\.(?=[a-z_])")

# Every table jobq makes (migrations/), which a move carries into the schema (with their indexes, sequences
# and constraints).
TABLES = (
    "jobq_migrations",
    "jobs",
    "queue_state",
    "queue_counts",
    "queue_stats",
    "queue_stats_hourly",
    "queue_claims",
    "api_keys",
    "schedules",
    "job_dependencies",
    "dependency_releases",
    "stats_samples",
    "sqs_queues",
    "sqs_messages",
    "sqs_dedup",
    "workers",
    "worker_minutes",
    "queue_live_counts",
    "queue_live_groups",
    "live_counts_clock",
)


def valid(name: str) -> str:
    """A schema name jobq accepts: a lower-case SQL identifier that needs no quoting."""
    if not NAME.match(name) or name.startswith("pg_"):
        raise ValueError(f"{name!r}: a schema name is lower-case letters, digits and _, not starting with pg_")
    return name


@lru_cache(maxsize=4096)
def _renamed(query: str, schema: str) -> str:
    return _QUALIFIER.sub(schema + ".", query)


def rename(query: str, schema: str) -> str:
    """A statement as written in app/db, for tables in `schema`."""
    return query if schema == DEFAULT else _renamed(query, schema)


class Location:
    """The schema this process finds jobq's tables in: the configured one, or `public` before a move."""

    def __init__(self, configured: str = DEFAULT) -> None:
        self.configured = valid(configured)
        self.current = self.configured
        self._cursors: dict[str, Any] = {}

    @property
    def renaming(self) -> bool:
        return self.current != DEFAULT

    def found(self, schema: str) -> None:
        self.current = schema

    def rename(self, query: Any) -> Any:
        schema = self.current
        if schema == DEFAULT:
            return query
        if isinstance(query, str):
            return _renamed(query, schema)
        # bytes: a migration file's statement (app/db/migrate.py), which names no schema and runs with the
        # migration session's search_path; a sql.Composed names its identifiers itself.
        return query


# What one query answers: where are the tables (the configured schema wins; public only when it holds them
# and the configured one does not).
WHERE = (
    "SELECT to_regclass(format('%%I.jobq_migrations', %(configured)s::text)) IS NOT NULL,"
    " to_regclass('public.jobq_migrations') IS NOT NULL"
)


def choose(configured: str, row: tuple[Any, ...] | None) -> str:
    in_configured, in_public = (bool(row[0]), bool(row[1])) if row else (False, False)
    return LEGACY if in_public and not in_configured else configured


def where_sync(conn: psycopg.Connection[Any], configured: str) -> str:
    return choose(configured, conn.execute(WHERE, {"configured": configured}).fetchone())


async def where(conn: psycopg.AsyncConnection[Any], configured: str) -> str:
    cur = await conn.execute(WHERE, {"configured": configured})
    return choose(configured, await cur.fetchone())


def cursor_class(location: Location) -> type[psycopg.AsyncCursor[Any]]:
    """An async cursor that sends app/db's statements for the tables' schema."""

    class SchemaCursor(psycopg.AsyncCursor[Any]):
        async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            return await super().execute(location.rename(query), params, **kwargs)

        async def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
            await super().executemany(location.rename(query), params_seq, **kwargs)

        def copy(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
            return super().copy(location.rename(statement), params, **kwargs)

    return SchemaCursor


def sync_cursor_class(location: Location) -> type[psycopg.Cursor[Any]]:
    class SchemaCursor(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            return super().execute(location.rename(query), params, **kwargs)

        def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
            super().executemany(location.rename(query), params_seq, **kwargs)

    return SchemaCursor


def use(conn: psycopg.AsyncConnection[Any], location: Location) -> None:
    """Make a connection send app/db's statements for `location` (nothing to do on the default schema: the
    tables never move away from it, only into it)."""
    if location.renaming:
        if "async" not in location._cursors:
            location._cursors["async"] = cursor_class(location)
        conn.cursor_factory = location._cursors["async"]


def use_sync(conn: psycopg.Connection[Any], location: Location) -> None:
    if location.renaming:
        if "sync" not in location._cursors:
            location._cursors["sync"] = sync_cursor_class(location)
        conn.cursor_factory = location._cursors["sync"]


def create(schema: str) -> sql.Composed:
    return sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(valid(schema)))
