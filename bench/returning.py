"""The database side of `Prefer: return=minimal` on enqueue: the insert (app/db/jobs.py) with the payload in its
RETURNING (the full answer) and without it (the minimal one), alternated on one connection, no HTTP and
no document. Each statement's wall time, median over --reps, on a fresh migrated database.

usage: python bench/returning.py [--jobs 1000] [--reps 40] [--payload-bytes 0]"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import orjson
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.db import jobs as store
from app.db.jobs import NewJob
from app.db.migrate import migrate
from bench.harness import PAYLOAD, fresh_database


async def run(url: str, n: int, reps: int, payload: str) -> dict[str, float]:
    jobs = [NewJob("returning", payload, 0, None, None, 5, None) for _ in range(n)]
    times: dict[bool, list[float]] = {True: [], False: []}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for r in range(reps):
            for full in (True, False) if r % 2 == 0 else (False, True):
                t0 = time.perf_counter()
                await store.jobs_insert(conn, jobs, full=full)
                times[full].append((time.perf_counter() - t0) * 1000)
    full_ms, minimal_ms = statistics.median(times[True]), statistics.median(times[False])
    return {"full_ms": full_ms, "minimal_ms": minimal_ms, "ratio": minimal_ms / full_ms}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--jobs", type=int, default=1000, help="jobs per statement (default 1000)")
    p.add_argument("--reps", type=int, default=40, help="statements per side (default 40)")
    p.add_argument("--payload-bytes", type=int, default=0, help="a payload this large (default: the bench's)")
    args = p.parse_args()
    url = fresh_database(args.admin_url, "jobq_bench_returning")
    migrate(url)
    body = {"blob": "x" * args.payload_bytes} if args.payload_bytes else PAYLOAD
    got = asyncio.run(run(url, args.jobs, args.reps, orjson.dumps(body).decode()))
    size = len(orjson.dumps(body))
    print(
        f"{args.jobs} jobs a statement, {size}-byte payloads, {args.reps} statements each: RETURNING the payload "
        f"{got['full_ms']:.2f} ms, without {got['minimal_ms']:.2f} ms, without / with {got['ratio']:.2f}"
    )


if __name__ == "__main__":
    main()
