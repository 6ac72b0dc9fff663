"""CPU instructions per request of the API process, counted by callgrind: a figure that does not move with
whatever else the shared machine is doing, for comparing changes to the request path (A/B on one
machine), beside the same count for a trivial ASGI app under the same uvicorn (the floor any request
pays before jobq's code runs). User-space instructions only: the kernel's share (socket writes) is not in
it, and instructions are not time; use bench/run.py for throughput.

usage: python bench/instructions.py [--requests 800] [--phases enqueue,drain] [--admin-url URL]
Needs valgrind (Debian's package). Each phase starts `jobq serve --workers 1` under callgrind on a fresh
database (jobq_instructions), warms it up, then counts a fixed number of requests from 16 connections:
  enqueue   single-job enqueues;
  drain     claims at limit 1, each handing in the previous job's result (one request per job).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import fresh_database
from bench.loadgen import Connection

PORT = 8796
CONNECTIONS = 16
BODY = orjson.dumps({"payload": {"to": "user@example.com", "template": "welcome"}})

TRIVIAL_APP = """
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 201,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"8")]})
    await send({"type": "http.response.body", "body": b'{"id":1}'})
"""


def callgrind(command: list[str], out: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *command],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def ready(path: str) -> None:
    for _ in range(1200):
        try:
            conn = await Connection("127.0.0.1", PORT).open()
            status, _ = await conn.get(path)
            await conn.close()
            if status < 500:
                return
        except OSError:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError("the server under callgrind did not answer")


async def load(phase: str, requests: int) -> None:
    conns = [await Connection("127.0.0.1", PORT).open() for _ in range(CONNECTIONS)]

    async def worker(conn: Connection) -> None:
        done = None
        for _ in range(requests // CONNECTIONS):
            if phase == "drain":
                body: dict[str, object] = {"worker": "w", "limit": 1, "lease_seconds": 60}
                if done:
                    body["complete"] = [done]
                status, answer = await conn.post("/queues/bench/claim", orjson.dumps(body))
                if status != 200:
                    raise RuntimeError(f"claim answered {status}: {answer[:200]!r}")
                doc = orjson.loads(answer)
                if not doc["jobs"]:
                    raise RuntimeError("the queue ran dry")
                if done and doc["completed"][0]["outcome"] != "completed":
                    raise RuntimeError(f"a handed-in result was refused: {doc['completed']}")
                done = {"id": doc["jobs"][0]["id"], "claim_token": doc["jobs"][0]["claim_token"]}
            else:
                status, answer = await conn.post("/queues/bench/jobs" if phase != "trivial" else "/", BODY)
                if status != 201:
                    raise RuntimeError(f"enqueue answered {status}: {answer[:200]!r}")

    await asyncio.gather(*(worker(c) for c in conns))
    for c in conns:
        await c.close()


async def preload(jobs: int) -> None:
    conn = await Connection("127.0.0.1", PORT).open()
    for _ in range(jobs // 1000 + 1):
        status, _ = await conn.post("/queues/bench/jobs/batch", orjson.dumps({"jobs": [{"payload": {"n": 1}}] * 1000}))
        if status != 201:
            raise RuntimeError(f"preload answered {status}")
    await conn.close()


def measure(phase: str, requests: int, admin_url: str) -> float:
    work = tempfile.mkdtemp(prefix="jobq-callgrind-")
    out = os.path.join(work, "callgrind.%p")
    env = {**os.environ}
    if phase == "trivial":
        Path(work, "trivial_app.py").write_text(TRIVIAL_APP)
        command = [sys.executable, "-m", "uvicorn", "--app-dir", work, "trivial_app:app", "--port", str(PORT),
                   "--log-level", "warning", "--no-access-log", "--no-server-header", "--http", "httptools",
                   "--loop", "uvloop"]  # fmt: skip
        probe = "/"
    else:
        env["JOBQ_DATABASE_URL"] = fresh_database(admin_url, "jobq_instructions")
        command = [sys.executable, str(Path(sys.executable).parent / "jobq"), "serve", "--port", str(PORT),
                   "--workers", "1", "--log-level", "warning"]  # fmt: skip
        probe = "/readyz"
    proc = callgrind(command, out, env)
    try:
        asyncio.run(ready(probe))
        if phase == "drain":
            asyncio.run(preload(requests + 2 * CONNECTIONS * 10))
        asyncio.run(load(phase, CONNECTIONS * 10))  # warm-up, not counted
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        asyncio.run(load(phase, requests))
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
    total = 0
    for path in glob.glob(os.path.join(work, "callgrind.*")):
        for line in Path(path).read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
    shutil.rmtree(work, ignore_errors=True)
    if not total:
        raise RuntimeError("callgrind counted nothing")
    return total / (requests // CONNECTIONS * CONNECTIONS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=800)
    p.add_argument("--phases", default="enqueue,drain")
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("bench/instructions.py needs valgrind (apt-get install valgrind)")
    floor = measure("trivial", args.requests, args.admin_url)
    print(f"trivial ASGI app under the same uvicorn: {floor:,.0f} instructions per request", flush=True)
    for phase in args.phases.split(","):
        n = measure(phase, args.requests, args.admin_url)
        print(f"{phase}: {n:,.0f} instructions per request ({n / floor:.2f}x the trivial app)", flush=True)


if __name__ == "__main__":
    main()
