"""jobq benchmark: the service's throughput and latency beside the physical limit of this machine.

In one run:
  1. the reference: the article's SQL driven by pgbench, a C client (--limit-script, a script kept outside
     this repository: by default limit/run.sh in the shared folder beside the checkout);
  2. `jobq serve` started on a fresh database, then measured through HTTP:
     enqueue (single-job requests, and batches of 100), claim + complete at limit 1 and 10,
     enqueue-to-claim latency for an idle long-polling worker, RSS with 1,000 waiting long-polls;
  3. every figure printed beside its reference as a ratio.

usage: python bench/run.py [--admin-url URL] [--workers 2] [--clients 16] [--seconds 10] [--json FILE]
The admin URL names a server where the benchmark may create and drop the databases jobq_bench and
jobq_limit (default: postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.loadgen import Connection

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = {"to": "user@example.com", "template": "welcome"}  # the reference's payload
ENQUEUE_BODY = orjson.dumps({"payload": PAYLOAD})
HOST = "127.0.0.1"


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


def run_limit(script: Path, admin_url: str, clients: int, seconds: int) -> dict[str, float]:
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
    return {"enqueue": tps[0], "claim_complete_1": tps[1], "claim_complete_10": tps[2] * 10, "raw": out}  # type: ignore[dict-item]


# --- the service --------------------------------------------------------------------------------------------


@dataclass
class Service:
    database_url: str
    workers: int
    port: int
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        env = {**os.environ, "JOBQ_DATABASE_URL": self.database_url, **self.extra_env}
        jobq = Path(sys.executable).parent / "jobq"
        self.proc = subprocess.Popen(
            [str(jobq), "serve", "--host", HOST, "--port", str(self.port), "--workers", str(self.workers),
             "--log-level", "warning"],
            env=env,
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
    """A key with every scope, as `jobq keys create --scope admin` makes it."""
    from app.auth.keys import new_key
    from app.db.keys import api_key_insert

    key, selector, key_hash = new_key()
    with psycopg.connect(url, autocommit=True) as conn:
        api_key_insert(conn, "bench", selector, key_hash, ["admin"], None)
    return key


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def preload(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs")
        conn.execute(
            "INSERT INTO jobs (queue_name, payload) SELECT 'bench', %s::jsonb FROM generate_series(1, %s)",
            (orjson.dumps(PAYLOAD).decode(), n),
        )
        conn.execute("VACUUM ANALYZE jobs")


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
    """Where the machine's CPU went during a measured window, in cores: the jobq API processes, this
    process (the load generator), PostgreSQL's processes (every backend on the machine), and the rest
    (other processes, the kernel's softirq work, steal) from /proc/stat. Read once at the start of the
    window and once at the end."""

    def __init__(self, api_pids: list[int]) -> None:
        self.api_pids = api_pids
        self.split: dict[str, float] = {}

    def _read(self) -> tuple[float, dict[str, float]]:
        cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        busy = (sum(int(v) for v in cpu) - int(cpu[3]) - int(cpu[4])) / _TICK  # all but idle and iowait
        self_cpu = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        return time.perf_counter(), {
            "api": sum(_cpu_seconds(p) for p in self.api_pids),
            "load generator": self_cpu,
            "postgres": sum(_cpu_seconds(p) for p in _postgres_pids()),
            "machine": busy,
        }

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> None:
        (t0, a), (t1, b) = self._start, self._read()
        cores = {k: (b[k] - a[k]) / (t1 - t0) for k in a}
        cores["other"] = max(0.0, cores["machine"] - cores["api"] - cores["load generator"] - cores["postgres"])
        self.split = {k: round(v, 2) for k, v in cores.items()}

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in self.split.items()) + " cores"


async def timed(clients: int, seconds: float, warmup: float, worker: Any, cpu: CpuSplit | None = None) -> float:
    """Run `clients` loops of `worker(conn, counter)`; return units per second over `seconds` after warmup."""
    counter = [0]
    stop = asyncio.Event()
    conns = [await Connection(HOST, worker.port).open() for _ in range(clients)]

    async def loop(conn: Connection) -> None:
        while not stop.is_set():
            await worker(conn, counter)

    tasks = [asyncio.create_task(loop(c)) for c in conns]
    await asyncio.sleep(warmup)
    if cpu:
        cpu.start()
    start_count, start = counter[0], time.perf_counter()
    await asyncio.sleep(seconds)
    done, elapsed = counter[0] - start_count, time.perf_counter() - start
    if cpu:
        cpu.stop()
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in conns:
        await c.close()
    return done / elapsed


class Enqueue:
    def __init__(self, port: int, batch: int) -> None:
        self.port = port
        self.batch = batch
        self.path = "/queues/bench/jobs/batch" if batch > 1 else "/queues/bench/jobs"
        self.body = orjson.dumps({"jobs": [{"payload": PAYLOAD}] * batch}) if batch > 1 else ENQUEUE_BODY

    async def __call__(self, conn: Connection, counter: list[int]) -> None:
        status, _ = await conn.post(self.path, self.body)
        assert status == 201, status
        counter[0] += self.batch


class ClaimComplete:
    def __init__(self, port: int, limit: int) -> None:
        self.port = port
        self.limit = limit
        self.claim = orjson.dumps({"worker": "bench", "limit": limit, "lease_seconds": 60})

    async def __call__(self, conn: Connection, counter: list[int]) -> None:
        status, body = await conn.post("/queues/bench/claim", self.claim)
        assert status == 200, (status, body)
        jobs = orjson.loads(body)["jobs"]
        if not jobs:
            raise RuntimeError("the queue ran dry: preload more jobs")
        if self.limit == 1:
            job = jobs[0]
            status, _ = await conn.post(
                f"/jobs/{job['id']}/complete", b'{"claim_token":"%s"}' % job["claim_token"].encode()
            )
            assert status == 200, status
        else:
            items = [{"id": j["id"], "claim_token": j["claim_token"]} for j in jobs]
            status, _ = await conn.post("/jobs/complete", orjson.dumps({"jobs": items}))
            assert status == 200, status
        counter[0] += len(jobs)


async def latency(port: int, samples: int) -> dict[str, float]:
    """An idle worker long-polls; a producer enqueues one job; time from sending the enqueue to the
    worker holding the claim. Sequential samples, the worker re-parked before each."""
    worker = await Connection(HOST, port).open()
    producers = [await Connection(HOST, port).open() for _ in range(4)]  # spread over server processes
    poll = orjson.dumps({"worker": "lat", "wait_seconds": 30})
    times = []
    for i in range(samples + 50):
        pending = asyncio.create_task(worker.post("/queues/lat/claim", poll))
        await asyncio.sleep(0.003)  # the worker is parked, idle
        producer = producers[i % len(producers)]
        t0 = time.perf_counter()
        status, _ = await producer.post("/queues/lat/jobs", ENQUEUE_BODY)
        assert status == 201
        status, body = await pending
        t1 = time.perf_counter()
        job = orjson.loads(body)["jobs"][0]
        await producer.post(f"/jobs/{job['id']}/complete", b'{"claim_token":"%s"}' % job["claim_token"].encode())
        if i >= 50:  # warm-up samples dropped
            times.append((t1 - t0) * 1000)
    for c in [worker, *producers]:
        await c.close()
    times.sort()
    return {
        "samples": len(times),
        "p50_ms": statistics.median(times),
        "p99_ms": times[int(len(times) * 0.99) - 1],
        "max_ms": times[-1],
    }


async def waiting_rss(service: Service, waiters: int) -> dict[str, Any]:
    conns = [await Connection(HOST, service.port).open() for _ in range(waiters)]
    poll = orjson.dumps({"worker": "idle", "wait_seconds": 30})
    pending = [asyncio.create_task(c.post("/queues/rss/claim", poll)) for c in conns]
    await asyncio.sleep(3)
    per_process = {pid: rss_mib(pid) for pid in service.pids()}
    feeder = await Connection(HOST, service.port).open()
    body = orjson.dumps({"jobs": [{"payload": i} for i in range(waiters)]})
    status, _ = await feeder.post("/queues/rss/jobs/batch", body)
    assert status == 201
    answers = await asyncio.gather(*pending)
    served = sum(len(orjson.loads(b)["jobs"]) for _, b in answers)
    for c in [*conns, feeder]:
        await c.close()
    workers = [v for pid, v in per_process.items() if pid != service.pids()[0]] or list(per_process.values())
    return {
        "waiters": waiters,
        "served_after_enqueue": served,
        "rss_mib_per_worker_process": [round(v, 1) for v in workers],
        "rss_mib_max_process": round(max(workers), 1),
        "rss_mib_supervisor": round(per_process[service.pids()[0]], 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--workers", type=int, default=2, help="jobq serve --workers (default 2)")
    p.add_argument("--clients", default="16,64", help="concurrent HTTP connections, a list (default 16,64)")
    p.add_argument("--seconds", type=float, default=10, help="measured seconds per phase (default 10)")
    p.add_argument("--latency-samples", type=int, default=1000)
    p.add_argument("--waiters", type=int, default=1000)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--limit-script", default=str(ROOT.parent / "shared" / "limit" / "run.sh"))
    p.add_argument("--skip-limit", action="store_true", help="do not run the pgbench reference")
    p.add_argument("--only", help="comma-separated phases: enqueue,batch,claim1,claim10,latency,rss")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--auth", action="store_true", help="JOBQ_AUTH=on, every request with an API key")
    args = p.parse_args()

    clients = [int(c) for c in args.clients.split(",")]
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    phases = set((args.only or "enqueue,batch,claim1,claim10,latency,rss").split(","))

    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}, "args": vars(args)}
    if not args.skip_limit:
        print("== reference: the article's SQL through pgbench (8 clients, 10 s per phase)", flush=True)
        ref = run_limit(Path(args.limit_script), args.admin_url, 8, 10)
        print(ref.pop("raw"), flush=True)  # type: ignore[arg-type]
        results["reference"] = ref

    url = fresh_database(args.admin_url, "jobq_bench")
    service = Service(url, args.workers, args.port, {"JOBQ_AUTH": "on"} if args.auth else {}).start()
    if args.auth:
        Connection.extra_headers = f"Authorization: Bearer {create_key(url)}\r\n".encode()
    measured: dict[str, dict[int, float]] = {}
    cpu_split: dict[str, dict[int, dict[str, float]]] = {}

    def phase(key: str, label: str, worker: Any, preload_rows: int = 0, scale: int = 1) -> None:
        for n in clients:
            if preload_rows:
                preload(url, preload_rows)
            cpu = CpuSplit(service.pids()[1:] or service.pids())  # --workers 1 serves in the supervisor
            rate = asyncio.run(timed(max(1, n // scale), args.seconds, 2, worker, cpu))
            measured.setdefault(key, {})[n] = rate
            cpu_split.setdefault(key, {})[n] = cpu.split
            print(f"{label}, {n} connections: {rate:.0f} jobs/s; CPU: {cpu}", flush=True)

    try:
        if "enqueue" in phases:
            phase("enqueue", "enqueue, single-job requests", Enqueue(args.port, 1))
        if "batch" in phases:
            phase("enqueue_batch100", "enqueue, batches of 100", Enqueue(args.port, 100), scale=4)
        if "claim1" in phases:
            phase("claim_complete_1", "claim + complete, limit 1", ClaimComplete(args.port, 1), 400_000)
        if "claim10" in phases:
            phase("claim_complete_10", "claim 10 + batch complete", ClaimComplete(args.port, 10), 1_000_000)
        if "latency" in phases:
            results["latency"] = asyncio.run(latency(args.port, args.latency_samples))
            print(f"enqueue-to-claim latency: {results['latency']}", flush=True)
        if "rss" in phases:
            results["rss"] = asyncio.run(waiting_rss(service, args.waiters))
            print(f"RSS with waiting long-polls: {results['rss']}", flush=True)
    finally:
        service.stop()
    results["measured"] = measured
    results["cpu_cores"] = cpu_split
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def report(results: dict[str, Any]) -> None:
    ref = results.get("reference", {})
    m = results["measured"]
    rows = [
        ("enqueue, single-job requests", "enqueue", "enqueue", 0.5),
        ("enqueue, batches of 100 (connections / 4)", "enqueue_batch100", "enqueue", None),
        ("claim + complete, limit 1", "claim_complete_1", "claim_complete_1", 0.5),
        ("claim 10 + batch complete", "claim_complete_10", "claim_complete_10", None),
    ]
    print("\n| figure | connections | jobq (jobs/s) | raw SQL, 8 clients (jobs/s) | ratio | target |")
    print("|---|---:|---:|---:|---:|---|")
    for label, key, ref_key, target in rows:
        for n, rate in m.get(key, {}).items():
            r = ref.get(ref_key)
            ratio = f"{rate / r:.2f}" if r else "-"
            goal = f">= {target}" if target else "-"
            print(f"| {label} | {n} | {rate:.0f} | {f'{r:.0f}' if r else '-'} | {ratio} | {goal} |")
    if lat := results.get("latency"):
        print(
            f"\nenqueue-to-claim latency, {lat['samples']} samples: p50 {lat['p50_ms']:.2f} ms, "
            f"p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms (targets: p50 <= 5, p99 <= 25)"
        )
    if rss := results.get("rss"):
        print(
            f"RSS with {rss['waiters']} waiting long-polls: API worker processes "
            f"{rss['rss_mib_per_worker_process']} MiB, supervisor {rss['rss_mib_supervisor']} MiB "
            f"(target <= 200 MiB per API process); {rss['served_after_enqueue']} served by one batch enqueue"
        )


if __name__ == "__main__":
    main()
