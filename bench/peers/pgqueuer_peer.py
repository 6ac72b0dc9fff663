"""PgQueuer (the strongest in-process peer) measured with its own API at its best setting, on a fresh database
(`jobq_peer`) of the same PostgreSQL: drain, single-job and bulk enqueue, and wake latency.

Its best setting, from its own docs (performance tuning, benchmarks): the asyncpg driver, one direct
connection per QueueManager, `batch_size` 200, two processes; the schema as `pgq install` makes it (durable,
as jobq is) with `pgq autovac`, its recommended autovacuum settings (jobq ships its own in a migration).
Each load runs in child processes started here, each counting what it did in its own shared counter; a child
that dies fails the phase.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import multiprocessing
import queue
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import orjson
import psycopg
from psycopg import sql

from bench.harness import PAYLOAD, CpuSplit, PhaseError, fresh_database, rss_mib
from bench.phases import WARMUP_SAMPLES, summarize

VERSION = "1.6.0"
DATABASE = "jobq_peer"
ENTRYPOINT = "bench"
BATCH_SIZE = 200
PAYLOAD_BYTES = orjson.dumps(PAYLOAD)
_mp = multiprocessing.get_context("spawn")


def asyncpg_dsn(conninfo: str) -> str:
    """asyncpg takes a URI, not libpq's key=value form."""
    info = psycopg.conninfo.conninfo_to_dict(conninfo)
    user = quote(str(info.get("user", "")))
    password = f":{quote(str(info['password']))}" if info.get("password") else ""
    host = str(info.get("host", ""))
    query = {}
    if host.startswith("/"):
        query["host"], host = host, ""
    port = f":{info['port']}" if info.get("port") and host else ""
    if info.get("port") and not host:
        query["port"] = str(info["port"])
    auth = f"{user}{password}@" if user else ""
    tail = f"?{urlencode(query)}" if query else ""
    return f"postgresql://{auth}{host}{port}/{quote(str(info.get('dbname', '')))}{tail}"


def _pgq(dsn: str, *command: str) -> None:
    pgq = Path(sys.executable).parent / "pgq"
    subprocess.run([str(pgq), "--pg-dsn", asyncpg_dsn(dsn), *command], check=True, capture_output=True)


def fresh(admin_url: str) -> str:
    """A fresh database with PgQueuer's schema, installed by its own CLI."""
    installed = importlib.metadata.version("pgqueuer")
    if installed != VERSION:
        raise RuntimeError(f"PgQueuer {installed} installed, the benchmark pins {VERSION}: make bench")
    url = fresh_database(admin_url, DATABASE)
    _pgq(url, "install")
    _pgq(url, "autovac")
    return url


# --- in the child processes ---------------------------------------------------------------------------------


async def _until(stop: Any) -> None:
    """Wait for a multiprocessing.Event (it cannot be awaited; 20 ms polls cost nothing measurable)."""
    while not stop.is_set():  # noqa: ASYNC110
        await asyncio.sleep(0.02)


def _child(main: Callable[..., Any], *args: Any) -> None:
    import uvloop

    uvloop.run(main(*args))


async def _consume(dsn: str, batch_size: int, counter: Any, ready: Any, stop: Any, out: Any = None) -> None:
    """A QueueManager on one asyncpg connection with a no-op entrypoint; with `out`, each job's enqueue time
    (its payload) and the time its handler started go there."""
    import asyncpg
    from pgqueuer import Job, PgQueuer

    conn = await asyncpg.connect(dsn)
    pgq = PgQueuer.from_asyncpg_connection(conn)

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        if out is not None:
            out.put((job.payload, time.monotonic()))
        counter.value += 1

    async def watch() -> None:
        await _until(stop)
        pgq.shutdown.set()

    watcher = asyncio.create_task(watch())
    ready.set()
    try:
        await pgq.run(batch_size=batch_size)
    finally:
        watcher.cancel()
        await conn.close()


async def _enqueue(dsn: str, connections: int, batch: int, counter: Any, ready: Any, stop: Any) -> None:
    """`connections` enqueuers, each calling Queries.enqueue in a loop: one job a call, or `batch` as lists."""
    import asyncpg
    from pgqueuer import Queries

    conns = [await asyncpg.connect(dsn) for _ in range(connections)]
    done = asyncio.Event()

    async def loop(q: Queries) -> None:
        if batch == 1:
            while not done.is_set():
                await q.enqueue(ENTRYPOINT, PAYLOAD_BYTES, 0)
                counter.value += 1
        else:
            entrypoints, payloads, priorities = [ENTRYPOINT] * batch, [PAYLOAD_BYTES] * batch, [0] * batch
            while not done.is_set():
                await q.enqueue(entrypoints, payloads, priorities)  # type: ignore[arg-type]
                counter.value += batch

    tasks = [asyncio.create_task(loop(Queries.from_asyncpg_connection(c))) for c in conns]
    ready.set()
    await _until(stop)
    done.set()
    await asyncio.gather(*tasks)
    for c in conns:
        await c.close()


# --- in this process ----------------------------------------------------------------------------------------


class Fleet:
    """Child processes, each with its own counter, started together and stopped together."""

    def __init__(self, target: Callable[..., Any], args: list[tuple[Any, ...]], out: Any = None) -> None:
        self.stop_event = _mp.Event()
        self.counters = [_mp.RawValue("q", 0) for _ in args]
        self.ready = [_mp.Event() for _ in args]
        self.procs = [
            _mp.Process(target=_child, args=(target, *a, c, r, self.stop_event, *([] if out is None else [out])))
            for a, c, r in zip(args, self.counters, self.ready, strict=True)
        ]

    def __enter__(self) -> Fleet:
        for p in self.procs:
            p.start()
        deadline = time.monotonic() + 60
        try:
            for r in self.ready:
                while not r.wait(0.1):
                    self.check()
                    if time.monotonic() > deadline:
                        raise PhaseError("PgQueuer processes did not start")
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()
        if exc[0] is None and any(p.exitcode != 0 for p in self.procs):
            raise PhaseError(f"a PgQueuer process failed (exit codes {[p.exitcode for p in self.procs]})")

    def _stop(self) -> None:
        self.stop_event.set()
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(60)
            if p.is_alive():
                p.terminate()
                p.join(10)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def check(self) -> None:
        for p in self.procs:
            if p.exitcode is not None:
                raise PhaseError(f"a PgQueuer process ended during the phase (exit code {p.exitcode})")

    def count(self) -> int:
        self.check()
        return sum(c.value for c in self.counters)

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.1, left))
            self.check()


def measure(fleet: Fleet, warmup: float, seconds: float) -> dict[str, Any]:
    """Jobs per second over `seconds` after `warmup`, the CPU split, and the children's RSS at the end."""
    fleet.sleep(warmup)
    cpu = CpuSplit(fleet.pids(), label="pgqueuer")
    cpu.start()
    c0, t0 = fleet.count(), time.perf_counter()
    fleet.sleep(seconds)
    c1, t1 = fleet.count(), time.perf_counter()
    cpu.stop()
    if c1 == c0:
        raise PhaseError(f"PgQueuer did no job in {seconds} s")
    rate = (c1 - c0) / (t1 - t0)
    return {
        "rate": rate,
        "cpu_cores": cpu.split,
        "cpu_us_per_job": cpu.us_per_job(rate),
        "rss_mib": [round(rss_mib(p), 1) for p in fleet.pids()],
        "cpu": str(cpu),
    }


def _spread(total: int, processes: int) -> list[int]:
    n = min(total, processes)
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def enqueue(
    admin_url: str, clients: int, batch: int, warmup: float, seconds: float, processes: int = 2
) -> dict[str, Any]:
    """`clients` concurrent enqueuers (asyncpg connections, spread over `processes`), `batch` jobs a call."""
    url = fresh(admin_url)
    dsn = asyncpg_dsn(url)
    args = [(dsn, n, batch) for n in _spread(clients, processes)]
    with Fleet(_enqueue, args) as fleet:
        out = measure(fleet, warmup, seconds)
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()
    if not row or row[0] < out["rate"] * seconds * 0.9:
        raise PhaseError(f"PgQueuer counted {out['rate'] * seconds:.0f} enqueues, its table holds {row}")
    return {"clients": clients, "batch": batch, "processes": len(args), **out}


def _bulk_load(url: str, n: int) -> None:
    """`n` jobs through PgQueuer's own bulk enqueue, 10,000 a call."""
    import asyncpg
    from pgqueuer import Queries

    async def load() -> None:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            q = Queries.from_asyncpg_connection(conn)
            for start in range(0, n, 10_000):
                k = min(10_000, n - start)
                await q.enqueue([ENTRYPOINT] * k, [PAYLOAD_BYTES] * k, [0] * k)
        finally:
            await conn.close()

    asyncio.run(load())


def _left(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueuer WHERE status = 'queued'").fetchone()
    return int(row[0]) if row else 0


def drain(admin_url: str, jobs: int, warmup: float, seconds: float, processes: int = 2) -> dict[str, Any]:
    """A pre-filled queue drained by `processes` QueueManagers with a no-op entrypoint: first right after the
    bulk load (statistics taken while the table was empty, autovacuum off for it), then, loaded again, after
    `ANALYZE pgqueuer`, as jobq's drain phases run."""
    url = fresh(admin_url)
    dsn = asyncpg_dsn(url)
    results: dict[str, Any] = {"jobs": jobs, "processes": processes, "batch_size": BATCH_SIZE}
    for table in ("unanalyzed", "analyzed"):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
            if table == "unanalyzed":
                conn.execute("ANALYZE pgqueuer")
                conn.execute("ALTER TABLE pgqueuer SET (autovacuum_enabled = false)")
        _bulk_load(url, jobs)
        if table == "analyzed":
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ANALYZE pgqueuer")
        with Fleet(_consume, [(dsn, BATCH_SIZE)] * processes) as fleet:
            results[table] = measure(fleet, warmup, seconds)
        if _left(url) == 0:
            raise PhaseError(f"PgQueuer's queue ran dry ({jobs:,} jobs): preload more (--preload)")
        if table == "unanalyzed":
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(sql.SQL("ALTER TABLE pgqueuer RESET (autovacuum_enabled)"))
    return results


def latency(admin_url: str, samples: int, idle: float) -> dict[str, float]:
    """One idle QueueManager; this process enqueues one job at a time (Queries.enqueue on asyncpg, the job's
    payload its enqueue time) and the handler reports when it started: both on the same monotonic clock."""
    import asyncpg
    from pgqueuer import Queries

    url = fresh(admin_url)
    dsn = asyncpg_dsn(url)
    started = _mp.Queue()

    async def produce(fleet: Fleet) -> list[float]:
        conn = await asyncpg.connect(dsn)
        q = Queries.from_asyncpg_connection(conn)
        loop = asyncio.get_running_loop()
        times = []
        try:
            for i in range(samples + WARMUP_SAMPLES):
                await asyncio.sleep(idle)
                t0 = time.monotonic()
                await q.enqueue(ENTRYPOINT, repr(t0).encode(), 0)
                try:
                    payload, t1 = await loop.run_in_executor(None, started.get, True, 10)
                except queue.Empty:
                    raise PhaseError("PgQueuer did not run the job within 10 s") from None
                fleet.check()
                if payload != repr(t0).encode():
                    raise PhaseError(f"PgQueuer ran {payload!r}, not the job just enqueued")
                if i >= WARMUP_SAMPLES:
                    times.append((t1 - t0) * 1000)
        finally:
            await conn.close()
        return times

    with Fleet(_consume, [(dsn, BATCH_SIZE)], out=started) as fleet:
        fleet.sleep(1)  # listening
        times = asyncio.run(produce(fleet))
    return summarize(times)
