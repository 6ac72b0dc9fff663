"""The `jobq` command as a script sees it: help a person can learn from, exit codes and messages."""

from __future__ import annotations

import socket

import pytest

from app.runtime.embedded import free_port
from tests.processes import run_jobq
from tests.support import LiveServer, migrate_output

UNREACHABLE = "postgresql://jobq@127.0.0.1:1/jobq?connect_timeout=2"


def test_help_of_each_command() -> None:
    top = run_jobq("--help")
    assert top.returncode == 0
    for command in ("serve", "migrate", "healthcheck", "openapi"):
        assert command in top.stdout
    assert "exit codes" in top.stdout

    serve = run_jobq("serve", "--help")
    assert serve.returncode == 0
    for text in ("JOBQ_DATABASE_URL", "--data-dir", "--workers", "--no-migrate", "SIGTERM", "--graceful-timeout",
                 "JOBQ_PORT", "exit codes", "examples"):  # fmt: skip
        assert text in serve.stdout, text

    for command, text in (("migrate", "--database-url"), ("healthcheck", "/healthz"), ("openapi", "--output")):
        r = run_jobq(command, "--help")
        assert r.returncode == 0 and text in r.stdout, (command, r.stdout)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ([], "COMMAND"),
        (["serve", "--port", "70000"], "--port"),
        (["serve", "--workers", "0"], "--workers"),
        (["serve", "--graceful-timeout", "soon"], "--graceful-timeout"),
        (["fly"], "fly"),
    ],
)
def test_bad_usage_exits_2_naming_the_argument(args: list[str], named: str) -> None:
    r = run_jobq(*args)
    assert r.returncode == 2
    assert named in r.stderr


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"JOBQ_POOL_MIN_SIZE": "0"}, "JOBQ_POOL_MIN_SIZE"),
        ({"JOBQ_PORT": "http"}, "JOBQ_PORT"),
        ({"JOBQ_WORKERS": "1000"}, "JOBQ_WORKERS"),
        ({"JOBQ_MIGRATE_ON_START": "maybe"}, "JOBQ_MIGRATE_ON_START"),
        ({"JOBQ_SWEEP_INTERVAL_SECONDS": "-1"}, "JOBQ_SWEEP_INTERVAL_SECONDS"),
        ({"JOBQ_POOL_MIN_SIZE": "20", "JOBQ_POOL_MAX_SIZE": "10"}, "JOBQ_POOL_MIN_SIZE must not exceed"),
    ],
)
def test_a_bad_setting_stops_serve_with_exit_2_naming_the_variable(env: dict[str, str], named: str) -> None:
    r = run_jobq("serve", env=env)
    assert r.returncode == 2
    assert r.stderr.startswith("jobq: invalid configuration:")
    assert named in r.stderr


def test_migrate(empty_database_url: str) -> None:
    applied = migrate_output(empty_database_url)
    r = run_jobq("migrate", env={"JOBQ_DATABASE_URL": empty_database_url})
    assert (r.returncode, r.stdout.strip()) == (0, applied), r.stderr
    r = run_jobq("migrate", "--database-url", empty_database_url)
    assert (r.returncode, r.stdout.strip()) == (0, "schema is current"), r.stderr


def test_migrate_without_a_database_exits_2() -> None:
    r = run_jobq("migrate")
    assert r.returncode == 2
    assert "JOBQ_DATABASE_URL" in r.stderr and "--database-url" in r.stderr


def test_an_unreachable_database_exits_1() -> None:
    r = run_jobq("migrate", "--database-url", UNREACHABLE)
    assert r.returncode == 1
    assert r.stderr.startswith("jobq: migration failed:")
    r = run_jobq("serve", "--port", str(free_port()), env={"JOBQ_DATABASE_URL": UNREACHABLE})
    assert r.returncode == 1
    assert "jobq: migration failed:" in r.stderr


def test_a_port_in_use_exits_1(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_jobq("serve", "--port", str(port), env={"JOBQ_DATABASE_URL": database_url})
    assert r.returncode == 1
    assert "jobq: the service failed to start" in r.stderr


def test_healthcheck(server: LiveServer) -> None:
    r = run_jobq("healthcheck", "--url", server.url + "/healthz")
    assert r.returncode == 0, r.stderr
    port = server.url.rsplit(":", 1)[1]
    assert run_jobq("healthcheck", env={"JOBQ_PORT": port}).returncode == 0
    r = run_jobq("healthcheck", env={"JOBQ_PORT": str(free_port())})
    assert r.returncode == 1
    assert r.stderr.startswith("jobq: http://127.0.0.1:")
