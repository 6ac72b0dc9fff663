"""The latency phase's wake-up with each side's client chosen: the producer and the waiting worker each the lean
client (bench/loadgen.py) or httpx.AsyncClient, the four pairs in turn, each round. For each pair: the time from
sending the enqueue to the worker holding the claim, and the producer's own answer. Which side's client the
httpx figure's extra time sits on (BENCHMARKS.md, the wake-up row).

    .venv/bin/python bench/wake_clients.py [--workers 1] [--samples 300] [--rounds 2] [--idle-ms 20]

`jobq serve --workers N` runs on a fresh database (jobq_wake_clients) of the server the admin URL names.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import HOST, PAYLOAD, Service, expect, fresh_database
from bench.loadgen import Connection

WARMUP = 30
POLL = {"worker": "lat", "wait_seconds": 30}


Side = tuple[Callable[[], Awaitable[Any]], Callable[[str, Any], Awaitable[Any]], Callable[[], Awaitable[None]]]


async def _lean_side(port: int) -> Side:
    conn = await Connection(HOST, port).open()

    async def claim() -> Any:
        status, raw = await conn.post("/queues/lat/claim", orjson.dumps(POLL))
        expect(status, raw, 200)
        return orjson.loads(raw)

    async def post(path: str, body: Any) -> Any:
        status, raw = await conn.post(path, orjson.dumps(body))
        if status >= 300:
            raise RuntimeError(f"{path} answered {status}: {raw[:200]!r}")
        return orjson.loads(raw)

    return claim, post, conn.close


async def _httpx_side(port: int) -> Side:
    import httpx

    client = httpx.AsyncClient(base_url=f"http://{HOST}:{port}", timeout=60)

    async def claim() -> Any:
        r = await client.post("/queues/lat/claim", json=POLL)
        expect(r.status_code, r.content, 200)
        return r.json()

    async def post(path: str, body: Any) -> Any:
        r = await client.post(path, json=body)
        if r.status_code >= 300:
            raise RuntimeError(f"{path} answered {r.status_code}: {r.content[:200]!r}")
        return r.json()

    return claim, post, client.aclose


SIDES = {"lean": _lean_side, "httpx": _httpx_side}
PRODUCERS = 4  # connections taken in turn, as the latency phase does: with several API processes both wake paths


async def pair(port: int, producer: str, worker: str, samples: int, idle: float) -> tuple[float, float]:
    claim, _, close_worker = await SIDES[worker](port)
    producers = [await SIDES[producer](port) for _ in range(PRODUCERS)]
    wake, answer = [], []

    async def claimed_at() -> tuple[Any, float]:
        got = await claim()
        return got, time.perf_counter()  # when the worker holds its claim, whatever the producer's side is doing

    try:
        for i in range(samples + WARMUP):
            pending = asyncio.create_task(claimed_at())
            await asyncio.sleep(idle)
            post = producers[i % PRODUCERS][1]
            t0 = time.perf_counter()
            await post("/queues/lat/jobs", {"payload": PAYLOAD})
            t_answer = time.perf_counter()
            got, t_claim = await pending
            jobs = got["jobs"]
            if len(jobs) != 1:
                raise RuntimeError(f"the waiting claim answered {len(jobs)} jobs")
            await post(f"/jobs/{jobs[0]['id']}/complete", {"claim_token": jobs[0]["claim_token"]})
            if i >= WARMUP:
                wake.append((t_claim - t0) * 1000)
                answer.append((t_answer - t0) * 1000)
    finally:
        for _, _, close in producers:
            await close()
        await close_worker()
    return statistics.median(wake), statistics.median(answer)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--idle-ms", type=float, default=20)
    p.add_argument("--port", type=int, default=8798)
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = p.parse_args()
    import uvloop

    uvloop.install()  # the client's loop as bench/run.py's latency phase runs it
    url = fresh_database(args.admin_url, "jobq_wake_clients")
    service = Service(url, args.workers, args.port).start()
    try:
        pairs = [(producer, worker) for producer in ("lean", "httpx") for worker in ("lean", "httpx")]
        for n in range(args.rounds):
            for producer, worker in pairs if n % 2 == 0 else pairs[::-1]:
                wake, answer = asyncio.run(pair(args.port, producer, worker, args.samples, args.idle_ms / 1000))
                print(
                    f"round {n + 1}, producer {producer:5}, worker {worker:5}: wake-up p50 {wake:.2f} ms, "
                    f"the producer's answer p50 {answer:.2f} ms",
                    flush=True,
                )
    finally:
        service.stop()


if __name__ == "__main__":
    main()
