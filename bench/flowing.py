"""Jobs flowing through: producers enqueue single jobs while workers long-poll the same queue, claim one job
at a time and hand its result in on their next claim, so that the workers are waiting when a job arrives (the
direct hand-off's case, app/core/dispatcher.py). Figures: jobs enqueued and jobs claimed a second, and the time
from an enqueue's answer to the claim that took the job (each job carries its producer's clock reading).

    .venv/bin/python bench/flowing.py [--workers 2] [--producers 8] [--consumers 32] [--seconds 10] [--rounds 1]

`jobq serve --workers N` runs on a fresh database (jobq_flowing) of the server the admin URL names; the load
generator is this process (one event loop, keep-alive connections)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import HOST, CpuSplit, PhaseError, Service, expect, fresh_database
from bench.loadgen import Connection

QUEUE = "flowing"


async def run(
    port: int, producers: int, consumers: int, seconds: float, warmup: float, api: list[int]
) -> dict[str, Any]:
    stop = asyncio.Event()
    counting = asyncio.Event()
    enqueued = [0]
    claimed = [0]
    waits: list[float] = []

    async def produce(conn: Connection) -> None:
        while not stop.is_set():
            body = orjson.dumps({"payload": {"t": time.perf_counter()}})
            status, raw = await conn.post(f"/queues/{QUEUE}/jobs", body)
            expect(status, raw, 201)
            if counting.is_set():
                enqueued[0] += 1

    async def consume(conn: Connection) -> None:
        done: list[dict[str, object]] = []
        while not stop.is_set():
            body: dict[str, object] = {"worker": "flow", "limit": 1, "wait_seconds": 2}
            if done:
                body["complete"] = done
            status, raw = await conn.post(f"/queues/{QUEUE}/claim", orjson.dumps(body))
            expect(status, raw, 200)
            now = time.perf_counter()
            jobs = orjson.loads(raw)["jobs"]
            done = [{"id": j["id"], "claim_token": j["claim_token"]} for j in jobs]
            if counting.is_set():
                claimed[0] += len(jobs)
                waits.extend(now - j["payload"]["t"] for j in jobs)

    conns = [await Connection(HOST, port).open() for _ in range(producers + consumers)]
    tasks = [asyncio.create_task(consume(c)) for c in conns[producers:]]
    await asyncio.sleep(0.5)  # the consumers parked first
    tasks += [asyncio.create_task(produce(c)) for c in conns[:producers]]
    cpu = CpuSplit(api)
    try:
        done, _ = await asyncio.wait(tasks, timeout=warmup, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            t.result()
        counting.set()
        cpu.start()
        t0 = time.perf_counter()
        done, _ = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            t.result()
        elapsed = time.perf_counter() - t0
        counting.clear()
        cpu.stop()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in conns:
            await c.close()
    if not waits:
        raise PhaseError("no job claimed")
    waits.sort()
    return {
        "enqueued_per_second": round(enqueued[0] / elapsed),
        "claimed_per_second": round(claimed[0] / elapsed),
        "wait_p50_ms": round(statistics.median(waits) * 1000, 2),
        "wait_p99_ms": round(waits[int(len(waits) * 0.99)] * 1000, 2),
        "cpu": str(cpu),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--producers", type=int, default=8)
    p.add_argument("--consumers", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--warmup", type=float, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--port", type=int, default=8093)
    a = p.parse_args()
    url = fresh_database(a.admin_url, "jobq_flowing")
    service = Service(url, a.workers, a.port, log=Path("/tmp/jobq-flowing-service.log")).start()
    try:
        for r in range(a.rounds):
            out = asyncio.run(run(a.port, a.producers, a.consumers, a.seconds, a.warmup, service.api_pids()))
            print(
                f"round {r + 1}: jobq serve --workers {a.workers}, {a.producers} producers, {a.consumers} consumers: "
                f"{out['enqueued_per_second']:,} enqueued/s, {out['claimed_per_second']:,} claimed/s, "
                f"enqueue answer to claim p50 {out['wait_p50_ms']} ms, p99 {out['wait_p99_ms']} ms; {out['cpu']}",
                flush=True,
            )
    finally:
        service.stop()


if __name__ == "__main__":
    main()
