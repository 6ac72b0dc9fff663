"""Operations benchmarks (issue 4): what the statistics cost on a big table, what keeping the finished-job
counters costs, and whether claim throughput holds after a million jobs have passed through.

  stats      1,000,000 finished + 100,000 pending jobs; time GET /queues/q/stats and GET /queues.
  counters   pgbench, our claim + complete statements with and without the counter CTE, alternated.
  counters-http  the same A/B through the service (the counter upsert disabled by a harness trigger).
  retention  claim + complete on a fresh table, then after 1,000,000 jobs went through the service with
             retention deleting behind them, same pending backlog, same clients.
  backlog    GET /queues/q0/stats and GET /queues at 100k, 1M and 3M pending jobs in one queue, then over 1,000
             queues, on the freshly loaded table and after VACUUM (issue 22: p50 under 10 ms, flat);
             --backlog-groups N puts every job in one of N groups (the stats' top groups).
  heap       claim 10 + batch complete on one queue of a big heap (3,000,000 pending jobs, larger than shared_buffers):
             its jobs alone in the table, then one row in ten among 999 other queues' (issue 22: within 1.5x of
             alone), then every claim on one of the 1,000 queues at random; jobs/s, PostgreSQL CPU and buffers
             touched per job.
  scale      GET /queues/{queue}/scale (issue 25) on 1,000,000 pending jobs of a queue without limits (three
             priority levels, a tenth scheduled later), and of a queue with concurrency and group limits
             (1,000 groups); the target: p50 under 10 ms.

usage: python bench/ops.py [--part stats,counters,retention,scale,backlog,heap] [--admin-url URL] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.db import claim as store_claim
from app.db import live_counts as store_live
from app.db import writes as store_writes
from app.db.migrate import migrate
from bench.harness import HOST, Service, fresh_database, preload, timed
from bench.loadgen import Connection
from bench.phases import ClaimComplete

PAYLOAD = '{"to": "user@example.com", "template": "welcome"}'


def load_big_table(url: str, finished: int, pending: int) -> None:
    """Rows as jobq would have left them, counters included, written directly for speed."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO jobq.jobs (queue_name, payload, status, attempts, claimed_at, finished_at, claim_token,
                                   locked_by, last_error)
            SELECT 'q', %s::jsonb, s, 1, f - interval '2 seconds', f, md5(i::text), 'w',
                   CASE WHEN s = 'failed' THEN 'boom' END
            FROM (SELECT i, now() - mod(i, 86400) * interval '1 second' AS f,
                         CASE WHEN mod(i, 100) = 0 THEN 'failed' WHEN mod(i, 250) = 1 THEN 'cancelled'
                              ELSE 'completed' END AS s
                  FROM generate_series(1, %s) i) x
            """,
            (PAYLOAD, finished),
        )
        conn.execute(
            """
            INSERT INTO jobq.jobs (queue_name, payload, run_at)
            SELECT 'q', %s::jsonb,
                   CASE WHEN mod(i, 10) = 0 THEN now() + interval '1 hour' ELSE now() - interval '1 minute' END
            FROM generate_series(1, %s) i
            """,
            (PAYLOAD, pending),
        )
        conn.execute(
            "INSERT INTO jobq.queue_counts (queue_name, status, shard, n)"
            " SELECT queue_name, status, 0, count(*) FROM jobq.jobs WHERE finished_at IS NOT NULL GROUP BY 1, 2"
        )
        conn.execute("VACUUM ANALYZE jobq.jobs")


async def time_get(port: int, path: str, n: int) -> dict[str, float]:
    conn = await Connection(HOST, port).open()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        status, _ = await conn.get(path)
        times.append((time.perf_counter() - t0) * 1000)
        assert status == 200, status
    await conn.close()
    times.sort()
    return {"n": n, "p50_ms": statistics.median(times), "p95_ms": times[int(n * 0.95) - 1], "max_ms": times[-1]}


def part_stats(admin_url: str, port: int, finished: int, pending: int) -> dict[str, Any]:
    url = fresh_database(admin_url, "jobq_ops")
    migrate(url)
    t0 = time.monotonic()
    load_big_table(url, finished, pending)
    print(f"loaded {finished:,} finished + {pending:,} pending jobs in {time.monotonic() - t0:.0f}s", flush=True)
    service = Service(url, 1, port, extra_env={"JOBQ_ACCESS_LOG": "false"}).start()
    try:
        asyncio.run(time_get(port, "/queues/q/stats", 5))  # warm
        out: dict[str, Any] = {
            "stats": asyncio.run(time_get(port, "/queues/q/stats", 50)),
            "queues": asyncio.run(time_get(port, "/queues", 20)),
            "sample": asyncio.run(_get_json(port, "/queues/q/stats")),
        }
    finally:
        service.stop()
    with psycopg.connect(url) as conn:
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('jobq.jobs'))").fetchone()
        out["table_size"] = size[0] if size else None
    print(f"GET /queues/q/stats: {out['stats']}\nGET /queues: {out['queues']}", flush=True)
    print(f"sample: {out['sample']}", flush=True)
    return out


async def _get_json(port: int, path: str) -> Any:
    conn = await Connection(HOST, port).open()
    try:
        _, body = await conn.get(path)
        return orjson.loads(body)
    finally:
        await conn.close()


# --- backlog: stats and GET /queues as the backlog grows (issue 22) ------------------------------------------


def load_spread(url: str, queues: int, first: int, n: int, groups: int = 0) -> None:
    """`n` more pending jobs, numbered from `first`, spread round-robin over `queues` queues q0, q1, ... (their
    rows interleaved in the heap): three priority levels, a tenth due in an hour; with `groups`, every job in one
    of that many groups of its queue, unevenly (squares modulo `groups`: some hold many times what others do)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO jobq.jobs (queue_name, payload, priority, run_at, group_key)
            SELECT 'q' || mod(i, %s), %s::jsonb, mod(i / %s, 3) * 5,
                   CASE WHEN mod(i / %s, 10) = 0 THEN now() + interval '1 hour' ELSE now() - interval '1 minute' END,
                   CASE WHEN %s > 0 THEN 'g' || mod(mod(i / %s, 7919) * mod(i / %s, 7919), %s) END
            FROM generate_series(%s::bigint, %s::bigint) i
            """,
            (queues, PAYLOAD, queues, queues, groups, queues, queues, max(groups, 1), first, first + n - 1),
        )


def time_full_count(url: str, statement: str = store_live.LIVE_COUNTS_WRITE) -> float:
    """ms of the background's count of every queue (app/db/live_counts.py LIVE_COUNTS_WRITE, or LIVE_GROUPS_WRITE),
    rolled back: what one stats call cost per queue before issue 22's bound, paid once per interval for the whole
    cluster now."""
    with psycopg.connect(url) as conn:
        conn.execute("SET enable_seqscan = off")
        t0 = time.perf_counter()
        conn.execute(statement)
        ms = (time.perf_counter() - t0) * 1000
        conn.rollback()
    return ms


def wait_for_count(url: str, queue: str, since: Any, timeout: float = 120) -> float:
    """Seconds until the service's background count (app/db/live_counts.py) has counted `queue` after `since`
    (the database's clock): every JOBQ_LIVE_COUNTS_INTERVAL_SECONDS, or ten times as long as its last count took.
    Until then a queue it has not counted is read up to the whole exact maximum: the transient after a bulk load,
    not the steady state the scaling rows measure."""
    t0 = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT counted_at > %s FROM jobq.queue_live_counts WHERE queue_name = %s", (since, queue)
            ).fetchone()
            if row and row[0]:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"the background's count did not reach {queue} within {timeout:.0f} s")
            time.sleep(0.2)


def part_backlog(
    admin_url: str, port: int, steps: list[int], layouts: list[int], n: int = 50, groups: int = 0
) -> dict[str, Any]:
    """GET /queues/q0/stats and GET /queues at each backlog of `steps`, for each number of queues in `layouts`,
    on the freshly loaded table (autovacuum off, not vacuumed since the load: index-only scans visit the heap)
    and again after VACUUM; the service as shipped (JOBQ_STATS_EXACT_MAX 10,000, a count every 10 s), each
    measured once the background's count has passed since the load (wait_for_count). With
    `groups`, every job has a group (the stats' top groups)."""
    out: dict[str, Any] = {}
    for queues in layouts:
        url = fresh_database(admin_url, "jobq_ops")
        migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE jobq.jobs SET (autovacuum_enabled = false)")
        service = Service(url, 1, port, extra_env={"JOBQ_ACCESS_LOG": "false", "JOBQ_VACUUM_INTERVAL_SECONDS": "0"})
        service.start()
        loaded = 0
        try:
            for total in steps:
                t0 = time.monotonic()
                load_spread(url, queues, loaded + 1, total - loaded, groups)
                with psycopg.connect(url, autocommit=True) as conn:
                    loaded_at = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
                loaded = total
                print(f"{queues} queue(s): {total:,} pending loaded in {time.monotonic() - t0:.0f}s", flush=True)
                for state in ("fresh", "vacuumed"):
                    with psycopg.connect(url, autocommit=True) as conn:
                        if state == "vacuumed":
                            conn.execute("VACUUM ANALYZE jobq.jobs")  # the count made after the load still holds
                            waited = 0.0
                        else:
                            waited = wait_for_count(url, "q0", loaded_at)
                    asyncio.run(time_get(port, "/queues/q0/stats", 3))  # warm
                    sample = asyncio.run(_get_json(port, "/queues/q0/stats"))
                    row = {
                        "stats": asyncio.run(time_get(port, "/queues/q0/stats", n)),
                        "queues": asyncio.run(time_get(port, "/queues", max(n // 2, 5))),
                        "full_count_ms": time_full_count(url),
                        "groups_count_ms": time_full_count(url, store_live.LIVE_GROUPS_WRITE) if groups else None,
                        "sample": sample["counts"],
                        "top_group": sample["groups"][0] if sample["groups"] else None,
                        "groups_estimated": sample.get("groups_estimated"),
                        "count_waited_s": round(waited, 1),
                    }
                    out[f"{queues}q/{total}/{state}"] = row
                    print(
                        f"  {state:8} stats p50 {row['stats']['p50_ms']:.1f} ms p95 {row['stats']['p95_ms']:.1f};"
                        f" GET /queues p50 {row['queues']['p50_ms']:.1f} ms p95 {row['queues']['p95_ms']:.1f};"
                        f" the background's full count {row['full_count_ms']:.0f} ms"
                        + (f" (its pass reached q0 {waited:.1f} s after the load)" if state == "fresh" else "")
                        + f"; q0 {row['sample']}"
                        + (
                            f"; top group {row['top_group']}, estimated {row['groups_estimated']};"
                            f" the background's count of the top groups {row['groups_count_ms']:.0f} ms"
                            if groups
                            else ""
                        ),
                        flush=True,
                    )
        finally:
            service.stop()
    return out


# --- scale: the autoscaling signal on a big backlog -------------------------------------------------------------


def load_backlog(url: str, queue: str, pending: int, groups: int) -> None:
    """`pending` jobs in `queue`: three priority levels, a tenth due in an hour, in `groups` groups (0: none)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO jobq.jobs (queue_name, payload, priority, run_at, group_key)
            SELECT %s, %s::jsonb, mod(i, 3) * 5,
                   CASE WHEN mod(i, 10) = 0 THEN now() + interval '1 hour' ELSE now() - interval '1 minute' END,
                   CASE WHEN %s > 0 THEN 'g' || mod(i, %s) END
            FROM generate_series(1, %s) i
            """,
            (queue, PAYLOAD, groups, max(groups, 1), pending),
        )


def part_scale(admin_url: str, port: int, pending: int, n: int = 200) -> dict[str, Any]:
    url = fresh_database(admin_url, "jobq_ops_scale")
    migrate(url)
    t0 = time.monotonic()
    load_backlog(url, "q", pending, 0)
    load_backlog(url, "limited", pending, 1000)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobq.queue_state (queue_name, concurrency, group_concurrency) VALUES ('limited', 50, 2)"
        )
        conn.execute("VACUUM ANALYZE jobq.jobs")
    print(f"loaded 2 x {pending:,} pending jobs in {time.monotonic() - t0:.0f}s", flush=True)
    service = Service(url, 1, port, extra_env={"JOBQ_ACCESS_LOG": "false"}).start()
    out: dict[str, Any] = {}
    try:
        # A floor on this machine at this moment: a route that reads one row by key (HTTP, auth, the pool).
        asyncio.run(time_get(port, "/queues/q/config", 10))
        out["floor"] = asyncio.run(time_get(port, "/queues/q/config", n))
        print(f"GET /queues/q/config (the floor): {out['floor']}", flush=True)
        for queue in ("q", "limited"):
            path = f"/queues/{queue}/scale"
            asyncio.run(time_get(port, path, 10))  # warm
            out[queue] = {"timing": asyncio.run(time_get(port, path, n)), "answer": asyncio.run(_get_json(port, path))}
            print(f"GET {path}: {out[queue]['timing']}\n  {out[queue]['answer']}", flush=True)
    finally:
        service.stop()
    # The statement alone, on one connection (prepared after its fifth run, as the pool's are): what the
    # database pays per call, apart from HTTP and the machine's other load on the API process.
    from app.db.scale import GROUPS, LEVELS, QUEUE_SCALE

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET enable_bitmapscan = off")
        for queue in ("q", "limited"):
            params = {"queue": queue, "cap": 1000, "levels": LEVELS, "groups": GROUPS}
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                conn.execute(QUEUE_SCALE, params).fetchall()
                times.append((time.perf_counter() - t0) * 1000)
            times.sort()
            out[queue]["statement_p50_ms"] = statistics.median(times)
            print(f"QUEUE_SCALE on {queue}: p50 {out[queue]['statement_p50_ms']:.2f} ms", flush=True)
    out["target_met"] = all(out[q]["timing"]["p50_ms"] < 10 for q in ("q", "limited"))
    print(f"p50 under 10 ms: {out['target_met']}", flush=True)
    return out


# --- counters: pgbench A/B ----------------------------------------------------------------------------------


def one_line(sql: str) -> str:
    """pgbench reads one command per line: drop the comments, then join."""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split())


def pgbench_scripts(directory: Path) -> tuple[Path, Path]:
    """Our claim and complete statements as pgbench scripts, the complete with and without counters."""
    claim = (
        store_claim.JOB_CLAIM.replace("%(queue)s", "'q'")
        .replace("%(total)s", "1")
        .replace("%(slots)s", """'[{"ord":0,"worker":"w","lease":60,"lim":1}]'""")
        .replace("%(suffix)s", "'cQ'")  # app/db/tokens.py queue_suffix("q")
    )
    claim = one_line(claim) + " \\gset\n"
    items = (
        "json_build_array(json_build_object('ord', 0, 'id', :id::bigint, 'token', :claim_token::text, 'result', NULL))"
    )
    complete = (
        store_writes.JOB_COMPLETE_MANY.replace("%(queue)s", "'q'")
        .replace("%(items)s", items)
        .replace("%(full)s", "true")
    )
    counted = re.search(r", counted AS \(.*?\n\)\n", complete, re.S)
    assert counted, "the complete statement lost its counter CTE"
    plain = complete.replace(counted.group(0), "\n")
    with_counters = directory / "with_counters.sql"
    without = directory / "without_counters.sql"
    with_counters.write_text(claim + one_line(complete) + ";\n")
    without.write_text(claim + one_line(plain) + ";\n")
    return with_counters, without


def pgbench(url: str, script: Path, seconds: int) -> float:
    out = subprocess.run(
        ["pgbench", "-n", "-M", "prepared", "-c", "8", "-j", "2", "-T", str(seconds), "-f", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"^tps = ([\d.]+)", out, re.M)
    if not match:
        raise RuntimeError(out)
    return float(match.group(1))


def part_counters(admin_url: str, rounds: int, seconds: int) -> dict[str, Any]:
    url = fresh_database(admin_url, "jobq_ops_counters")
    migrate(url)
    results: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory() as tmp:
        with_counters, without = pgbench_scripts(Path(tmp))
        for _ in range(rounds):
            for name, script in (("without", without), ("with", with_counters)):
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("TRUNCATE jobq.jobs")
                    conn.execute(
                        "INSERT INTO jobq.jobs (queue_name, payload)"
                        " SELECT 'q', %s::jsonb FROM generate_series(1, 300000)",
                        (PAYLOAD,),
                    )
                    conn.execute("VACUUM ANALYZE jobq.jobs")
                results[name].append(pgbench(url, script, seconds))
                print(f"claim + complete, {name} counters: {results[name][-1]:.0f} jobs/s", flush=True)
    a, b = statistics.median(results["without"]), statistics.median(results["with"])
    out = {"runs": results, "median_without": a, "median_with": b, "cost": 1 - b / a}
    print(f"counters cost: {out['cost']:.1%} (median {b:.0f} vs {a:.0f} jobs/s)", flush=True)
    return out


def part_counters_http(admin_url: str, port: int, rounds: int, seconds: float, clients: int) -> dict[str, Any]:
    """The same A/B through the service. B disables the counter upsert with a harness-only trigger
    (BEFORE INSERT ... RETURN NULL skips the row, so ON CONFLICT never updates): everything else is
    identical. The trigger costs a little itself, so this slightly understates the counters' cost."""
    url = fresh_database(admin_url, "jobq_ops_counters_http")
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION bench_skip() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$")
    env = {"JOBQ_ACCESS_LOG": "false"}
    service = Service(url, 2, port, extra_env=env).start()
    results: dict[str, list[float]] = {"with": [], "without": []}
    try:
        for _ in range(rounds):
            for name in ("without", "with"):
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("DROP TRIGGER IF EXISTS bench_skip ON jobq.queue_counts")
                    if name == "without":
                        conn.execute(
                            "CREATE TRIGGER bench_skip BEFORE INSERT ON jobq.queue_counts"
                            " FOR EACH ROW EXECUTE FUNCTION bench_skip()"
                        )
                preload(url, 300_000)
                results[name].append(asyncio.run(timed(clients, seconds, 2, ClaimComplete(port, 1))))
                print(f"HTTP claim + complete, {name} counters: {results[name][-1]:.0f} jobs/s", flush=True)
    finally:
        service.stop()
    a, b = statistics.median(results["without"]), statistics.median(results["with"])
    out = {"clients": clients, "runs": results, "median_without": a, "median_with": b, "cost": 1 - b / a}
    print(f"counters cost through HTTP: {out['cost']:.1%} (median {b:.0f} vs {a:.0f} jobs/s)", flush=True)
    return out


# --- retention: a million jobs through ----------------------------------------------------------------------


def table_health(url: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT pg_total_relation_size('jobq.jobs'), n_live_tup, n_dead_tup, autovacuum_count, vacuum_count"
            " FROM pg_stat_user_tables WHERE relid = 'jobq.jobs'::regclass"
        ).fetchone()
    assert row is not None
    return {"size_mib": round(row[0] / 2**20, 1), "live": row[1], "dead": row[2], "autovacuums": row[3] + row[4]}


async def push_through(port: int, total: int, clients: int) -> float:
    """Enqueue `total` jobs in batches and work them off with claim 10 + batch complete; returns seconds."""
    t0 = time.perf_counter()
    enq = await Connection(HOST, port).open()
    body = orjson.dumps({"jobs": [{"payload": {"n": 1}}] * 1000})
    conns = [await Connection(HOST, port).open() for _ in range(clients)]
    worker = ClaimComplete(port, 10)
    done = [0]

    async def work(conn: Connection) -> None:
        while done[0] < total:
            try:
                await worker(conn, done)
            except RuntimeError:  # ran dry for a moment: the producer is behind
                await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(work(c)) for c in conns]
    for _ in range(total // 1000):
        status, _ = await enq.post("/queues/bench/jobs/batch", body)
        assert status == 201
    await asyncio.gather(*tasks)
    for c in [enq, *conns]:
        await c.close()
    return time.perf_counter() - t0


def part_retention(admin_url: str, port: int, clients: int, seconds: float, through: int) -> dict[str, Any]:
    url = fresh_database(admin_url, "jobq_ops_retention")
    migrate(url)
    env = {"JOBQ_RETENTION_COMPLETED_SECONDS": "20", "JOBQ_RETENTION_INTERVAL_SECONDS": "5", "JOBQ_ACCESS_LOG": "false"}
    service = Service(url, 2, port, extra_env=env).start()
    out: dict[str, Any] = {"clients": clients, "through": through}
    try:
        preload(url, 200_000)
        out["fresh"] = asyncio.run(timed(clients, seconds, 2, ClaimComplete(port, 1)))
        out["fresh_table"] = table_health(url)
        print(f"fresh table: {out['fresh']:.0f} jobs/s {out['fresh_table']}", flush=True)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM jobq.jobs WHERE status = 'pending'")  # what is left of the backlog
        out["push_seconds"] = asyncio.run(push_through(port, through, clients))
        time.sleep(30)  # retention catches up with the last completions
        out["after_push_table"] = table_health(url)
        print(f"{through:,} jobs through in {out['push_seconds']:.0f}s; table {out['after_push_table']}", flush=True)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO jobq.jobs (queue_name, payload) SELECT 'bench', %s::jsonb FROM generate_series(1, 200000)",
                (PAYLOAD,),
            )
        out["after"] = asyncio.run(timed(clients, seconds, 2, ClaimComplete(port, 1)))
        out["after_table"] = table_health(url)
        out["ratio"] = out["after"] / out["fresh"]
        print(f"after {through:,} jobs: {out['after']:.0f} jobs/s = {out['ratio']:.2f} of fresh", flush=True)
    finally:
        service.stop()
    return out


# --- heap: one queue among many in a big heap (issue 22) -------------------------------------------------------


def load_heap(url: str, total: int, every: int, vacuum: bool = True, grouped: bool = False) -> int:
    """`total` pending jobs on a freshly vacuumed and analyzed table (`vacuum` False: analyzed only, as a bulk
    load stands until autovacuum comes): with `every` 1, all in queue `bench` (its rows side by side in the heap);
    else every `every`-th row in `bench` and the others round-robin over 999 other queues, so that `bench`'s rows
    are spread over the whole heap (`grouped`: the same jobs inserted queue by queue, each queue's rows side by side,
    as a table partitioned by queue would keep them). Returns `bench`'s jobs."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE jobq.jobs")
        conn.execute(
            """
            INSERT INTO jobq.jobs (queue_name, payload)
            SELECT CASE WHEN mod(i, %s) = 0 THEN 'bench' ELSE 'q' || mod(i, 999) END, %s::jsonb
            FROM generate_series(1, %s::int) i
            ORDER BY CASE WHEN %s THEN CASE WHEN mod(i, %s) = 0 THEN -1 ELSE mod(i, 999) END END, i
            """,
            (every, PAYLOAD, total, grouped, every),
        )
        conn.execute("VACUUM ANALYZE jobq.jobs" if vacuum else "ANALYZE jobq.jobs")
    return total // every


def _buffers(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def part_heap(admin_url: str, port: int, total: int, clients: int, seconds: int) -> dict[str, Any]:
    from bench.harness import CpuSplit

    out: dict[str, Any] = {}
    kinds = (
        ("alone", 1),
        ("among 1,000 queues", 10),
        ("all 1,000 queues at once", 10),
        ("all 1,000 queues at once, rows grouped by queue", 10),
    )
    states = ("vacuumed", "not vacuumed")
    layouts = [(f"{kind}, {state}", every, state == "vacuumed") for state in states for kind, every in kinds]
    # As loaded, but with the service's own vacuum on (JOBQ_VACUUM_INTERVAL_SECONDS as shipped): the claims are
    # measured once it has vacuumed the load, and the seconds from the service's start until then are reported.
    layouts.append((SERVICE_VACUUMED, 10, False))
    everyone = ["bench", *(f"q{i}" for i in range(999))]
    for label, every, vacuum in layouts:
        url = fresh_database(admin_url, "jobq_ops_heap")
        migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE jobq.jobs SET (autovacuum_enabled = false)")  # the state stays as loaded
        t0 = time.monotonic()
        jobs = load_heap(url, total, every, vacuum, grouped="grouped" in label)
        with psycopg.connect(url) as conn:
            size = conn.execute("SELECT pg_size_pretty(pg_relation_size('jobq.jobs'))").fetchone()
        print(f"{label}: {total:,} pending, {jobs:,} in bench, heap {size[0] if size else '?'}, loaded in "
              f"{time.monotonic() - t0:.0f}s", flush=True)  # fmt: skip
        # The other rows keep the state as loaded: the service's vacuum, which starts on inserted rows too, is off.
        env = {} if label == SERVICE_VACUUMED else {"JOBQ_VACUUM_INTERVAL_SECONDS": "0"}
        vacuums = _vacuums(url)
        started = time.monotonic()
        service = Service(url, 2, port, log=Path("/dev/null"), extra_env=env).start()
        try:
            waited = None
            if label == SERVICE_VACUUMED:
                _wait_for_vacuum(url, vacuums, timeout=300)
                waited = time.monotonic() - started
                print(f"  the service's vacuum had seen the load {waited:.1f}s after its start", flush=True)
            cpu = CpuSplit(service.api_pids())
            before = _buffers(url)
            worker = ClaimComplete(port, 10, queues=everyone if label.startswith("all") else ())
            rate = asyncio.run(timed(clients, seconds, 2, worker, cpu))
            touched = _buffers(url) - before  # warm-up included: a per-job figure, not the window's
        finally:
            service.stop()
        done = rate * seconds
        row = {
            "rate": rate,
            "pg_us_per_job": cpu.split["postgres"] / rate * 1e6,
            "api_us_per_job": cpu.split["api"] / rate * 1e6,
            "buffers_per_job": touched / (rate * (seconds + 2)),
            "cpu": cpu.split,
            "done_in_window": done,
            "seconds_until_vacuumed": waited,
        }
        out[label] = row
        print(
            f"  claim 10 + batch complete on {'every queue, at random' if label.startswith('all') else 'bench'}, "
            f"{clients} connections: {rate:,.0f} jobs/s; PostgreSQL "
            f"{row['pg_us_per_job']:.0f} µs/job, API {row['api_us_per_job']:.0f} µs/job; about "
            f"{row['buffers_per_job']:.0f} buffers touched per job; {cpu.split}",
            flush=True,
        )
    for state in ("vacuumed", "not vacuumed"):
        for other in [kind for kind, _ in kinds[1:]]:
            ratio = out[f"alone, {state}"]["rate"] / out[f"{other}, {state}"]["rate"]
            out[f"alone_vs_{other}, {state}"] = ratio
            print(f"{state}: alone / {other}: {ratio:.2f}x (target: at most 1.5x)", flush=True)
    # Alone as vacuumed: the service's vacuum starts on a load whichever queues it holds.
    ratio = out["alone, vacuumed"]["rate"] / out[SERVICE_VACUUMED]["rate"]
    out[f"alone_vs_{SERVICE_VACUUMED}"] = ratio
    print(f"alone, vacuumed / {SERVICE_VACUUMED}: {ratio:.2f}x (target: at most 1.5x)", flush=True)
    return out


SERVICE_VACUUMED = "among 1,000 queues, vacuumed by the service after the load"


def _vacuums(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT vacuum_count + autovacuum_count FROM pg_stat_user_tables WHERE relid = 'jobq.jobs'::regclass"
        ).fetchone()
    return int(row[0]) if row else 0


def _wait_for_vacuum(url: str, before: int, timeout: float) -> None:
    """Until the jobs table has been vacuumed since `before` was read (its statistics say so)."""
    deadline = time.monotonic() + timeout
    while _vacuums(url) <= before:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the service did not vacuum the loaded table within {timeout:.0f}s")
        time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--part", default="stats,counters,retention")
    p.add_argument("--port", type=int, default=8766)
    p.add_argument("--rounds", type=int, default=3, help="counters: A/B rounds")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--through", type=int, default=1_000_000)
    p.add_argument("--finished", type=int, default=1_000_000, help="stats: finished jobs in the table")
    p.add_argument("--pending", type=int, default=100_000, help="stats: pending jobs in the table")
    p.add_argument("--scale-pending", type=int, default=1_000_000, help="scale: pending jobs in each queue")
    p.add_argument("--backlog-steps", default="100000,1000000,3000000", help="backlog: pending jobs at each step")
    p.add_argument("--backlog-queues", default="1,1000", help="backlog: the queues they are spread over, per run")
    p.add_argument("--backlog-groups", type=int, default=0, help="backlog: every job in one of this many groups")
    p.add_argument("--heap-total", type=int, default=3_000_000, help="heap: pending jobs in the table")
    p.add_argument("--json")
    args = p.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    parts = args.part.split(",")
    results: dict[str, Any] = {}
    if "stats" in parts:
        results["stats"] = part_stats(args.admin_url, args.port, args.finished, args.pending)
    if "counters" in parts:
        results["counters"] = part_counters(args.admin_url, args.rounds, args.seconds)
    if "counters-http" in parts:
        results["counters_http"] = part_counters_http(
            args.admin_url, args.port, args.rounds, args.seconds, args.clients
        )
    if "scale" in parts:
        results["scale"] = part_scale(args.admin_url, args.port, args.scale_pending)
    if "backlog" in parts:
        steps = [int(x) for x in args.backlog_steps.split(",")]
        layouts = [int(x) for x in args.backlog_queues.split(",")]
        results["backlog"] = part_backlog(args.admin_url, args.port, steps, layouts, groups=args.backlog_groups)
    if "heap" in parts:
        results["heap"] = part_heap(args.admin_url, args.port, args.heap_total, 64, args.seconds)
    if "retention" in parts:
        results["retention"] = part_retention(args.admin_url, args.port, args.clients, args.seconds, args.through)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
