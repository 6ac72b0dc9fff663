"""The connection pool, and the one place where psycopg errors become API errors.

A failover (app/db/replication.py; docs/deployment.md#high-availability): JOBQ_DATABASE_URL may name several
hosts (`host=a,b` with `target_session_attrs=read-write`), and the pool keeps to whichever one is the
primary. A connection that fails, or finds its server read-only (a demoted primary), answers its request 503
and is dropped, and every idle connection is checked at once (a connection to a standby fails the check);
new connections are tried about every second while none can be made, so the pool is back on the new primary
within a second or two of its promotion instead of after psycopg_pool's doubling backoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

import psycopg
import psycopg_pool

from app.db import finishing, schema
from app.db.replication import Replication, replication_state
from app.errors import AppError, DatabaseUnavailable, StatementTimeout, ValidationFailed
from app.settings import Settings

log = logging.getLogger("jobq.db")

# While the database is unreachable (the last attempt to use it lost its connection, and no connection has
# served a request since), a request waits at most this long for a pooled connection, instead of
# JOBQ_POOL_TIMEOUT_SECONDS: in an outage no connection is coming, and every request is to be answered 503
# within 3 s (tests/test_faults.py). A request queued behind a coalesced statement (app/core/coalesce.py)
# may wait for that statement's wait first: two of these, well within the bound.
OUTAGE_WAIT_SECONDS = 1.0
OUTAGE_GAVE_UP = "the database became unreachable while this request waited for a connection"
# What ends an outage is a request served by a connection made after its latest loss, or by an older one lent at
# least SURVIVOR_SECONDS after that loss. In a `pg_ctl stop -m immediate` the server processes die milliseconds
# apart (the postmaster signals them all in one loop), and one not yet dead can answer a statement lent just after
# the first loss (CI: that answer ended the outage, and a heartbeat then waited 4.4 s, until the pool's reconnection
# round failed); an older connection still serving a quarter of a second later is a survivor of one lost backend,
# not a dying server. Well under OUTAGE_WAIT_SECONDS: when one backend is lost and the others keep serving, the
# outage ends before the requests waiting at the loss are cut short.
SURVIVOR_SECONDS = 0.25


@contextmanager
def translate_errors() -> Iterator[None]:
    """Map lower-layer failures once: unreachable or timed-out database -> 503, a value the database
    refuses -> 422. Anything else is a bug and propagates as a 500."""
    try:
        yield
    except AppError:
        raise
    except psycopg_pool.PoolTimeout as exc:
        raise DatabaseUnavailable("No database connection became free in time.") from exc
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        # A write reached a server that is read-only now: a primary demoted by a failover manager.
        raise DatabaseUnavailable("The database is read-only right now (a failover in progress); retry.") from exc
    except psycopg.errors.QueryCanceled as exc:
        # statement_timeout (also an operator's pg_cancel_backend): still a 503 unless the caller knows better.
        raise StatementTimeout() from exc
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        # Includes QueryCanceled (statement_timeout), admin shutdown and lost connections.
        raise DatabaseUnavailable() from exc
    except (psycopg.DataError, psycopg.IntegrityError) as exc:
        # Inputs are validated before they reach SQL; this is the backstop, never a 500. psycopg's
        # specific class-22/23 errors derive from these DB-API classes, not from DataException. The
        # database's message may quote the value, so only the condition is named.
        name = type(exc).__name__
        raise ValidationFailed(f"The database refused a value ({name}, SQLSTATE {exc.sqlstate}).") from exc


# Every pooled session's settings (the parameter: statement_timeout in ms).
# synchronous_commit: an acknowledged write is durable whatever the server's default says.
# enable_bitmapscan: every statement of jobq is written for B-tree index scans, and claims read their
# partial index in its order, stopping after LIMIT rows. With stale statistics a partial index can look
# nearly empty, and the planner then prefers a bitmap scan of it plus a sort: every ready job read to hand
# out ten (measured: 160 ms instead of 0.5 ms at 300,000 jobs). Without bitmap scans the only alternative
# is a sort of the whole table, which never looks cheap. See app/db/jobs.py and tests/test_plans.py.
# jit: every statement of jobq is short, and JIT compiles each execution anew whenever a plan's estimated
# cost passes jit_above_cost, which large estimates on fresh statistics do: measured on the limited claim
# (app/db/claim.py), 525 ms of compiling for 6 ms of work, 390 instead of 4,300 jobs/s.
SESSION_SETTINGS = (
    "SELECT set_config('timezone', 'UTC', false),"
    " set_config('statement_timeout', %s, false),"
    " set_config('idle_in_transaction_session_timeout', '60s', false),"
    " set_config('synchronous_commit', 'on', false),"
    " set_config('enable_bitmapscan', 'off', false),"
    " set_config('jit', 'off', false),"
    # Citus: the request paths' finishes write their counters and records by statements of their own
    # (app/db/finishing.py).
    " EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') AS citus"
)


def _connection_lost(exc: BaseException | None) -> bool:
    """A failure of the connection itself (no SQLSTATE: refused, reset, closed; class 08: connection
    exception; 57P: the server shutting down or restarting), not of a statement (a deadlock, a lock wait)."""
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.OperationalError):
        state = exc.sqlstate
        return state is None or state.startswith(("08", "57P"))
    return False


# psycopg_pool retries a connection it could not make after 1, 2, 4, 8... seconds, up to its reconnect_timeout:
# after a 20-second failover the next attempt could be 10 seconds away. Giving up after RECONNECT_SECONDS
# (then a pool check starts a new round at once: _reconnect_failed) keeps attempts about a second apart.
RECONNECT_SECONDS = 2.5
# A connection to a host that vanished without closing its sockets (a partition, a machine powered off) is
# noticed after about 25 s of silence instead of the kernel's two hours, and a statement sent to it fails once
# it has gone unacknowledged for 10 s (tcp_user_timeout, Linux) rather than waiting for the keepalives.
KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
# A server that can take no write: a standby, or a primary set read-only (what libpq's
# target_session_attrs=read-write refuses too).
READ_ONLY = "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool"


class _Pool(psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[object]]):
    """psycopg_pool's pool, whose check() (run after a connection failed) also drops connections to a server
    that is read-only now, when the pool is for writes, and reports an idle connection it finds lost."""

    for_writes = True
    # Called when check() finds an idle connection lost (Database._went_away): in a stop of the server the
    # LISTEN connection may be the first to notice, its check_soon() then finds every idle connection dead, and
    # no request's statement ever fails; the requests that then wait for a connection would otherwise learn of
    # the outage only when the pool's round of reconnection attempts fails (CI: a heartbeat answered after 3.4 s).
    lost: Callable[[], None] | None = None

    async def check_connection(self, conn: psycopg.AsyncConnection[object]) -> None:  # type: ignore[override]
        row = None
        try:
            await psycopg_pool.AsyncConnectionPool.check_connection(conn)
            if self.for_writes:
                row = await (await conn.execute(READ_ONLY)).fetchone()
        except Exception as exc:
            if self.lost is not None and _connection_lost(exc):
                self.lost()
            raise
        if row and row[0]:  # type: ignore[index]
            await conn.close()
            raise psycopg.OperationalError("the server is read-only now (a standby)")  # a failover, not a loss


class Database:
    """An async pool with per-connection settings; `connection()` hands out one connection.

    `replica=True`: a pool for reads only (JOBQ_READ_DATABASE_URL): a standby is what it wants, so neither
    its read-only state nor its replication is looked at."""

    def __init__(
        self, settings: Settings, url: str, *, replica: bool = False, location: schema.Location | None = None
    ) -> None:
        self.settings = settings
        self.url = url
        self.replica = replica
        # Where jobq's tables are (app/db/schema.py): found by build_services before the pool opens.
        self.location = location or schema.Location(settings.db_schema)
        self.replication: Replication | None = None  # the primary's, as of the newest connection
        self.pool = _Pool(
            url,
            min_size=1 if replica else settings.pool_min_size,
            max_size=settings.pool_max_size,
            timeout=settings.pool_timeout_seconds,
            kwargs={
                "autocommit": True,
                "connect_timeout": 5,
                "application_name": "jobq-read" if replica else "jobq",
                **KEEPALIVES,
            },
            configure=self._configure,
            reconnect_timeout=RECONNECT_SECONDS,
            reconnect_failed=self._reconnect_failed,
            open=False,
            name="jobq-read" if replica else "jobq",
        )
        self.pool.for_writes = not replica
        self.pool.lost = self._went_away
        self._checking: asyncio.Task[None] | None = None
        self.unreachable = False  # see OUTAGE_WAIT_SECONDS
        # When the latest connection was lost or refused (time.monotonic()). Only a request lent its connection
        # after it ends an outage by being served: one lent before, whose statement its server process answered
        # in the moments before it died, proves nothing about now (CI: such a late answer, in the milliseconds
        # of a `pg_ctl stop -m immediate`, reset `unreachable`, and the next requests waited the pool's 5 s).
        self._lost_at = 0.0
        self._served_at = 0.0  # when a request was last served (time.monotonic())
        self._made: weakref.WeakKeyDictionary[psycopg.AsyncConnection[object], float] = weakref.WeakKeyDictionary()
        # Tasks waiting in the pool for a connection now (_lend). When a connection is lost or refused (not on a
        # PoolTimeout, which a pool only busy gives too), those still waiting OUTAGE_WAIT_SECONDS later are cut
        # short (_cut_waits), not left to wait out their JOBQ_POOL_TIMEOUT_SECONDS. No task or event per lend.
        self._waiting: set[asyncio.Task[Any]] = set()
        self._cut: set[asyncio.Task[Any]] = set()  # cancelled by _cut_waits, not yet answered
        self._doomed: set[asyncio.Task[Any]] = set()  # in a snapshot whose timer is pending
        self._cutting: set[asyncio.TimerHandle] = set()

    async def _configure(self, conn: psycopg.AsyncConnection[object]) -> None:
        self._made[conn] = time.monotonic()
        schema.use(conn, self.location)
        cur = await conn.execute(SESSION_SETTINGS, (str(self.settings.statement_timeout_ms),))
        row = await cur.fetchone()
        finishing.mark_citus(conn, row is not None and bool(cast(tuple[Any, ...], row)[-1]))
        if not self.replica:
            self._replication_seen(await replication_state(conn))

    def _replication_seen(self, state: Replication) -> None:
        """Every new connection reads it (at start, after a reconnect or a failover); a change is logged."""
        if state == self.replication:
            return
        self.replication = state
        if state.warning:
            log.warning("replication: %s", state.warning)
        else:
            what = {"none": "no standby", "synchronous": "synchronous", "asynchronous": "asynchronous"}[state.mode]
            log.info("replication: %s (%d standby(s) streaming)", what, state.standbys)

    async def open(self, wait_seconds: float) -> None:
        await self.pool.open(wait=True, timeout=wait_seconds)

    async def close(self) -> None:
        if self._checking:
            self._checking.cancel()
        for handle in self._cutting:
            handle.cancel()
        self._cutting.clear()
        await self.pool.close()

    async def _lend(self, timeout: float | None) -> psycopg.AsyncConnection[object]:
        """A pooled connection, waiting at most `timeout` (the pool's default when None), and at most
        OUTAGE_WAIT_SECONDS once the database is unreachable, even when it became so while this waited (CI
        measured a heartbeat queued just before the first lost connection waiting the pool's whole 5 s)."""
        if self.unreachable:
            return await self.pool.getconn(min(timeout or self.settings.pool_timeout_seconds, OUTAGE_WAIT_SECONDS))
        task = asyncio.current_task()
        if task is None:  # not in a task (never in jobq): nothing to cut short
            return await self.pool.getconn(timeout)
        self._waiting.add(task)
        try:
            conn = await self.pool.getconn(timeout)
        except asyncio.CancelledError:
            # psycopg_pool gives back a connection handed to a waiter cancelled at that moment.
            if task in self._cut:
                self._cut.discard(task)
                if task.uncancel() == 0:  # cancelled by _cut_waits alone, not by its own caller too
                    raise psycopg_pool.PoolTimeout(OUTAGE_GAVE_UP) from None
            raise
        finally:
            self._waiting.discard(task)
        if self._cut and task in self._cut:
            # The cut landed as the pool handed this task its connection, and psycopg_pool (asyncio.wait_for on
            # Python 3.11) returned the connection instead of raising: serve it, and take the cancellation back.
            self._cut.discard(task)
            task.uncancel()
        return conn

    def _outage_began(self) -> None:
        """A connection was lost or refused: the requests waiting for a connection now wait at most
        OUTAGE_WAIT_SECONDS more (later ones wait that long at most anyway, as `unreachable` is set)."""
        fresh = self._waiting - self._doomed  # waiters no pending timer covers yet (one per outage, not per failure)
        if fresh:
            self._doomed |= fresh
            timer: list[asyncio.TimerHandle] = []

            def fire() -> None:
                self._cutting.difference_update(timer)
                self._doomed -= fresh
                self._cut_waits(list(fresh))

            timer.append(asyncio.get_running_loop().call_later(OUTAGE_WAIT_SECONDS, fire))
            self._cutting.update(timer)

    def _cut_waits(self, tasks: list[asyncio.Task[Any]]) -> None:
        if not self.unreachable:
            return  # a connection served meanwhile: the waits end as usual
        for task in tasks:
            # Still waiting: suspended inside getconn (this runs between tasks' steps), where the cancellation lands.
            if task in self._waiting and task not in self._cut and task.cancel(OUTAGE_GAVE_UP):
                self._cut.add(task)

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[psycopg.AsyncConnection[object]]:
        try:
            with translate_errors():
                conn = await self._lend(timeout)
                lent_at = time.monotonic()
                try:
                    async with conn:  # what the pool's own connection() does: commit or roll back
                        try:
                            yield conn
                        except psycopg.errors.ReadOnlySqlTransaction:
                            await conn.close()  # a standby now: never lent again (the pool replaces it)
                            raise
                        except psycopg.errors.UndefinedTable as exc:
                            if not await self._moved(conn):
                                raise
                            raise DatabaseUnavailable("jobq's tables moved into their schema just now; retry.") from exc
                        # Reachable again once a request has been served since the latest loss, not when a
                        # connection is handed out: in an outage the pool still lends its idle connections, all
                        # dead, and a request arriving while one of them is out would otherwise wait the whole
                        # JOBQ_POOL_TIMEOUT_SECONDS. Served by a connection made since that loss, or by an older
                        # one lent SURVIVOR_SECONDS after it (one lent sooner may be answered by a dying server).
                        lost = self._lost_at
                        if not conn.broken and (lent_at >= lost + SURVIVOR_SECONDS or self._made.get(conn, 0.0) > lost):
                            self.unreachable = False
                            self._served_at = time.monotonic()
                finally:
                    await self.pool.putconn(conn)
        except StatementTimeout:
            raise  # the statement was slow, the connection is fine
        except DatabaseUnavailable as exc:
            # A lost or refused connection, or no connection lent in time (a PoolTimeout has no SQLSTATE either),
            # not a failed statement: from now on until a connection serves a request again, waits are short. A
            # pool that is only busy serves another request within moments, which makes waits long again.
            if _connection_lost(exc.__cause__):
                self.unreachable = True
                if not isinstance(exc.__cause__, psycopg_pool.PoolTimeout):
                    self._went_away()
            self.check_soon()
            raise

    def _went_away(self) -> None:
        """A connection was lost or refused, by a request or by the pool's reconnection attempts."""
        self._lost_at = time.monotonic()
        self.unreachable = True
        self._outage_began()

    async def _moved(self, conn: psycopg.AsyncConnection[object]) -> bool:
        """Whether a statement named a table that is no longer where this process found it at start: the tables
        of an installation older than 1.2.0 were moved from public into their schema (`jobq migrate
        --move-into-schema`). From now on statements name the new place."""
        location = self.location
        if location.current == location.configured:
            return False
        try:
            found = await schema.where(conn, location.configured)
        except psycopg.Error:
            return False
        if found == location.current:
            return False
        log.warning("jobq's tables are in schema %s now (moved from %s)", found, location.current)
        location.found(found)
        return True

    def check_soon(self) -> None:
        """After a connection-level failure the other idle connections are likely dead too (database
        restart, failover): check them all once in the background instead of failing one request per
        connection. The LISTEN connection calls it too when it loses its server, so that an idle pool
        leaves a demoted primary as soon."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(self._check())

    def _reconnect_failed(self, pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[object]]) -> None:
        """A connection could not be made for RECONNECT_SECONDS: start a new round of attempts now. Unless a request
        was served meanwhile, the database is unreachable: the requests waiting for a connection are cut short,
        OUTAGE_WAIT_SECONDS from now. (A server that refuses only new connections, at max_connections or a
        connection limit, while the pool's own keep serving, is no outage: those requests wait as usual.)"""
        if time.monotonic() - self._served_at > RECONNECT_SECONDS:
            self._went_away()
        self.check_soon()

    async def _check(self) -> None:
        try:
            await self.pool.check()
        except Exception:  # the pool logs; this is best effort
            log.debug("pool check failed", exc_info=True)
