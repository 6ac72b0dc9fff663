"""The stats' top groups statement (app/db/operations.py QUEUE_GROUPS) against an earlier revision's, alternated on
one database: wall time through psycopg (10 calls a round per side) and one EXPLAIN (ANALYZE, BUFFERS) each. The
earlier statement is read from that revision's sql/operations.sql (`make sql`'s rendering), so any revision since
the rendering began can stand on the left. The background's count is refreshed first (app/db/live_counts.py).

usage: python bench/groups_ab.py URL [--before 8bd2a56] [--queue q0] [--rounds 5]
  URL: a database holding a backlog, e.g. the one `bench/ops.py --part backlog --backlog-groups 1000` leaves
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg

from app.db import live_counts as store_live
from app.db import operations as store_ops
from app.db.pool import SESSION_SETTINGS

ROOT = Path(__file__).resolve().parent.parent


def statement_at(revision: str) -> str:
    rendered = subprocess.run(
        ["git", "show", f"{revision}:sql/operations.sql"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    return rendered.split("-- name: QUEUE_GROUPS --\n")[1].split("\n-- name:")[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("--before", default="8bd2a56", help="the revision whose statement is measured first")
    p.add_argument("--queue", default="q0")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    sides: dict[str, tuple[str, dict[str, Any]]] = {
        "before": (statement_at(args.before), {"queue": args.queue, "top": 20}),
        "after": (store_ops.QUEUE_GROUPS, {"queue": args.queue, "top": 20, "over": 10_001}),
    }
    with psycopg.connect(args.url, autocommit=True) as conn:
        conn.execute(SESSION_SETTINGS, ("60000",))
        conn.execute(store_ops.NO_SEQSCAN.replace(" LOCAL", ""))
        with conn.transaction():
            for statement in (store_live.LIVE_COUNTS_WRITE, store_live.LIVE_COUNTS_PRUNE):
                conn.execute(statement)
            for statement in (store_live.LIVE_GROUPS_WRITE, store_live.LIVE_GROUPS_PRUNE):
                conn.execute(statement)
        ms: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, (query, params) in sides.items():
                for _ in range(10):
                    t0 = time.perf_counter()
                    conn.execute(query, params).fetchall()
                    ms[side].append((time.perf_counter() - t0) * 1000)
        for side, (query, params) in sides.items():
            row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()
            assert row is not None
            plan = row[0][0]
            buffers = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
            print(
                f"{side}: p50 {statistics.median(ms[side]):.1f} ms, min {min(ms[side]):.1f} ms ({len(ms[side])} calls);"
                f" EXPLAIN ANALYZE {plan['Execution Time']:.1f} ms, {buffers} buffers",
                flush=True,
            )


if __name__ == "__main__":
    main()
