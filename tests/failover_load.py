"""Producers and an SDK worker against a jobq, every HTTP request they make written down, for the failover
tests (tests/test_patroni.py): run as a process of its own, so that its timings are not the test's.

Producers enqueue with idempotency keys through the Python SDK's Client (retrying as it does); the worker is
the SDK's Worker. Each line of HISTORY is a JSON object:
  {"kind": "http", "who": "producer"|"worker", "method", "path", "t0", "t1", "status" | "error",
   "completed": [[job id, claim token], ...]}       every attempt, retries included; `completed`: the
                                                      completes this answer confirmed
  {"kind": "enqueue", "key", "id" | "error", "t0", "t1"}   each enqueue call's final outcome
  {"kind": "run", "id", "key", "t0", "t1"}                 each handler run
  {"kind": "log", "level", "message", "t"}                 the SDK's warnings and errors
Times are time.time(). While the file PRODUCING_FLAG exists, producers produce; SIGTERM stops the worker.

usage: python tests/failover_load.py URL HISTORY PRODUCING_FLAG [--producers N] [--concurrency N]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from jobq_client import AsyncClient, Client, JobContext, RetryPolicy, Worker

QUEUE = "ha"
# Producers keep trying through a failover: an enqueue that gives up is not acknowledged, and proves nothing.
PATIENT = RetryPolicy(attempts=1000, backoff_base=0.1, backoff_max=1.0)


class History:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, **entry: Any) -> None:
        line = (json.dumps(entry) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)


def _completed(request: httpx.Request, response: httpx.Response) -> list[list[Any]]:
    """The (job id, claim token) pairs this answer confirms completed."""
    if response.status_code != 200 or request.method != "POST":
        return []
    path = request.url.path
    body = json.loads(request.content or b"{}")
    if path.startswith("/jobs/") and path.endswith("/complete") and path != "/jobs/complete":
        return [[int(path.split("/")[2]), body["claim_token"]]]
    items = body.get("jobs") if path == "/jobs/complete" else body.get("complete")
    if not items:
        return []
    answer = response.json()
    outcomes = answer.get("results") if path == "/jobs/complete" else answer.get("completed")
    return [
        [item["id"], item["claim_token"]]
        for item, outcome in zip(items, outcomes or [], strict=False)
        if outcome.get("outcome") == "completed"
    ]


class Recording(httpx.BaseTransport):
    def __init__(self, history: History, who: str) -> None:
        self.inner = httpx.HTTPTransport()
        self.history, self.who = history, who

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        t0 = time.time()
        entry: dict[str, Any] = {"kind": "http", "who": self.who, "method": request.method, "path": request.url.path}
        try:
            response = self.inner.handle_request(request)
            response.read()
        except Exception as exc:
            self.history.write(**entry, t0=t0, t1=time.time(), error=type(exc).__name__)
            raise
        self.history.write(**entry, t0=t0, t1=time.time(), status=response.status_code)
        return response


class AsyncRecording(httpx.AsyncBaseTransport):
    def __init__(self, history: History, who: str) -> None:
        self.inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=100))
        self.history, self.who = history, who

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        t0 = time.time()
        entry: dict[str, Any] = {"kind": "http", "who": self.who, "method": request.method, "path": request.url.path}
        try:
            response = await self.inner.handle_async_request(request)
            await response.aread()
        except Exception as exc:
            self.history.write(**entry, t0=t0, t1=time.time(), error=type(exc).__name__)
            raise
        done = _completed(request, response)
        self.history.write(**entry, t0=t0, t1=time.time(), status=response.status_code, completed=done)
        return response


class SdkWarnings(logging.Handler):
    def __init__(self, history: History) -> None:
        super().__init__(logging.WARNING)
        self.history = history

    def emit(self, record: logging.LogRecord) -> None:
        self.history.write(kind="log", level=record.levelname, message=record.getMessage(), t=record.created)


def produce(url: str, history: History, producing: Path, n: int) -> None:
    http = httpx.Client(transport=Recording(history, "producer"), timeout=30)
    with Client(url, retry=PATIENT, http_client=http) as jobq:
        count = 0
        while producing.exists():
            key = f"p{n}-{count}"
            t0 = time.time()
            try:
                job = jobq.enqueue(QUEUE, {"key": key}, idempotency_key=key, max_attempts=25)
                history.write(kind="enqueue", key=key, id=job.id, t0=t0, t1=time.time())
            except Exception as exc:
                history.write(kind="enqueue", key=key, error=f"{type(exc).__name__}: {exc}", t0=t0, t1=time.time())
            count += 1
            time.sleep(0.02)
    http.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("history")
    parser.add_argument("producing", type=Path)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    history = History(args.history)
    logging.getLogger("jobq_client").addHandler(SdkWarnings(history))

    producers = [
        threading.Thread(target=produce, args=(args.url, history, args.producing, n), daemon=True)
        for n in range(args.producers)
    ]
    for p in producers:
        p.start()

    client = AsyncClient(
        args.url, http_client=httpx.AsyncClient(transport=AsyncRecording(history, "worker"), timeout=60)
    )
    # The SDK's default retries: a worker rides through a switchover without a failed request.
    worker = Worker(client, concurrency=args.concurrency, lease_seconds=10, wait_seconds=5, shutdown_grace=30)

    @worker.handler(QUEUE)
    def work(job: JobContext) -> dict[str, Any]:
        t0 = time.time()
        time.sleep(0.01)
        history.write(kind="run", id=job.id, key=job.payload["key"], t0=t0, t1=time.time())
        return {"key": job.payload["key"]}

    worker.run()  # in the main thread: SIGTERM stops it, letting the jobs in flight finish
    for p in producers:
        p.join(60)


if __name__ == "__main__":
    main()
