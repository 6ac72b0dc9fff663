"""Which failures make the pool wait short (app/db/pool.py OUTAGE_WAIT_SECONDS): the connection's, not a
statement's."""

from __future__ import annotations

import psycopg
import pytest

from app.db.pool import _connection_lost


@pytest.mark.parametrize(
    ("exc", "lost"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),  # no SQLSTATE
        (psycopg.InterfaceError("the connection is closed"), True),
        (psycopg.errors.ConnectionFailure("08006"), True),
        (psycopg.errors.AdminShutdown("57P01: terminating connection due to administrator command"), True),
        (psycopg.errors.CannotConnectNow("57P03: the database system is starting up"), True),
        (psycopg.errors.DeadlockDetected("40P01"), False),
        (psycopg.errors.LockNotAvailable("55P03"), False),
        (psycopg.errors.QueryCanceled("57014: statement timeout"), False),
        (None, False),
    ],
)
def test_only_a_lost_connection_counts_as_the_database_unreachable(exc: BaseException | None, lost: bool) -> None:
    assert _connection_lost(exc) is lost
