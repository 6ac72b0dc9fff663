"""The SDK-driven drain (bench/run.py --only sdk): the Python SDK's `Worker`, as its docs show it, draining a
preloaded queue, beside the raw-HTTP drain (claim 10 + batch complete, the lean load generator) on the same
service and the same load, alternated --rounds times.

The Worker runs in a process of its own (its CPU is counted apart from the API's and the load generator's),
with an async handler that returns at once: what is measured is the SDK's and the service's cost per job, not
a handler's. Its rate is the completed jobs counted by the service (`GET /queues/bench/stats`) over the
measured window, after a warm-up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.harness import CpuSplit, PhaseError, Service, load_analyzed
from bench.phases import ClaimComplete

ROOT = Path(__file__).resolve().parent.parent

# The worker process: the SDK's Worker with `concurrency` slots on the queue `bench`.
WORKER = """
import sys
from jobq_client import Worker

worker = Worker(sys.argv[1], api_key=sys.argv[3] or None, concurrency=int(sys.argv[2]), shutdown_grace=5)


@worker.handler("bench")
async def handle(job):
    return None


worker.run()
"""


def _completed(port: int, headers: dict[str, str]) -> int:
    r = httpx.get(f"http://127.0.0.1:{port}/queues/bench/stats", headers=headers, timeout=30)
    if r.status_code != 200:
        raise PhaseError(f"stats answered {r.status_code}: {r.text[:200]}")
    return int(r.json()["counts"]["completed"])


def sdk_drain(
    service: Service,
    url: str,
    port: int,
    headers: dict[str, str],
    concurrency: int,
    rows: int,
    seconds: float,
    warmup: float,
) -> dict[str, Any]:
    """One window of the SDK Worker draining `rows` jobs: its rate and the CPU per job of each process."""
    load_analyzed(url, rows)
    # The queue's finished-job counters outlive the table's rows: earlier rounds' completes are counted already.
    start = _completed(port, headers)
    key = headers.get("Authorization", "").removeprefix("Bearer ")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "clients" / "python")}
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, f"http://127.0.0.1:{port}", str(concurrency), key],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while _completed(port, headers) == start:  # the worker has started and finished a first job
            if worker.poll() is not None or time.monotonic() > deadline:
                raise PhaseError(f"the SDK worker did not start: {worker.stderr.read().decode()[-500:]}")  # type: ignore[union-attr]
            time.sleep(0.05)
        time.sleep(warmup)
        api, sdk = CpuSplit(service.api_pids()), CpuSplit([worker.pid], label="sdk worker")
        api.start()
        sdk.start()
        before, started = _completed(port, headers), time.monotonic()
        time.sleep(seconds)
        after, ended = _completed(port, headers), time.monotonic()
        api.stop()
        sdk.stop()
        if after - start >= rows:
            raise PhaseError(f"the queue ran dry ({rows:,} jobs): preload more (--preload)")
        rate = (after - before) / (ended - started)
        out = {
            "rate": rate,
            "concurrency": concurrency,
            "cpu_cores": {**api.split, "sdk worker": sdk.split["sdk worker"]},
            "api_us_per_job": api.us_per_job(rate),
            "sdk_worker_us_per_job": sdk.us_per_job(rate),
        }
        print(
            f"SDK drain (Python Worker, concurrency {concurrency}), {rows:,} jobs: {rate:,.0f} jobs/s; API CPU "
            f"{out['api_us_per_job'] or 0:.0f} µs/job, SDK worker {out['sdk_worker_us_per_job'] or 0:.0f} µs/job; "
            f"{api}; sdk worker {sdk.split['sdk worker']:.2f} cores",
            flush=True,
        )
        return out
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def sdk_vs_raw(
    service: Service,
    url: str,
    port: int,
    headers: dict[str, str],
    clients: int,
    concurrency: int,
    rows: int,
    seconds: float,
    warmup: float,
    rounds: int,
    measure: Callable[[int, Any, str], dict[str, Any]],
) -> dict[str, Any]:
    """The SDK drain and the raw-HTTP claim-10 drain, alternated `rounds` times; each one's best round."""
    best: dict[str, dict[str, Any]] = {}
    for _ in range(rounds):
        got = sdk_drain(service, url, port, headers, concurrency, rows, seconds, warmup)
        if "sdk" not in best or got["rate"] > best["sdk"]["rate"]:
            best["sdk"] = got
        load_analyzed(url, rows)
        raw = measure(clients, ClaimComplete(port, 10), f"raw HTTP: claim 10 + batch complete, {rows:,} jobs")
        if "raw" not in best or raw["rate"] > best["raw"]["rate"]:
            best["raw"] = raw
    ratio = best["sdk"]["rate"] / best["raw"]["rate"]
    print(f"SDK drain / raw-HTTP claim-10 drain: {ratio:.2f}", flush=True)
    return {**best, "ratio": ratio}
