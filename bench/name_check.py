"""What the queue-name CHECK costs on the hot statements (migrations/0049_queue_name_check.sql): jobq's own insert,
claim and batch complete (app/db), run on one connection with no HTTP, alternated between the regex CHECK of
0001 (`queue_name ~ '^[A-Za-z0-9_.:-]{1,128}$'`) and 0049's (`length` 1-128 and no character outside the class),
swapped in place between rounds on one migrated database. Per queue name: a 1,000-job insert, then claims of 10
and a batch complete of the 10 until the jobs are done. Each statement's wall time, median over the rounds; the
session does not wait for its commits' flush (synchronous_commit off: the flush is the same on both sides).

usage: python bench/name_check.py [--rounds 6] [--jobs 1000] [--queue bench --queue emails-high.priority:eu]"""

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
from app.db.claim import ClaimSlot, jobs_claim
from app.db.jobs import NewJob
from app.db.migrate import migrate
from app.db.writes import Completion, jobs_complete
from bench.harness import PAYLOAD, fresh_database

CHECKS = {
    "regex": "queue_name ~ '^[A-Za-z0-9_.:-]{1,128}$'",
    "0049": "length(queue_name) BETWEEN 1 AND 128 AND queue_name !~ '[^A-Za-z0-9_.:-]'",
}


async def use(conn: psycopg.AsyncConnection, check: str) -> None:
    for table in ("jobs", "queue_state"):
        await conn.execute(f"ALTER TABLE jobq.{table} DROP CONSTRAINT {table}_queue_name_check")
        await conn.execute(
            f"ALTER TABLE jobq.{table} ADD CONSTRAINT {table}_queue_name_check CHECK ({check}) NOT VALID"
        )


async def round_(conn: psycopg.AsyncConnection, queue: str, n: int, times: dict[str, list[float]]) -> None:
    jobs = [NewJob(queue, orjson.dumps(PAYLOAD).decode(), 0, None, None, 5, None) for _ in range(n)]
    t0 = time.perf_counter()
    await store.jobs_insert(conn, jobs, full=False)
    times["insert"].append((time.perf_counter() - t0) * 1000)
    while True:
        t0 = time.perf_counter()
        got = await jobs_claim(conn, queue, [ClaimSlot("bench", 60, 10)])
        t1 = time.perf_counter()
        rows = got.rows[0]
        if not rows:
            break
        await jobs_complete(conn, [Completion(r.id, r.claim_token, None) for r in rows], full=False)
        t2 = time.perf_counter()
        times["claim"].append((t1 - t0) * 1000)
        times["complete"].append((t2 - t1) * 1000)
    await conn.execute("DELETE FROM jobq.jobs WHERE queue_name = %s", (queue,))


async def run(url: str, queues: list[str], rounds: int, n: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        # Each statement commits on its own; without waiting for the flush, which costs the same on both sides
        # and would hide a difference of tens of microseconds in its noise (jobq ships with it on).
        await conn.execute("SET synchronous_commit = off")
        for queue in queues:
            times: dict[str, dict[str, list[float]]] = {c: {"insert": [], "claim": [], "complete": []} for c in CHECKS}
            for r in range(rounds):
                for check in CHECKS if r % 2 == 0 else reversed(CHECKS):
                    await use(conn, CHECKS[check])
                    await conn.execute("VACUUM ANALYZE jobq.jobs")
                    await round_(conn, queue, n, times[check])
            print(f"queue {queue!r} ({len(queue)} characters), median ms per statement over {rounds} rounds:")
            for what in ("insert", "claim", "complete"):
                a, b = (statistics.median(times[c][what]) for c in CHECKS)
                label = f"{what} ({n:,} jobs)" if what == "insert" else f"{what} (10 jobs)"
                print(f"  {label:22} regex {a:7.3f}   0049 {b:7.3f}   0049 / regex {b / a:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--rounds", type=int, default=6, help="rounds per CHECK, alternated (default 6)")
    p.add_argument("--jobs", type=int, default=1000, help="jobs inserted per round (default 1000)")
    p.add_argument("--queue", action="append", help="queue names (default: bench, emails-high.priority:eu)")
    args = p.parse_args()
    url = fresh_database(args.admin_url, "jobq_bench_name_check")
    migrate(url)
    asyncio.run(run(url, args.queue or ["bench", "emails-high.priority:eu"], args.rounds, args.jobs))


if __name__ == "__main__":
    main()
