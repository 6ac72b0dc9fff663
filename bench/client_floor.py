"""What the client library adds to a request, with no job queue behind it: sequential POSTs of the latency phase's
enqueue body to a trivial ASGI app under the same uvicorn as jobq's (httptools, uvloop, no access log), once with
the lean client (bench/loadgen.py) and once with httpx.AsyncClient, alternated in rounds. The difference is the
client's own time per request, which every figure measured through that client carries: the latency phase's httpx
wake-up has a whole request of the producer's and the worker's answer on its path (BENCHMARKS.md, wake-up).

With --idle-ms, the client sleeps that long before each request, as the latency phase's producer does (20 ms
there): the machine's cores and caches go cold meanwhile, and a client that runs more code per request pays for
it more.

usage: .venv/bin/python bench/client_floor.py [--requests 2000] [--rounds 3] [--idle-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import HOST, PAYLOAD
from bench.instructions import TRIVIAL_APP
from bench.loadgen import Connection
from bench.phases import ENQUEUE_BODY

PORT = 8794


async def _up() -> None:
    for _ in range(200):
        try:
            conn = await Connection(HOST, PORT).open()
            await conn.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError("the trivial app did not start")


WARMUP = 100


async def lean(requests: int, idle: float) -> tuple[list[float], float]:
    """Round trips (ms) after the warm-up, and the client's CPU a timed request (ms, the sleeps excluded)."""
    conn = await Connection(HOST, PORT).open()
    times, cpu = [], 0.0
    try:
        for i in range(requests + WARMUP):
            if idle:
                await asyncio.sleep(idle)
            c0, t0 = time.process_time(), time.perf_counter()
            status, _ = await conn.post("/queues/lat/jobs", ENQUEUE_BODY)
            t1, c1 = time.perf_counter(), time.process_time()
            assert status == 201, status
            if i >= WARMUP:
                times.append((t1 - t0) * 1000)
                cpu += c1 - c0
    finally:
        await conn.close()
    return times, cpu / requests * 1000


async def with_httpx(requests: int, idle: float) -> tuple[list[float], float]:
    import httpx

    times, cpu = [], 0.0
    async with httpx.AsyncClient(base_url=f"http://{HOST}:{PORT}", timeout=60) as client:
        for i in range(requests + WARMUP):
            if idle:
                await asyncio.sleep(idle)
            c0, t0 = time.process_time(), time.perf_counter()
            r = await client.post("/queues/lat/jobs", json={"payload": PAYLOAD})
            t1, c1 = time.perf_counter(), time.process_time()
            assert r.status_code == 201, r.status_code
            if i >= WARMUP:
                times.append((t1 - t0) * 1000)
                cpu += c1 - c0
    return times, cpu / requests * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle-ms", type=float, default=0, help="sleep this long before each request")
    args = p.parse_args()
    import uvloop

    uvloop.install()  # the client's loop as bench/run.py's latency phase runs it
    work = Path(tempfile.mkdtemp(prefix="jobq-client-floor-"))
    (work / "trivial_app.py").write_text(TRIVIAL_APP)
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(work), "trivial_app:app", "--port", str(PORT),
         "--log-level", "warning", "--no-access-log", "--no-server-header", "--http", "httptools", "--loop", "uvloop"],
    )  # fmt: skip
    try:
        asyncio.run(_up())
        p50 = {"lean": [], "httpx": []}
        for n in range(args.rounds):
            for name, run in (("lean", lean), ("httpx", with_httpx))[:: 1 if n % 2 == 0 else -1]:
                times, cpu = asyncio.run(run(args.requests, args.idle_ms / 1000))
                p50[name].append(statistics.median(times))
                q = statistics.quantiles(times, n=100)
                print(
                    f"round {n + 1}, {name}: p50 {statistics.median(times):.3f} ms, p90 {q[89]:.3f} ms, "
                    f"client CPU {cpu:.3f} ms a timed request",
                    flush=True,
                )
        lean_p50, httpx_p50 = statistics.median(p50["lean"]), statistics.median(p50["httpx"])
        print(
            f"median of the rounds' p50: lean {lean_p50:.3f} ms, httpx {httpx_p50:.3f} ms; httpx adds "
            f"{httpx_p50 - lean_p50:.3f} ms to a request against a server that does nothing",
            flush=True,
        )
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
