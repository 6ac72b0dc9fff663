"""Test fixtures: a real PostgreSQL, a fresh database per test cloned from a migrated template, and the
service itself served by uvicorn on a free port.

The server is found, in order: JOBQ_TEST_DATABASE_URL (any PostgreSQL 13+, with rights to create
databases); Docker through testcontainers when a Docker engine answers; a throwaway local cluster built
from PostgreSQL binaries found on this machine (see app/runtime/embedded.py)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from app.db.migrate import migrate
from app.settings import Settings
from tests import citus
from tests.processes import postgres_pids
from tests.support import MEASURED, LiveServer

log = logging.getLogger("tests")


def docker_engine_answers() -> bool:
    """GET /_ping on the engine's socket (the docker library leaks a socket when there is no engine)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(3)
            target: object = host.removeprefix("unix://")
        elif host.startswith("tcp://"):
            name, _, port = host.removeprefix("tcp://").partition(":")
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            conn.settimeout(3)
            target = (name, int(port or 2375))
        else:
            return False
        with conn:
            conn.connect(target)  # type: ignore[arg-type]
            conn.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b" 200 " in conn.recv(64)
    except OSError:
        return False


def _docker_postgres() -> Iterator[str] | None:
    if not docker_engine_answers():
        return None

    def run() -> Iterator[str]:
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:18", driver=None) as pg:
            yield pg.get_connection_url()

    return run()


def _local_postgres() -> Iterator[str]:
    from app.runtime.embedded import LocalPostgres

    root = Path(tempfile.mkdtemp(prefix="jobq-test-pg-"))
    root.chmod(0o755)  # the cluster may run as an unprivileged user
    cluster = LocalPostgres(root / "data", durable=False, database="postgres")
    try:
        cluster.start()
        _server["how"] = f"a throwaway cluster from {cluster.binaries.source} ({cluster.binaries.bindir})"
        yield cluster.url_for("postgres")
    finally:
        cluster.stop(mode="immediate")
        shutil.rmtree(root, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Scenarios that need one PostgreSQL major only (a Patroni failover, a migration of a million jobs) are
    skipped where JOBQ_SKIP_ONE_MAJOR is set: CI's second run (.ci/run), on the other major."""
    if os.environ.get("JOBQ_SKIP_ONE_MAJOR"):
        skip = pytest.mark.skip(reason="JOBQ_SKIP_ONE_MAJOR: this scenario ran on the first PostgreSQL major")
        for item in items:
            if item.get_closest_marker("one_major"):
                item.add_marker(skip)


# What the suite ran against, for the last lines of the report (CI runs it on two PostgreSQL majors).
_server: dict[str, str] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in MEASURED:
        terminalreporter.write_line(f"measured: {line}")
    if "version" in _server:
        terminalreporter.write_line(f"jobq tests ran on PostgreSQL {_server['version']}, {_server['how']}")


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """URL of a database on the test server from which test databases are created."""
    if url := os.environ.get(citus.URL_VARIABLE):
        _server["how"] = f"a Citus cluster ({citus.URL_VARIABLE})"
        _citus.append(citus.Cluster(url))
        source: Iterator[str] = iter([url])
    elif url := os.environ.get("JOBQ_TEST_DATABASE_URL"):
        _server["how"] = "JOBQ_TEST_DATABASE_URL"
        source = iter([url])
    else:
        _server["how"] = "Docker (testcontainers)"
        source = _docker_postgres() or _local_postgres()
    for url in source:
        with psycopg.connect(url) as conn:
            _server["version"] = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        yield url


@pytest.fixture(scope="session")
def pg_version(pg_admin_url: str) -> int:
    with psycopg.connect(pg_admin_url) as conn:
        return conn.info.server_version // 10000


# The Citus cluster when the suite runs on one (tests/citus.py): databases are made on every node.
_citus: list[citus.Cluster] = []

_counter = itertools.count()
_PREFIX = f"jobq_t{os.getpid()}"


def _with_db(url: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    name = f"{_PREFIX}_template"
    _create(pg_admin_url, name)
    migrate(_with_db(pg_admin_url, name))
    yield name
    _drops.shutdown(wait=True)
    _drop(pg_admin_url, name)


def _create(admin_url: str, name: str) -> None:
    if _citus:
        _citus[0].create(name)
        return
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def _drop(admin_url: str, name: str) -> None:
    if _citus:
        _citus[0].drop(name)
        return
    with psycopg.connect(admin_url, autocommit=True) as conn:
        # FORCE (13+) ends sessions a failed test left behind.
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# Dropping a test's database takes half a second to a second here (PostgreSQL removes its files), more than
# most tests take: it is done behind the next test, one drop at a time, and waited for before the template
# goes. Nothing reads a dropped database's name again (each is numbered).
_drops = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jobq-test-drop")


def _drop_later(admin_url: str, name: str) -> None:
    def drop() -> None:
        with contextlib.suppress(psycopg.Error):
            _drop(admin_url, name)

    _drops.submit(drop)


def _clone(admin_url: str, template: str) -> str:
    name = f"{_PREFIX}_{next(_counter)}"
    if _citus:
        _citus[0].clone(template, name)
        return name
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))
    return name


@pytest.fixture
def database_factory(pg_admin_url: str, template_db: str) -> Iterator[object]:
    """Makes fresh, migrated databases for this test; all are dropped after it."""
    made: list[str] = []

    def make() -> str:
        name = _clone(pg_admin_url, template_db)
        made.append(name)
        return _with_db(pg_admin_url, name)

    yield make
    for name in made:
        _drop_later(pg_admin_url, name)


@pytest.fixture
def database_url(database_factory) -> str:  # type: ignore[no-untyped-def]
    """A fresh, migrated database for this test only."""
    return database_factory()  # type: ignore[no-any-return]


@pytest.fixture
def empty_database_url(pg_admin_url: str) -> Iterator[str]:
    """A database with nothing in it, not even the schema (for migrations)."""
    name = f"{_PREFIX}_empty_{next(_counter)}"
    _create(pg_admin_url, name)
    yield _with_db(pg_admin_url, name)
    with contextlib.suppress(psycopg.Error):
        _drop(pg_admin_url, name)


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection]:
    """A direct connection to the test database, for arranging and checking rows."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


def make_settings(database_url: str, **overrides: object) -> Settings:
    base: dict[str, object] = {
        "database_url": database_url,
        "pool_min_size": 1,
        "pool_max_size": 8,
        "migrate_on_start": False,
        "sweep_interval_seconds": 3600.0,  # tests call sweep_once() themselves
    }
    base.update(overrides)
    return Settings(**base)  # type: ignore[arg-type]


@pytest.fixture
def server_factory(database_url: str) -> Iterator[object]:
    started: list[LiveServer] = []

    def start(
        database: str | None = None, tracer_provider: object = None, bind: str = "127.0.0.1", **overrides: object
    ) -> LiveServer:
        server = LiveServer(make_settings(database or database_url, **overrides), tracer_provider, bind)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def server(server_factory) -> LiveServer:  # type: ignore[no-untyped-def]
    """The service on a fresh database."""
    return server_factory()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def module_database_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    """One fresh, migrated database for a whole test module."""
    name = _clone(pg_admin_url, template_db)
    yield _with_db(pg_admin_url, name)
    _drop_later(pg_admin_url, name)


@pytest.fixture(scope="module")
def shared_server(module_database_url: str) -> Iterator[LiveServer]:
    """The service with the default test settings, started once for a module's tests that write nothing and
    read only what they sent (refusals of bad input): starting a server and its database costs a second or
    two, their request a few milliseconds. A test that writes, or needs a setting, takes `server`."""
    server = LiveServer(make_settings(module_database_url)).start()
    yield server
    server.stop()


@pytest.fixture
def shared_db(module_database_url: str) -> Iterator[psycopg.Connection]:
    """A direct connection to shared_server's database."""
    with psycopg.connect(module_database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def pg_data_dir() -> Iterator[Path]:
    """A data directory for a managed PostgreSQL (`jobq serve` without JOBQ_DATABASE_URL), under a parent
    the cluster's OS user can reach (as root it runs as another user). Nothing is left running on it."""
    root = Path(tempfile.mkdtemp(prefix="jobq-test-data-"))
    root.chmod(0o755)
    data = root / "data"
    yield data
    for pid in [pid for d in root.iterdir() for pid in postgres_pids(d)]:  # a failed test's leftovers
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Raw sockets a test opens (tests/rawhttp.py connect), closed after it."""
    opened: list[socket.socket] = []
    yield opened
    for s in opened:
        s.close()
