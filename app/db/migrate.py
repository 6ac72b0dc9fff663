"""Schema migrations: ordered SQL files applied once each, under an advisory lock, recorded in a table.

A file runs in one transaction, unless its first line is `-- jobq: no-transaction`: then each of its
statements runs on its own, outside any transaction. That is how an index is built on a big table without
stopping writes (`CREATE INDEX CONCURRENTLY`, which cannot run inside a transaction). Such a file is
re-run from its first statement when a run stopped half-way, so each statement must be idempotent (`IF
NOT EXISTS`); an index a stopped `CONCURRENTLY` build left invalid is dropped and built again.

No statement waits long for a lock (a rolling upgrade migrates under load: docs/deployment.md). An `ALTER
TABLE jobq.jobs` queued behind a long transaction would make every enqueue and claim queue behind it in turn,
however short the ALTER itself: so every statement runs with `lock_timeout` (JOBQ_MIGRATION_LOCK_TIMEOUT_MS),
and one that times out is rolled back and tried again, with a pause, until JOBQ_MIGRATION_LOCK_WAIT_SECONDS
have passed (a transactional file from its start). `CREATE/DROP INDEX CONCURRENTLY` waits as long as it must:
it blocks no enqueue or claim while it waits. What a migration may hold, and for how long, is checked
statement by statement on every new file by tests/unit/test_migration_safety.py."""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from app.db import distribute
from app.db import schema as schemas

log = logging.getLogger("jobq.migrate")

# Any constant works; it only has to be the same in every jobq process sharing the database.
MIGRATION_LOCK_KEY = 0x6A6F6271  # "jobq"
LOCK_TIMEOUT_MS = 500  # defaults of JOBQ_MIGRATION_LOCK_TIMEOUT_MS and JOBQ_MIGRATION_LOCK_WAIT_SECONDS
LOCK_WAIT_SECONDS = 300.0
_RETRY_FIRST, _RETRY_MAX = 0.2, 5.0  # seconds between two tries of a statement that timed out on a lock
_WAITS_ITS_TURN = re.compile(
    r"^(?:CREATE\s+(?:UNIQUE\s+)?INDEX|DROP\s+INDEX|REINDEX)\s+.*?\bCONCURRENTLY\b", re.I | re.S
)
_FILE_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_NO_TRANSACTION = "-- jobq: no-transaction"
# A file that makes objects only jobq's own schema may hold (SECURITY DEFINER functions: in a schema others
# may create objects in, such as public on many databases, an overload could run as their owner). While an
# installation made by 1.1.0 or earlier keeps its tables in public, it is not applied (nor counted missing);
# the move into the schema applies it.
_OWN_SCHEMA = "-- jobq: own-schema"
_CONCURRENT_INDEX = re.compile(
    r"^CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\"?[A-Za-z_][A-Za-z0-9_]*\"?)", re.I
)

MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS jobq.jobq_migrations (
  version    integer PRIMARY KEY,
  name       text        NOT NULL,
  checksum   text        NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)
"""


# Releases before comment-insensitive checksums recorded the SHA-256 of a file's whole text. These are
# the whole-text checksums of migration files whose comments were edited since (to name moved modules):
# their statements are those of today's files, so a database that recorded one of them is current.
_EARLIER_TEXTS: dict[int, frozenset[str]] = {
    1: frozenset({"403b30be616c1085bbee48dbf5d10d9a98736536cee50d411636dc985254524a"}),
    2: frozenset({"363a4755b4537d1139231a0f4ee760c9f3b8022599beeda985e2c48f3a595efb"}),
    3: frozenset({"d4cf7bdf02f3eefa4ea3de9669bd7549410d4a8a2a794294286d60bdbb7564c6"}),
    7: frozenset({"c8e9632824f38c8572e7517c378e1a9a9a60fa46c0ddf8e4aec54922c91cd040"}),
}
_SQL_TOKEN = re.compile(
    # a quoted string, a quoted identifier, a dollar-quoted body, a comment, whitespace, other text
    r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|(\$\w*\$).*?\1|--[^\n]*|/\*.*?\*/|\s+|[^'\"$\s/;-]+|.",
    re.S,
)


class MigrationError(RuntimeError):
    pass


def split_statements(sql: str) -> list[str]:
    """The statements of a file, split on `;` outside quotes, comments and dollar-quoted bodies."""
    parts: list[str] = []
    current: list[str] = []
    for m in _SQL_TOKEN.finditer(sql):
        token = m.group(0)
        if token == ";":
            parts.append("".join(current))
            current = []
        elif not token.startswith("--") and not token.startswith("/*"):
            current.append(token)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def statements(sql: str) -> str:
    """The SQL without its comments, whitespace collapsed: what a checksum covers, so that a comment can be
    corrected in an applied migration while a changed statement is still refused. Quoted strings,
    identifiers and dollar-quoted bodies are kept as they are."""
    out = []
    for m in _SQL_TOKEN.finditer(sql):
        token = m.group(0)
        if token.startswith("--") or token.startswith("/*") or token.isspace():
            out.append(" ")
        else:
            out.append(token)
    return re.sub(r" +", " ", "".join(out)).strip()


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(statements(self.sql).encode()).hexdigest()

    @property
    def transactional(self) -> bool:
        return not self.sql.startswith(_NO_TRANSACTION)

    @property
    def own_schema(self) -> bool:
        return self.sql.startswith(_OWN_SCHEMA)

    def recorded_as_applied(self, recorded: str) -> bool:
        """Whether a checksum in jobq_migrations stands for this file's statements: today's form, or the
        whole-text form older releases recorded (of this text, or of an earlier text with other comments)."""
        whole_text = hashlib.sha256(self.sql.encode()).hexdigest()
        return recorded in (self.checksum, whole_text) or recorded in _EARLIER_TEXTS.get(self.version, ())


def migrations_dir() -> Path:
    """The installed copy (wheel) or the repository's migrations/ (source checkout, editable install)."""
    package = Path(__file__).parent.parent  # app/
    packaged = package / "migrations"
    return packaged if packaged.is_dir() else package.parent / "migrations"


def load_migrations(directory: Path | None = None) -> list[Migration]:
    directory = directory or migrations_dir()
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: migration files are named NNNN_lower_snake.sql")
        found.append(Migration(int(match.group(1)), path.name, path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {directory}")
    return found


def applied_versions(conn: psycopg.Connection) -> dict[int, str]:
    """version -> checksum of what the database has applied; empty when it never ran a migration."""
    exists = conn.execute("SELECT to_regclass('jobq.jobq_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    return dict(conn.execute("SELECT version, checksum FROM jobq.jobq_migrations").fetchall())


def pending_migrations(conn: psycopg.Connection, directory: Path | None = None) -> list[Migration]:
    applied = applied_versions(conn)
    todo = []
    for m in load_migrations(directory):
        if m.version not in applied:
            todo.append(m)
        elif not m.recorded_as_applied(applied[m.version]):
            raise MigrationError(f"{m.name} was changed after it was applied; add a new migration instead")
    return todo


# Roles other than its owner that may create objects in jobq's schema. jobq's SECURITY DEFINER functions (enqueue
# from SQL) run as their owner and call built-ins; an overload of one made in the schema by another role could
# match a call better than the built-in and run in its place, as the owner.
OTHERS_WHO_CREATE = """
SELECT coalesce(string_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END, ', '), '')
FROM pg_namespace n, aclexplode(n.nspacl) a
WHERE n.oid = to_regnamespace(%s) AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner
"""

RECORD_MIGRATION = "INSERT INTO jobq.jobq_migrations (version, name, checksum) VALUES (%s, %s, %s)"

# Who holds what a migration statement could not lock in time: the oldest transactions of the database.
LOCK_HOLDERS = """
SELECT pid, extract(epoch FROM now() - xact_start)::int AS seconds, state, left(query, 80) AS query
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
ORDER BY xact_start
LIMIT 3
"""

# An index left invalid by a CREATE INDEX CONCURRENTLY that did not finish (the runner stopped, a
# duplicate broke a unique build): IF NOT EXISTS would keep it, and it would never be used.
INVALID_INDEX = "SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)"


def _lock(conn: psycopg.Connection) -> None:
    """The migration lock, asked for without waiting inside a statement: a CREATE INDEX CONCURRENTLY of
    the process that holds it waits for every statement older than its own to end, and a statement
    blocked in pg_advisory_lock() would never end."""
    while not conn.execute("SELECT pg_try_advisory_lock(%s)", (MIGRATION_LOCK_KEY,)).fetchone()[0]:  # type: ignore[index]
        time.sleep(0.2)


class _LockWait:
    """How long one file has waited for locks so far, and the pause before its next try."""

    def __init__(self, name: str, timeout_ms: int, wait_seconds: float) -> None:
        self.name = name
        self.timeout_ms = timeout_ms
        self.deadline = time.monotonic() + wait_seconds
        self.wait_seconds = wait_seconds
        self.pause = _RETRY_FIRST
        self.tries = 0

    def failed(self, conn: psycopg.Connection, exc: psycopg.errors.LockNotAvailable) -> None:
        """A statement timed out on a lock: pause before the next try, or give up past the deadline."""
        self.tries += 1
        holders = "; ".join(
            f"pid {pid} in a transaction for {seconds}s ({state}: {query!r})"
            for pid, seconds, state, query in conn.execute(LOCK_HOLDERS).fetchall()
        )
        if time.monotonic() + self.pause > self.deadline:
            raise MigrationError(
                f"{self.name}: could not take its locks within {self.timeout_ms} ms in {self.tries} tries over "
                f"{self.wait_seconds:g}s (JOBQ_MIGRATION_LOCK_WAIT_SECONDS): a long transaction holds them. "
                f"Oldest transactions: {holders or 'none now'}. End it (pg_terminate_backend) or run `jobq migrate` "
                "again later; nothing of this file was applied."
            ) from exc
        log.warning(
            "%s: a lock was not free within %d ms (%s); trying again in %.1fs so that enqueues and claims do not "
            "queue behind the migration. Oldest transactions: %s",
            self.name, self.timeout_ms, str(exc).strip(), self.pause, holders or "none now",
        )  # fmt: skip
        time.sleep(self.pause)
        self.pause = min(self.pause * 2, _RETRY_MAX)


def _others_who_create(conn: psycopg.Connection, schema: str) -> str:
    row = conn.execute(OTHERS_WHO_CREATE, (schema,)).fetchone()
    others = str(row[0]) if row else ""
    if others:
        log.error("%s", _others_may_create(None, schema, others))
    return others


def _others_may_create(name: str | None, schema: str, others: str) -> str:
    return (
        f"{name + ': ' if name else ''}roles other than its owner may create objects in jobq's schema {schema} "
        f"({others}): an overload of a built-in made there could run as the owner of jobq's SECURITY DEFINER "
        f"functions (enqueue from SQL). REVOKE CREATE ON SCHEMA {schema} FROM {others}"
        + ("; nothing of this file was applied." if name else ".")
    )


def _set_lock_timeout(conn: psycopg.Connection, ms: int, local: bool = False) -> None:
    conn.execute(f"SET {'LOCAL ' if local else ''}lock_timeout = {int(ms)}".encode())


def _apply_in_transaction(conn: psycopg.Connection, m: Migration, waits: _LockWait, citus: bool = False) -> None:
    # On Citus each statement is sent on its own, in the same transaction: Citus forwards some DDL to the shards
    # as the text it was given (ALTER TABLE ... ADD CONSTRAINT), and a file's statements sent as one text are
    # refused there ("cannot insert multiple commands into a prepared statement"). And the lock timeout is
    # forwarded to the workers (citus.propagate_set_commands): a shard's lock is waited for no longer than the
    # coordinator's, where a long transaction on a worker held the distributed table's lock for as long as it ran.
    parts = split_statements(m.sql) if citus else [m.sql]
    while True:
        try:
            with conn.transaction():
                if citus:
                    conn.execute(b"SET LOCAL citus.propagate_set_commands = 'local'")
                _set_lock_timeout(conn, waits.timeout_ms, local=True)
                for part in parts:
                    conn.execute(part.encode())
                conn.execute(RECORD_MIGRATION, (m.version, m.name, m.checksum))
            return
        except psycopg.errors.LockNotAvailable as exc:
            waits.failed(conn, exc)  # rolled back whole: the file starts again


def _apply_without_transaction(conn: psycopg.Connection, m: Migration, waits: _LockWait) -> None:
    for statement in split_statements(m.sql):
        if index := _CONCURRENT_INDEX.match(statement):
            name = index.group(1).strip('"')
            row = conn.execute(INVALID_INDEX, (name,)).fetchone()
            if row and row[0]:
                log.warning("%s: index %s was left invalid by an earlier run; building it again", m.name, name)
                conn.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"'.encode())
        # A concurrent build waits for every older transaction, blocking no write meanwhile: no timeout.
        _set_lock_timeout(conn, 0 if _WAITS_ITS_TURN.match(statement) else waits.timeout_ms)
        while True:
            try:
                conn.execute(statement.encode())
                break
            except psycopg.errors.LockNotAvailable as exc:
                waits.failed(conn, exc)  # one statement, its own transaction: nothing of it was done
    _set_lock_timeout(conn, waits.timeout_ms)
    conn.execute(RECORD_MIGRATION, (m.version, m.name, m.checksum))


def migrate(
    database_url: str,
    directory: Path | None = None,
    *,
    schema: str = schemas.DEFAULT,
    lock_timeout_ms: int = LOCK_TIMEOUT_MS,
    lock_wait_seconds: float = LOCK_WAIT_SECONDS,
) -> list[str]:
    """Apply pending migrations; returns the names applied. Safe to run concurrently from many processes:
    the advisory lock serialises them and the second one finds nothing left to do. Each statement waits at
    most `lock_timeout_ms` for a lock, and is tried again until `lock_wait_seconds` have passed.

    The files name no schema: they run with the session's search_path set to where jobq's tables are, the
    schema `schema` (JOBQ_DB_SCHEMA), made here on a new installation, or `public` on an installation older than
    1.2.0 whose tables were not moved yet (`move_into_schema`)."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SET statement_timeout = 0")
        _lock(conn)
        try:
            location = schemas.Location(schema)
            location.found(schemas.where_sync(conn, schema))
            schemas.use_sync(conn, location)  # this module's own statements name jobq.jobq_migrations
            made = conn.execute("SELECT to_regnamespace(%s) IS NOT NULL", (location.current,)).fetchone()
            if not made or not made[0]:
                conn.execute(schemas.create(location.current))
            conn.execute(sql.SQL("SET search_path = {}, pg_temp").format(sql.Identifier(location.current)))
            conn.execute(MIGRATIONS_TABLE)
            others = "" if location.current == schemas.LEGACY else _others_who_create(conn, location.current)
            done, deferred = [], []
            citus = distribute.has_citus(conn)
            for m in pending_migrations(conn, directory):
                if m.own_schema and location.current == schemas.LEGACY:
                    deferred.append(m.name)
                    continue
                if m.own_schema and others:
                    raise MigrationError(_others_may_create(m.name, location.current, others))
                waits = _LockWait(m.name, lock_timeout_ms, lock_wait_seconds)
                if m.transactional:
                    _apply_in_transaction(conn, m, waits, citus)
                else:
                    _apply_without_transaction(conn, m, waits)
                log.info("applied migration %s", m.name)
                done.append(m.name)
            if location.current != schemas.LEGACY:
                done += [f"distributed {t}" for t in distribute.distribute(conn, location.current)]
            if location.current != schema:
                log.warning(
                    "jobq's tables are in schema public, where releases up to 1.1.0 made them: once every "
                    "jobq process runs 1.2.0 or later, move them into schema %s with `jobq migrate "
                    "--move-into-schema` (docs/deployment.md#moving-into-a-schema), which also applies %s",
                    schema,
                    ", ".join(deferred) or "nothing more",
                )
            return done
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))


def move_into_schema(
    database_url: str,
    schema: str = schemas.DEFAULT,
    directory: Path | None = None,
    *,
    lock_timeout_ms: int = LOCK_TIMEOUT_MS,
    lock_wait_seconds: float = LOCK_WAIT_SECONDS,
) -> list[str]:
    """Move the tables (with their indexes, sequences and constraints) of an installation made by 1.1.0 or
    earlier from `public` into `schema`, and apply the migrations that waited for it (own-schema files): one
    transaction, no table rewritten, each lock waited for at most `lock_timeout_ms` (the transaction is tried
    again until `lock_wait_seconds` have passed). Returns the tables moved and the files applied; nothing when
    the tables are in `schema` already.

    Processes of 1.2.0 or later that found the tables in public find them again at their next statement
    (app/db/schema.py); processes of an older release cannot: run it once none is left."""
    schemas.valid(schema)
    if schema == schemas.LEGACY:
        return []
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SET statement_timeout = 0")
        _lock(conn)
        try:
            if schemas.where_sync(conn, schema) != schemas.LEGACY:
                return []
            waits = _LockWait("the move into schema " + schema, lock_timeout_ms, lock_wait_seconds)
            while True:
                try:
                    with conn.transaction():
                        _set_lock_timeout(conn, waits.timeout_ms, local=True)
                        return _move(conn, schema, directory)
                except psycopg.errors.LockNotAvailable as exc:
                    waits.failed(conn, exc)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))


def _move(conn: psycopg.Connection, schema: str, directory: Path | None) -> list[str]:
    target = sql.Identifier(schema)
    conn.execute(schemas.create(schema))
    moved = []
    for table in schemas.TABLES:
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"public.{table}",)).fetchone()[0]:  # type: ignore[index]
            conn.execute(sql.SQL("ALTER TABLE public.{} SET SCHEMA {}").format(sql.Identifier(table), target))
            moved.append(table)
    # What waited for the move (own-schema files), in the same transaction: all of it, or nothing moved.
    conn.execute(sql.SQL("SET LOCAL search_path = {}, pg_temp").format(target))
    applied = set(conn.execute(sql.SQL("SELECT version FROM {}.jobq_migrations").format(target)).fetchall())
    record = sql.SQL("INSERT INTO {}.jobq_migrations (version, name, checksum) VALUES (%s, %s, %s)").format(target)
    for m in load_migrations(directory):
        if m.own_schema and (m.version,) not in applied:
            conn.execute(m.sql.encode())
            conn.execute(record, (m.version, m.name, m.checksum))
            moved.append(m.name)
    log.info("moved %d tables into schema %s and applied what waited for it: %s", len(schemas.TABLES), schema,
             ", ".join(moved))  # fmt: skip
    return moved


async def missing_migrations(conn: psycopg.AsyncConnection[Any], location: schemas.Location | None = None) -> list[str]:
    """The migrations this code ships that the database has not applied (by name, in order): each one, not
    only those numbered above the last applied, since migrations are applied by presence and a database may
    have one of a higher number applied before one of a lower number. `location`: where this process found
    the tables; while they are in public, the files that wait for the move are not missing, and when they are
    not there any more (moved since), it looks again."""
    shipped = load_migrations()
    cur = await conn.execute("SELECT to_regclass('jobq.jobq_migrations') IS NOT NULL")
    row = await cur.fetchone()
    if (not row or not row[0]) and location and location.current != location.configured:
        found = await schemas.where(conn, location.configured)
        if found != location.current:
            log.warning("jobq's tables are in schema %s now (moved from %s)", found, location.current)
            location.found(found)
            cur = await conn.execute("SELECT to_regclass('jobq.jobq_migrations') IS NOT NULL")
            row = await cur.fetchone()
    if not row or not row[0]:
        return [m.name for m in shipped]
    cur = await conn.execute("SELECT version FROM jobq.jobq_migrations")
    applied = {r[0] for r in await cur.fetchall()}
    in_public = location is not None and location.current == schemas.LEGACY
    return [m.name for m in shipped if m.version not in applied and not (in_public and m.own_schema)]


async def schema_is_current(conn: psycopg.AsyncConnection[Any], location: schemas.Location | None = None) -> bool:
    """True when the database has applied every migration this code ships (used by /readyz)."""
    return not await missing_migrations(conn, location)


def behind(missing: list[str]) -> str:
    """What a process says when the database is older than its code."""
    return (
        f"the database schema is older than this jobq: {len(missing)} migration(s) not applied "
        f"({', '.join(missing)}). Run `jobq migrate` with this release first (upgrade the database before the "
        "code); until then this process answers /readyz with 503 not-ready."
    )
