"""Where an API process's CPU goes on a hot path: py-spy samples one jobq API process (`jobq serve --workers 1`)
while 64 lean connections drive it, and each sample is charged to the layer of its innermost Python frame that
belongs to a known package (jobq, psycopg, pydantic, uvicorn, starlette and FastAPI, orjson, asyncio and the event
loop, logging). Samples with no Python frame of the process on the stack (waiting in epoll) are not taken (py-spy
leaves out idle ones), so the shares are of the process's busy time.

usage: .venv/bin/python bench/profile.py [--phase enqueue|batch|claim10|claim1next] [--seconds 15] [--preload 600000]
Needs py-spy (`pip install py-spy`) and root or ptrace permission. Throughput under py-spy's sampling is a little
lower than without it: read the shares, not the rate.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import CpuSplit, Service, fresh_database, preload, timed
from bench.phases import ClaimComplete, Enqueue

# The innermost frame whose file (as py-spy names it: relative to its package root, `psycopg/cursor.py`) starts with
# one of these decides the layer (first match in this order).
LAYERS: tuple[tuple[str, str], ...] = (
    ("psycopg_pool/", "psycopg (pool)"),
    ("psycopg/", "psycopg"),
    ("pydantic", "pydantic"),
    ("uvicorn/", "uvicorn (HTTP protocol)"),
    ("starlette/", "starlette / FastAPI"),
    ("fastapi/", "starlette / FastAPI"),
    ("orjson", "orjson"),
    ("logging/", "logging"),
    ("asyncio/", "asyncio / event loop"),
    ("uvloop/", "asyncio / event loop"),
    ("app/", "jobq"),
)


def _file(frame: str) -> str:
    """`function (file:line)` -> file."""
    return frame.rpartition(" (")[2].rpartition(":")[0]


def layer_of(stack: str) -> str:
    """`stack` is py-spy's raw line: frames root first, `;`-separated."""
    for frame in reversed(stack.split(";")):
        path = _file(frame)
        for prefix, layer in LAYERS:
            if path.startswith(prefix):
                return layer
    return "other (interpreter, stdlib)"


def jobq_function(stack: str) -> str | None:
    """The innermost jobq frame's function and file, for the table of jobq's own time."""
    for frame in reversed(stack.split(";")):
        path = _file(frame)
        if path.startswith("app/"):
            return f"{frame.rpartition(' (')[0]} ({path})"
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", default="claim10", choices=("enqueue", "batch", "claim10", "claim1next"))
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--preload", type=int, default=600_000)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--port", type=int, default=8791)
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = p.parse_args()

    url = fresh_database(args.admin_url, "jobq_bench_profile")
    service = Service(url, 1, args.port, log=Path("/dev/null")).start()  # the access log on, as shipped
    try:
        worker: Enqueue | ClaimComplete
        if args.phase in ("enqueue", "batch"):
            worker = Enqueue(args.port, 1 if args.phase == "enqueue" else 1000)  # batch: 1,000 jobs a request
        else:
            preload(url, args.preload)
            worker = ClaimComplete(args.port, 10 if args.phase == "claim10" else 1, handin=args.phase == "claim1next")
        pid = service.api_pids()[0]
        out = Path(tempfile.mkdtemp(prefix="jobq-profile-")) / "stacks.txt"
        spy = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--format", "raw",
             "--rate", "250", "--nonblocking", "--duration", str(int(args.seconds) + 1), "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.5)
        cpu = CpuSplit([pid])
        rate = asyncio.run(timed(args.clients, args.seconds, 0.5, worker, cpu))
        spy.wait(60)
    finally:
        service.stop()

    layers: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        layers[layer_of(stack)] += int(count)
        if (f := jobq_function(stack)) and layer_of(stack) == "jobq":
            functions[f] += int(count)
    total = sum(layers.values()) or 1
    api_us = cpu.split["api"] / rate * 1e6
    print(f"{args.phase}: {rate:,.0f} jobs/s under sampling; API CPU {api_us:.0f} µs/job; {cpu.split}")
    print(f"{total:,} busy samples of one API process; by the layer of the innermost known frame:")
    for layer, n in layers.most_common():
        print(f"  {layer:32} {100 * n / total:5.1f}%  ~{api_us * n / total:5.1f} µs/job")
    print("jobq's own time, by innermost jobq function (top 12):")
    for f, n in functions.most_common(12):
        print(f"  {100 * n / total:5.1f}%  {f}")


if __name__ == "__main__":
    main()
