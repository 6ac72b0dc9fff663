"""jobq on a Citus cluster beside jobq on plain PostgreSQL (docs/scale-out.md, "Figures"): single-job enqueue
and claim 10 + batch complete, with the cluster's coordinator and 1 worker node, then 2, and the plain
server, in one run, on the same machine.

    python bench/citus.py --coordinator postgresql://postgres@127.0.0.1:9700/postgres \
        [--plain postgresql://postgres@127.0.0.1:5432/postgres] [--nodes 1,2] [--queues 8] [--seconds 8]

The load spreads over --queues queues (a queue lives on one shard, so one node; several queues spread over
the nodes), each client on one queue. `jobq serve --workers 2` and the lean load generator of bench/run.py.
--spread N sets each queue's `spread` (app/db/spread.py): its jobs under N distribution keys, so that one hot
queue (--queues 1) uses every node; the run then says how the jobs it drained were shared between the nodes.
On a machine whose every node shares the same cores, a second worker node cannot add throughput: what this
shows is the cost of the distributed path against plain PostgreSQL, and that it holds with more nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.db.migrate import migrate
from app.db.spread import key_names
from bench.harness import PAYLOAD, CpuSplit, PhaseError, Service, expect, fresh_database, timed, with_db
from bench.loadgen import Connection
from tests.citus import Cluster

DB = "jobq_bench_citus"


class Enqueue:
    """Single-job enqueue, client k on queue k mod `queues`."""

    def __init__(self, port: int, queues: int) -> None:
        self.port = port
        self.queues = queues
        self.body = orjson.dumps({"payload": PAYLOAD})
        self.next: dict[Connection, str] = {}

    async def __call__(self, conn: Connection, counter: list[int]) -> None:
        queue = self.next.setdefault(conn, f"bench{len(self.next) % self.queues}")
        status, body = await conn.post(f"/queues/{queue}/jobs", self.body)
        expect(status, body, 201)
        counter[0] += 1


class Drain:
    """Claim 10 + batch complete, client k on queue k mod `queues`."""

    def __init__(self, port: int, queues: int) -> None:
        self.port = port
        self.queues = queues
        self.claim = orjson.dumps({"worker": "bench", "limit": 10, "lease_seconds": 60})
        self.next: dict[Connection, str] = {}

    async def __call__(self, conn: Connection, counter: list[int]) -> None:
        queue = self.next.setdefault(conn, f"bench{len(self.next) % self.queues}")
        status, raw = await conn.post(f"/queues/{queue}/claim", self.claim)
        expect(status, raw, 200)
        jobs = orjson.loads(raw)["jobs"]
        if not jobs:
            raise PhaseError(f"queue {queue} ran dry: preload more (--preload)")
        items = [{"id": j["id"], "claim_token": j["claim_token"]} for j in jobs]
        status, raw = await conn.post("/jobs/complete", orjson.dumps({"jobs": items}))
        expect(status, raw, 200)
        if any(r.get("outcome") != "completed" for r in orjson.loads(raw)["results"]):
            raise PhaseError(f"a complete was refused: {raw[:300]!r}")
        counter[0] += len(jobs)


def preload(url: str, queues: int, per_queue: int, spread: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE jobq.jobs")
        for q in range(queues):
            for name in key_names(f"bench{q}", spread):
                conn.execute(
                    "INSERT INTO jobq.jobs (queue_name, payload) SELECT %s, %s::jsonb FROM generate_series(1, %s)",
                    (name, orjson.dumps(PAYLOAD).decode(), per_queue // spread),
                )
        conn.execute("VACUUM ANALYZE jobq.jobs")


def configure(port: int, queues: int, spread: int) -> None:
    for q in range(queues):
        r = httpx.patch(f"http://127.0.0.1:{port}/queues/bench{q}/config", json={"spread": spread}, timeout=30)
        r.raise_for_status()


def node_shares(url: str) -> str:
    """Jobs completed by the drain, per node holding them ("-": not a Citus database)."""
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('pg_dist_shard_placement') IS NULL").fetchone() == (True,):
            return "-"
        rows = conn.execute(
            """SELECT p.nodeport, count(*) FROM jobq.jobs j JOIN pg_dist_shard_placement p
                 ON p.shardid = get_shard_id_for_distribution_column('jobq.jobs', j.queue_name)
               WHERE j.status = 'completed' GROUP BY 1 ORDER BY 1"""
        ).fetchall()
    total = sum(n for _, n in rows) or 1
    return ", ".join(f"node :{port} {n / total:.0%}" for port, n in rows)


def measure(label: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    service = Service(url, 2, args.port).start()
    try:
        configure(args.port, args.queues, args.spread)
        cpu = CpuSplit(service.api_pids())
        enqueue = asyncio.run(timed(args.clients, args.seconds, args.warmup, Enqueue(args.port, args.queues), cpu))
        enqueue_cpu = f"{cpu}; API {cpu.us_per_job(enqueue):.0f} us/job"
        preload(url, args.queues, args.preload // args.queues, args.spread)
        cpu = CpuSplit(service.api_pids())
        drain = asyncio.run(timed(args.clients, args.seconds, args.warmup, Drain(args.port, args.queues), cpu))
        drain_cpu = f"{cpu}; API {cpu.us_per_job(drain):.0f} us/job"
        shares = node_shares(url)
    finally:
        service.stop()
    row = {"setup": label, "enqueue_per_s": round(enqueue), "drain_per_s": round(drain), "drained_on": shares}
    row["enqueue_cpu"], row["drain_cpu"] = enqueue_cpu, drain_cpu
    print(orjson.dumps(row).decode(), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coordinator", default=os.environ.get("JOBQ_TEST_CITUS_URL"), required=False)
    ap.add_argument("--plain", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--nodes", default="1,2", help="worker node counts to measure (the first N registered)")
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--spread", type=int, default=1, help="each queue's spread: distribution keys (1-64)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--preload", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=1, help="alternate the setups this many times")
    ap.add_argument("--port", type=int, default=8321)
    args = ap.parse_args()
    if not args.coordinator:
        ap.error("--coordinator (or JOBQ_TEST_CITUS_URL): a database on a Citus coordinator")
    cluster = Cluster(args.coordinator)
    rows = []
    for _ in range(args.rounds):
        if args.plain:
            url = fresh_database(args.plain, DB)
            migrate(url)
            rows.append(measure("plain PostgreSQL", url, args))
        for n in [int(x) for x in args.nodes.split(",") if x]:
            cluster.create(DB, workers=n)
            url = with_db(args.coordinator, DB)
            migrate(url)
            rows.append(measure(f"Citus, coordinator + {n} worker node{'s' if n > 1 else ''}", url, args))
    cluster.drop(DB)
    print(f"\n{args.queues} queue(s), spread {args.spread}")
    print("setup | single enqueue jobs/s | claim 10 + batch complete jobs/s | drained jobs by node")
    for r in rows:
        print(f"{r['setup']} | {r['enqueue_per_s']:,} | {r['drain_per_s']:,} | {r['drained_on']}")


if __name__ == "__main__":
    main()
