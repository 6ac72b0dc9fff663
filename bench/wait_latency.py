"""How soon a request waiting for a job's result on one replica answers after a complete on another.

Two `jobq serve` processes share one database (the fallback poll set to 60 s, so only the wake-up can
answer in time). For each sample: enqueue on B and claim it there, start GET /jobs/{id}?wait_seconds=20 on
A, wait until A has announced its waiter (its presence NOTIFY, read with LISTEN), complete on B, and
measure from the moment B's complete answered (the job committed) to A's answer.

    .venv/bin/python bench/wait_latency.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

The database named in the URL is used to create (and drop) a scratch database for the run."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
from psycopg import sql

JOBQ = str(Path(sys.executable).with_name("jobq"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def with_db(url: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]


def serve(url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    env.update(JOBQ_DATABASE_URL=url, JOBQ_POLL_INTERVAL_SECONDS="60", JOBQ_ACCESS_LOG="false",
               JOBQ_SCHEDULE_INTERVAL_SECONDS="0")  # fmt: skip
    proc = subprocess.Popen([JOBQ, "serve", "--port", str(port), "--log-level", "warning"], env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("jobq serve did not start")
        time.sleep(0.1)


async def sample(a: httpx.AsyncClient, b: httpx.AsyncClient, listen: psycopg.AsyncConnection[object]) -> float:
    job = (await b.post("/queues/bench-wait/jobs", json={"payload": None})).json()
    claim = (await b.post("/queues/bench-wait/claim", json={"worker": "bench"})).json()["jobs"][0]
    answered = asyncio.get_running_loop().create_future()

    async def wait() -> None:
        r = await a.get(f"/jobs/{job['id']}", params={"wait_seconds": 20})
        answered.set_result((time.perf_counter(), r.json()["status"]))

    waiting = asyncio.create_task(wait())
    async for note in listen.notifies():  # A announces "<sender> p #<id>" once the request waits
        if f"#{job['id']}" in note.payload.split(" ")[2:]:
            break
    await asyncio.sleep(0.05)  # and B has heard it
    r = await b.post(f"/jobs/{job['id']}/complete", json={"claim_token": claim["claim_token"]})
    committed = time.perf_counter()
    assert r.status_code == 200, r.text
    at, status = await answered
    await waiting
    assert status == "completed", status
    return (at - committed) * 1000


async def measure(a_url: str, b_url: str, listen_url: str, n: int) -> list[float]:
    listen = await psycopg.AsyncConnection.connect(listen_url, autocommit=True)
    await listen.execute("LISTEN jobq_wakeup")
    async with httpx.AsyncClient(base_url=a_url, timeout=30) as a, httpx.AsyncClient(base_url=b_url, timeout=30) as b:
        await sample(a, b, listen)  # warm up connections and plans
        out = [await sample(a, b, listen) for _ in range(n)]
    await listen.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    name = f"jobq_wait_latency_{os.getpid()}"
    with psycopg.connect(args.database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_db(args.database_url, name)
    procs = []
    try:
        subprocess.run([JOBQ, "migrate", "--database-url", url], check=True, capture_output=True)
        (pa, a_url), (pb, b_url) = serve(url), serve(url)
        procs = [pa, pb]
        ms = asyncio.run(measure(a_url, b_url, url, args.samples))
        ms.sort()
        p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
        print(f"complete on replica B -> waiting GET answered on replica A, {len(ms)} samples: "
              f"p50 {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms, max {ms[-1]:.1f} ms")  # fmt: skip
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        with psycopg.connect(args.database_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


if __name__ == "__main__":
    main()
