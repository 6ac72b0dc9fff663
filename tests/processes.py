"""Real `jobq` processes for the tests: the installed console script in a subprocess, its log, signals,
and the PostgreSQL processes of a data directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psycopg

from app.db.channels import CHANNEL
from app.runtime.embedded import free_port

JOBQ = str(Path(sys.executable).with_name("jobq"))  # the console script `pip install` made


def jobq_env(**env: str) -> dict[str, str]:
    """The environment without the caller's JOBQ_* variables (a developer's JOBQ_DATABASE_URL, say)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    clean.update(env)
    return clean


def run_jobq(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [JOBQ, *args], env=jobq_env(**(env or {})), capture_output=True, text=True, timeout=timeout, check=False
    )


class ServeProcess:
    """`jobq serve --port <port, by default a free one> ARGS` with its output in a log file."""

    def __init__(
        self,
        *args: str,
        log: Path,
        env: dict[str, str] | None = None,
        command: Sequence[str] = (JOBQ,),
        port: int | None = None,
        **popen: Any,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        # A wrapper that forks rather than execs (faketime) leaves `jobq serve` as its child: started in a
        # session of its own, the whole group is signalled at teardown, so no child outlives the test.
        self.session = bool(popen.get("start_new_session"))
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*command, "serve", "--port", str(self.port), *args],
                env=jobq_env(**(env or {})),
                stdout=out,
                stderr=subprocess.STDOUT,
                **popen,
            )
        self.client = httpx.Client(base_url=self.url, timeout=60)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90) -> ServeProcess:
        """Until /readyz answers 200; fails at once, with the log, if the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"jobq serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"jobq serve not ready after {timeout}s:\n{self.output()}")
            time.sleep(0.1)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"jobq serve still running after {timeout}s:\n{self.output()}") from None

    def kill(self) -> None:
        """kill -9: no shutdown at all; an embedded PostgreSQL keeps running, orphaned."""
        self.proc.kill()
        self.wait()

    def stop(self, timeout: float = 60) -> int:
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def close(self) -> None:
        """Test teardown: whatever happened, leave no process behind."""
        self.client.close()
        if self.proc.poll() is None:
            self._signal_all(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self._signal_all(signal.SIGKILL)
                self.proc.wait()
        if self.session:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # what the wrapper left behind

    def _signal_all(self, sig: int) -> None:
        if self.session:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    # -- short API calls --------------------------------------------------------------------------------

    def enqueue(self, queue: str = "q", payload: Any = None) -> dict[str, Any]:
        r = self.client.post(f"/queues/{queue}/jobs", json={"payload": payload})
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]

    def get_job(self, job_id: int) -> httpx.Response:
        return self.client.get(f"/jobs/{job_id}")


def postgres_pids(data_dir: Path) -> list[int]:
    """PostgreSQL processes working in data_dir (the postmaster and its backends all chdir there)."""
    target = data_dir.resolve()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            cwd = (entry / "cwd").resolve()
        except OSError:
            continue
        if name.startswith(("postgres", "postmaster")) and cwd == target:
            found.append(int(entry.name))
    return found


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


def embedded_url(data_dir: Path, database: str = "jobq") -> str:
    """URL of the managed PostgreSQL running on data_dir (its port is in postmaster.pid, line 4)."""
    port = int((data_dir / "postmaster.pid").read_text().splitlines()[3])
    password = (data_dir / "jobq-password").read_text().strip()
    return f"postgresql://jobq:{password}@127.0.0.1:{port}/{database}"


class Announcements:
    """LISTENs on jobq's wake-up channel. A server announces the queues on which a claim has started to
    wait ('<sender> p q1 q2'): from outside, that is how a test knows a long-poll is parked."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(f"LISTEN {CHANNEL}")
        self.waiting: dict[str, set[str]] = {}  # queue -> senders

    def wait_for(self, queues: set[str], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not queues <= self.waiting.keys():
            if time.monotonic() > deadline:
                raise AssertionError(f"no server announced waiters on {queues - self.waiting.keys()}")
            for note in self.conn.notifies(timeout=0.5):
                sender, kind, *names = note.payload.split(" ")
                if kind == "p":
                    for q in names:
                        self.waiting.setdefault(q, set()).add(sender)

    def close(self) -> None:
        self.conn.close()
