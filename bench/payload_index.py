"""What an index on job payloads costs the hot path, in WAL bytes per job: a figure that, unlike a rate on a
shared 2-core machine, does not move from run to run. Enqueue (jobq's insert statement) and claim +
complete (one row version each) of N jobs, on a fresh database per variant: no payload index, the GIN
index (jsonb_path_ops) on every job, and the one jobq has, on failed and cancelled jobs only
(migrations/0012_history_and_search.sql).

usage: python bench/payload_index.py [--jobs 5000] [--admin-url URL]   (creates and drops jobq_bench_gin)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.db.jobs import JOB_INSERT_BATCH
from app.db.migrate import migrate
from bench.harness import PAYLOAD, fresh_database

RICH = {
    "to": "user@example.com", "template": "welcome", "customer_id": 123456, "locale": "en-GB", "tags": ["new", "vip"],
    "order": {"id": "ord_81723", "total": 99.5, "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]},
}  # fmt: skip
INDEX = "CREATE INDEX jobs_payload_idx ON jobq.jobs USING gin (payload jsonb_path_ops)"
VARIANTS = {  # each applied after dropping the migration's own index
    "no payload index": None,
    "GIN on every job": INDEX,
    "GIN on failed and cancelled (jobq)": INDEX + " WHERE status IN ('failed', 'cancelled')",
}
CLAIM = """
UPDATE jobq.jobs SET status = 'running', attempts = attempts + 1, claimed_at = now(), lease_seconds = 30,
       lease_expires_at = now() + interval '30 seconds', claim_token = 't'
WHERE id = (SELECT id FROM jobq.jobs WHERE queue_name = 'bench' AND status = 'pending'
            ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id
"""
COMPLETE = "UPDATE jobq.jobs SET status = 'completed', finished_at = now(), lease_expires_at = NULL WHERE id = %s"


def wal(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").fetchone()
    assert row is not None
    return int(row[0])


def measure(admin_url: str, index: str | None, payload: object, jobs: int) -> tuple[float, float, int]:
    url = fresh_database(admin_url, "jobq_bench_gin")
    migrate(url)
    body = orjson.dumps([{"ord": 0, "queue_name": "bench", "payload": payload, "priority": 0, "run_at": None,
                          "delay": None, "max_attempts": 5, "idempotency_key": None}]).decode()  # fmt: skip
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP INDEX jobq.jobs_payload_idx")
        if index:
            conn.execute(index)
        conn.execute("SET synchronous_commit = off")  # WAL volume is the same; the run is shorter
        start = wal(conn)
        for _ in range(jobs):
            conn.execute(JOB_INSERT_BATCH["full"], {"batch": body}, prepare=True).fetchall()
        enqueue = (wal(conn) - start) / jobs
        start = wal(conn)
        for _ in range(jobs):
            claimed = conn.execute(CLAIM, prepare=True).fetchone()
            conn.execute(COMPLETE, claimed, prepare=True)
        drain = (wal(conn) - start) / jobs
        row = conn.execute("SELECT coalesce(pg_relation_size(to_regclass('jobq.jobs_payload_idx')), 0)").fetchone()
    return enqueue, drain, int(row[0]) if row else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = p.parse_args()
    print("| payload | index | WAL per enqueue | WAL per claim + complete | index size per job |")
    print("|---|---|---:|---:|---:|")
    for name, payload in (("2 keys (the benchmark's)", PAYLOAD), ("10 keys, nested", RICH)):
        for variant, index in VARIANTS.items():
            enqueue, drain, size = measure(args.admin_url, index, payload, args.jobs)
            print(f"| {name} | {variant} | {enqueue:,.0f} B | {drain:,.0f} B | {size / args.jobs:,.0f} B |", flush=True)
    with psycopg.connect(args.admin_url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS jobq_bench_gin WITH (FORCE)")


if __name__ == "__main__":
    main()
