"""A PostgreSQL cluster under a real failover manager, for tests/test_patroni.py: one etcd and two PostgreSQL
15 members under Patroni (Debian's `patroni` and `etcd-server` packages), synchronous mode on, everything on
127.0.0.1 and torn down afterwards. PostgreSQL refuses to run as root: as root, etcd and Patroni run as the
account the embedded PostgreSQL uses (app/runtime/embedded.py), which owns the cluster's directory."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from app.runtime.embedded import _cluster_user, free_port
from tests.processes import postgres_pids
from tests.support import wait_until

BINDIR = Path("/usr/lib/postgresql/15/bin")
SCOPE = "jobq-ha"


def missing() -> str | None:
    """Why the cluster cannot be built here (None: it can)."""
    for tool in ("patroni", "patronictl", "etcd"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install -y patroni etcd-server)"
    if not (BINDIR / "postgres").exists():
        return f"PostgreSQL 15 is not in {BINDIR} (apt-get install -y postgresql-15)"
    return None


@dataclass
class Member:
    name: str
    pg_port: int
    api_port: int
    config: Path
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None


class PatroniCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.user = _cluster_user() if os.geteuid() == 0 else None
        self.password = secrets.token_hex(16)
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.members = [self._member(f"pg{n}") for n in range(2)]

    # -- configuration ----------------------------------------------------------------------------------

    def _member(self, name: str) -> Member:
        member = Member(name, free_port(), free_port(), self.root / f"{name}.yml", self.root / name)
        config = {
            "scope": SCOPE,
            "name": name,
            "log": {"level": "INFO", "dir": str(self.root / f"{name}-log")},
            "restapi": {"listen": f"127.0.0.1:{member.api_port}", "connect_address": f"127.0.0.1:{member.api_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": 20,
                    "loop_wait": 1,
                    "retry_timeout": 5,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    # A commit waits for the standby, so a failover loses no acknowledged job ...
                    "synchronous_mode": True,
                    # ... and a crashed primary is failed over at once rather than restarted in place.
                    "primary_start_timeout": 0,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "parameters": {"wal_log_hints": "on", "max_connections": 100, "max_wal_senders": 5},
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{member.pg_port}",
                "connect_address": f"127.0.0.1:{member.pg_port}",
                "data_dir": str(member.data_dir),
                "bin_dir": str(BINDIR),
                "pgpass": str(self.root / f"{name}.pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": self.password},
                    "replication": {"username": "replicator", "password": self.password},
                    "rewind": {"username": "postgres", "password": self.password},
                },
                "parameters": {"unix_socket_directories": str(self.root)},
                "pg_hba": [
                    "local all all trust",
                    "host replication replicator 127.0.0.1/32 scram-sha-256",
                    "host all all 127.0.0.1/32 scram-sha-256",
                ],
            },
        }
        member.config.write_text(json.dumps(config))  # YAML is a superset of JSON
        return member

    def _spawn(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        command = ["runuser", "-u", self.user, "--", *args] if self.user else args
        with log.open("ab") as out:
            return subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True
            )

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> PatroniCluster:
        etcd_url, peer_url = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{self.etcd_peer_port}"
        self.etcd = self._spawn(
            [
                "etcd", "--name", "etcd0", "--data-dir", str(self.root / "etcd"),
                "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"etcd0={peer_url}",
            ],
            self.root / "etcd.log",
        )  # fmt: skip
        wait_until(lambda: _answers(f"{etcd_url}/health"), timeout=60, what="etcd")
        for member in self.members:
            (self.root / f"{member.name}-log").mkdir()
            self._own(self.root / f"{member.name}-log")
            member.process = self._spawn(["patroni", str(member.config)], self.root / f"{member.name}.out")
            if member is self.members[0]:
                wait_until(lambda: self.leader() == "pg0", timeout=120, what="pg0 to bootstrap and lead")
        wait_until(lambda: self.sync_standby() is not None, timeout=120, what="a synchronous standby")
        return self

    def _own(self, path: Path) -> None:
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def stop(self) -> None:
        for process in [*(m.process for m in self.members), self.etcd]:
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in [*(m.process for m in self.members), self.etcd]:
            if process is None:
                continue
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for member in self.members:  # a PostgreSQL Patroni left behind
            for pid in postgres_pids(member.data_dir):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    # -- what Patroni says ----------------------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """The members as Patroni's REST API describes them (its /cluster endpoint)."""
        for member in self.members:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                found: list[dict[str, Any]] = httpx.get(
                    f"http://127.0.0.1:{member.api_port}/cluster", timeout=5
                ).json()["members"]
                return found
        return []

    def leader(self) -> str | None:
        """The member that leads and runs (None while there is none)."""
        return next((m["name"] for m in self.status() if m["role"] == "leader" and m["state"] == "running"), None)

    def sync_standby(self) -> str | None:
        return next(
            (
                m["name"]
                for m in self.status()
                if m["role"] == "sync_standby" and m["state"] in ("running", "streaming")
            ),
            None,
        )

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    # -- jobq's view ------------------------------------------------------------------------------------------

    def url(self, database: str = "jobq") -> str:
        """Every member in one URL: libpq picks the one that takes writes (target_session_attrs=read-write)."""
        return psycopg.conninfo.make_conninfo(
            host=",".join("127.0.0.1" for _ in self.members),
            port=",".join(str(m.pg_port) for m in self.members),
            user="postgres",
            password=self.password,
            dbname=database,
            target_session_attrs="read-write",
            connect_timeout=5,
        )

    def create_database(self) -> str:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE jobq")
        return self.url()

    # -- faults -----------------------------------------------------------------------------------------------

    def kill_postgres(self, name: str) -> None:
        """SIGKILL to the member's PostgreSQL, every process of it (Patroni lives on)."""
        data_dir = self.member(name).data_dir
        for pid in postgres_pids(data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def switchover(self, leader: str, candidate: str) -> str:
        command = ["patronictl", "-c", str(self.member(leader).config), "switchover", "--leader", leader,
                   "--candidate", candidate, "--force"]  # fmt: skip
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.root)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def logs(self) -> str:
        """The tail of every log, for a failing test's message."""
        parts = []
        for path in sorted(self.root.glob("*.out")) + sorted(self.root.glob("*-log/*")) + [self.root / "etcd.log"]:
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=2).status_code == 200
    return False


@contextlib.contextmanager
def patroni_cluster() -> Iterator[PatroniCluster]:
    root = Path(tempfile.mkdtemp(prefix="jobq-test-patroni-"))
    root.chmod(0o700)
    cluster = PatroniCluster(root)
    cluster._own(root)
    for member in cluster.members:
        cluster._own(member.config)
    try:
        yield cluster.start()
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
