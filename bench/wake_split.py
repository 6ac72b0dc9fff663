"""Where an enqueue-to-claim wake-up's time goes, from the client's side. For each sample a worker's
long-poll is parked on a queue; after `--idle-ms` of quiet an enqueue on another queue (nobody waits
there) is timed, then after the same quiet again the enqueue that wakes the worker, and the time until
the worker holds the claim. Both enqueues come after the same pause, so what the machine's idle states
cost is in both.

    .venv/bin/python bench/wake_split.py [--workers 1] [--samples 300] [--idle-ms 20]

The difference between the two enqueue round trips is what a parked waiter costs the producer (the claim
statement it sets off runs beside the enqueue's answer); the rest of the latency is the claim statement
and its commit. `jobq serve --workers N` runs on a fresh database (jobq_wake) of the server the admin URL
names. With several workers, the waiter and the producer may be in different processes (then the wake
goes through NOTIFY); with one it is always woken in memory."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import HOST, PAYLOAD, Service, expect, fresh_database
from bench.loadgen import Connection

WARMUP = 30
BODY = orjson.dumps({"payload": PAYLOAD})
POLL = orjson.dumps({"worker": "split", "wait_seconds": 30})


def percentiles(times: list[float]) -> str:
    times = sorted(times)
    return f"p50 {statistics.median(times):.2f} ms, p90 {times[int(len(times) * 0.9)]:.2f} ms"


async def measure(port: int, samples: int, idle: float) -> dict[str, list[float]]:
    worker = await Connection(HOST, port).open()
    producers = [await Connection(HOST, port).open() for _ in range(4)]
    out: dict[str, list[float]] = {"enqueue, nobody waiting": [], "enqueue, a claim waiting": [], "wake-up": []}
    try:
        for i in range(samples + WARMUP):
            producer = producers[i % len(producers)]
            pending = asyncio.create_task(worker.post("/queues/split/claim", POLL))
            await asyncio.sleep(idle)
            t = time.perf_counter()
            status, raw = await producer.post("/queues/split-idle/jobs", BODY)  # after the same pause
            expect(status, raw, 201)
            alone = time.perf_counter() - t
            await asyncio.sleep(idle)
            t0 = time.perf_counter()
            status, raw = await producer.post("/queues/split/jobs", BODY)
            expect(status, raw, 201)
            t1 = time.perf_counter()
            status, raw = await pending
            t2 = time.perf_counter()
            expect(status, raw, 200)
            job = orjson.loads(raw)["jobs"][0]
            status, raw = await producer.post(
                f"/jobs/{job['id']}/complete", b'{"claim_token":"%s"}' % job["claim_token"].encode()
            )
            expect(status, raw, 200)
            if i >= WARMUP:
                out["enqueue, nobody waiting"].append(alone * 1000)
                out["enqueue, a claim waiting"].append((t1 - t0) * 1000)
                out["wake-up"].append((t2 - t0) * 1000)
    finally:
        for c in [worker, *producers]:
            await c.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--idle-ms", type=float, default=20)
    p.add_argument("--port", type=int, default=8797)
    p.add_argument("--service-log", default="/tmp/jobq-wake-split.log", help="where the access log goes")
    args = p.parse_args()
    service = Service(
        fresh_database(args.admin_url, "jobq_wake"), args.workers, args.port, log=Path(args.service_log)
    ).start()
    try:
        found = asyncio.run(measure(args.port, args.samples, args.idle_ms / 1000))
    finally:
        service.stop()
    print(f"jobq serve --workers {args.workers}, {args.samples} samples, waiter parked {args.idle_ms:g} ms")
    for name, times in found.items():
        print(f"  {name}: {percentiles(times)}")


if __name__ == "__main__":
    main()
