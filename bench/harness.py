"""The benchmark's machinery: databases, the jobq service under test, timed load loops, the CPU split."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
import psycopg
from psycopg import sql

from bench.loadgen import Connection

PAYLOAD = {"to": "user@example.com", "template": "welcome"}  # the reference's payload
HOST = "127.0.0.1"


class PhaseError(RuntimeError):
    """A phase misbehaved (an unexpected answer, a queue that ran dry): its figure would be a lie."""


def expect(status: int, body: bytes, *want: int) -> None:
    if status not in want:
        raise PhaseError(f"HTTP {status} (expected {'/'.join(map(str, want))}): {body[:500]!r}")


def with_db(url: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]


def fresh_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_db(admin_url, name)


# --- the reference ----------------------------------------------------------------------------------------


def run_limit(script: Path, admin_url: str, clients: int, seconds: int) -> dict[str, float | str]:
    """The article's SQL through pgbench: INSERT, claim + complete, claim 10 + complete 10 (jobs/s)."""
    url = fresh_database(admin_url, "jobq_limit")
    out = subprocess.run(
        ["bash", str(script), str(clients), str(seconds)],
        env={**os.environ, "PGURL": url},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    tps = [float(x) for x in re.findall(r"^tps = ([\d.]+)", out, re.M)]
    if len(tps) != 3:
        raise RuntimeError(f"unexpected output from {script}:\n{out}")
    return {"enqueue": tps[0], "claim_complete_1": tps[1], "claim_complete_10": tps[2] * 10, "raw": out}


# --- the service --------------------------------------------------------------------------------------------


@dataclass
class Service:
    database_url: str
    workers: int
    port: int
    extra_env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None  # where its stdout (the access log) goes; the terminal when None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        env = {**os.environ, "JOBQ_DATABASE_URL": self.database_url, **self.extra_env}
        jobq = Path(sys.executable).parent / "jobq"
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(self.log.open("ab")) if self.log else None
            self.proc = subprocess.Popen(
                [str(jobq), "serve", "--host", HOST, "--port", str(self.port), "--workers", str(self.workers),
                 "--log-level", "warning"],
                env=env,
                stdout=out,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = asyncio.run(_get(self.port, "/readyz"))
                if status == 200:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("jobq did not become ready")
            time.sleep(0.2)

    def pids(self) -> list[int]:
        """The supervisor, then the API worker processes (not multiprocessing's resource tracker)."""
        assert self.proc is not None
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        workers = [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        return [self.proc.pid, *workers]

    def api_pids(self) -> list[int]:
        """The processes that serve requests (with --workers 1 the supervisor serves)."""
        return self.pids()[1:] or self.pids()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


async def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = await Connection(HOST, port).open()
    try:
        return await conn.get(path)
    finally:
        await conn.close()


def create_key(url: str) -> str:
    """A key with every scope and no request rate (the benchmark measures the service, not the key's quota),
    as `jobq keys create --scope admin --rate 0` makes it."""
    from app.auth.keys import new_key
    from app.db.keys import api_key_insert

    key, selector, key_hash = new_key()
    with psycopg.connect(url, autocommit=True) as conn:
        api_key_insert(conn, "bench", selector, key_hash, ["admin"], None, rate=0)
    return key


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- the jobs table as a drain phase finds it ----------------------------------------------------------------

_INSERT = "INSERT INTO jobq.jobs (queue_name, payload) SELECT 'bench', %s::jsonb FROM generate_series(1, %s)"

# Flow control in the drain phases (bench/run.py --flow, --groups): the bench queue's configuration
# (queue_state columns, e.g. {"concurrency": 1000, "fair": true}) and how many groups its jobs spread over.
FLOW: dict[str, object] = {}
GROUPS = 0


def _load(conn: psycopg.Connection[Any], n: int) -> None:
    if GROUPS:
        conn.execute(
            "INSERT INTO jobq.jobs (queue_name, payload, group_key)"
            " SELECT 'bench', %s::jsonb, 'g' || (g %% %s) FROM generate_series(1, %s) g",
            (orjson.dumps(PAYLOAD).decode(), GROUPS, n),
        )
    else:
        conn.execute(_INSERT, (orjson.dumps(PAYLOAD).decode(), n))
    if FLOW:
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in FLOW)
        conn.execute(
            sql.SQL(
                "INSERT INTO jobq.queue_state (queue_name, {}) VALUES ('bench', {})"
                " ON CONFLICT (queue_name) DO UPDATE SET ({}) = ROW({})"
            ).format(
                cols,
                sql.SQL(", ").join(sql.Literal(v) for v in FLOW.values()),
                cols,
                sql.SQL(", ").join(sql.Literal(v) for v in FLOW.values()),
            )
        )


def preload(url: str, n: int) -> None:
    """`n` pending jobs on a freshly vacuumed and analyzed table (the reference's starting point)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE jobq.jobs")
        if n:
            conn.execute(_INSERT, (orjson.dumps(PAYLOAD).decode(), n))
        conn.execute("VACUUM ANALYZE jobq.jobs")


def load_unanalyzed(url: str, n: int) -> list[str] | None:
    """The table as a user has it right after a bulk load: statistics taken while it was empty, and no
    autovacuum to refresh them during the phase. Returns the table's reloptions, for restore_autovacuum."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'jobq.jobs'::regclass").fetchone()
        conn.execute("TRUNCATE jobq.jobs")
        conn.execute("ANALYZE jobq.jobs")
        conn.execute("ALTER TABLE jobq.jobs SET (autovacuum_enabled = false)")
        _load(conn, n)
    return row[0] if row else None


def restore_autovacuum(url: str, reloptions: list[str] | None) -> None:
    was = next((o for o in reloptions or [] if o.startswith("autovacuum_enabled=")), None)
    with psycopg.connect(url, autocommit=True) as conn:
        if was:
            conn.execute(sql.SQL("ALTER TABLE jobq.jobs SET ({})").format(sql.SQL(was)))
        else:
            conn.execute("ALTER TABLE jobq.jobs RESET (autovacuum_enabled)")


def load_analyzed(url: str, n: int) -> None:
    """The same load, then `ANALYZE jobq.jobs` (and nothing else: no VACUUM, so only the statistics differ)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE jobq.jobs")
        _load(conn, n)
        conn.execute("ANALYZE jobq.jobs")


# --- CPU ---------------------------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _postgres_pids() -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() in ("postgres", "postmaster"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


class CpuSplit:
    """Where the machine's CPU went during a measured window, in cores: the processes under test (`label`:
    jobq's API processes, or PgQueuer's), this process (the load generator), PostgreSQL's processes
    (every backend on the machine), and the rest (other processes, the kernel's softirq work, steal) from
    /proc/stat. Read once at the start of the window and once at the end."""

    def __init__(self, pids: list[int], label: str = "api") -> None:
        self.pids = pids
        self.label = label
        self.split: dict[str, float] = {}

    def _read(self) -> tuple[float, dict[str, float]]:
        cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        busy = (sum(int(v) for v in cpu) - int(cpu[3]) - int(cpu[4])) / _TICK  # all but idle and iowait
        self_cpu = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        return time.perf_counter(), {
            self.label: sum(_cpu_seconds(p) for p in self.pids),
            "load generator": self_cpu,
            "postgres": sum(_cpu_seconds(p) for p in _postgres_pids()),
            "machine": busy,
        }

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> None:
        (t0, a), (t1, b) = self._start, self._read()
        cores = {k: (b[k] - a[k]) / (t1 - t0) for k in a}
        cores["other"] = max(0.0, cores["machine"] - sum(v for k, v in cores.items() if k != "machine"))
        self.split = {k: round(v, 3) for k, v in cores.items()}

    def us_per_job(self, rate: float) -> float | None:
        """CPU of the processes under test per job, in microseconds."""
        return self.split[self.label] / rate * 1e6 if rate else None

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in self.split.items()) + " cores"


# --- timed load ---------------------------------------------------------------------------------------------


class Worker(Protocol):
    port: int

    def __call__(self, conn: Connection, counter: list[int]) -> Awaitable[None]: ...


async def _check(tasks: list[asyncio.Task[None]], seconds: float) -> None:
    """Sleep `seconds`, but raise at once when a load loop failed (a phase never reports a figure that a
    dead loop made smaller)."""
    done, _ = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
    for t in done:
        t.result()


async def timed(clients: int, seconds: float, warmup: float, worker: Worker, cpu: CpuSplit | None = None) -> float:
    """Run `clients` loops of `worker(conn, counter)`; return units per second over `seconds` after warmup."""
    counter = [0]
    stop = asyncio.Event()
    conns = [await Connection(HOST, worker.port).open() for _ in range(clients)]

    async def loop(conn: Connection) -> None:
        while not stop.is_set():
            await worker(conn, counter)

    tasks = [asyncio.create_task(loop(c)) for c in conns]
    try:
        await _check(tasks, warmup)
        if cpu:
            cpu.start()
        start_count, start = counter[0], time.perf_counter()
        await _check(tasks, seconds)
        done, elapsed = counter[0] - start_count, time.perf_counter() - start
        if cpu:
            cpu.stop()
        stop.set()
        # A loop failing in its last request fails the phase too; one hanging for a minute is a failure.
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in conns:
            await c.close()
    if not done:
        raise PhaseError(f"no job done in {seconds} s")
    return done / elapsed
