"""Citus: jobq's tables spread over the nodes of a Citus cluster (docs/scale-out.md).

On a database where the `citus` extension is installed, `jobq migrate` ends by distributing what is not yet
distributed; on plain PostgreSQL it does nothing here. The tables a queue owns are distributed by queue name
and co-located with `jobs`, so that every statement about one queue, whatever tables it joins, runs on the
one node holding that queue's shard (a single-shard router query). The small tables every queue reads
(keys, schedules, dependencies between jobs of any two queues, the sampling clock, SQS message attributes)
become reference tables: a copy on every node, joinable from any shard.

Citus requires every primary key and unique index of a distributed table to contain its distribution column.
Only two of jobq's do not, and both change here, on Citus only (plain PostgreSQL keeps its indexes; the
statements are the same on both): the primary key `(id)` of jobs becomes `(queue_name, id)`, and the
schedule tick index `(schedule, scheduled_for)` gains `queue_name` in front (a schedule's tick inserts with
`ON CONFLICT DO NOTHING`, which honours either). A job's id stays unique across the cluster: ids come from
the one identity sequence of `jobs`, which Citus hands out per node in disjoint ranges (Citus's rule for
bigint identity columns of distributed tables), and every insert names none.

Distributing a table moves its rows onto the worker nodes while writes to it wait: on an existing
installation with a big backlog, do it in a maintenance window, or distribute while the tables are small
(docs/scale-out.md). Every step is idempotent: a run that stopped half-way is finished by the next."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql

log = logging.getLogger("jobq.distribute")

# Distributed by queue name, co-located with jobs (the first is the colocation anchor).
BY_QUEUE = (
    "jobs",
    "queue_state",
    "queue_counts",
    "queue_stats",
    "queue_stats_hourly",
    "queue_claims",
    "dependency_releases",
    "sqs_queues",
    "sqs_dedup",
    "workers",
    "worker_minutes",
    "queue_live_counts",
    "queue_live_groups",
)

# A copy on every node.
REFERENCE = ("api_keys", "schedules", "job_dependencies", "stats_samples", "sqs_messages", "live_counts_clock")

# jobq_migrations stays a local table on the coordinator: only `jobq migrate` reads it.

HAS_CITUS = "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')"

DISTRIBUTED = """
SELECT c.relname FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
WHERE c.relnamespace = to_regnamespace(%s)
"""

PRIMARY_KEY_COLUMNS = """
SELECT array_agg(a.attname::text ORDER BY k.n)
FROM pg_constraint c
CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
WHERE c.conrelid = to_regclass(%s) AND c.contype = 'p'
"""


def has_citus(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(HAS_CITUS).fetchone()
    return bool(row and row[0])


def distribute(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """Distribute jobq's tables in `schema` on a Citus coordinator; returns the tables distributed by this call.
    A no-op without the citus extension. `conn` is in autocommit mode."""
    if not has_citus(conn):
        return []
    done = {row[0] for row in conn.execute(DISTRIBUTED, (schema,))}
    todo_by_queue = [t for t in BY_QUEUE if t not in done]
    todo_reference = [t for t in REFERENCE if t not in done]
    if not todo_by_queue and not todo_reference:
        return []

    def name(table: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))

    made: list[str] = []
    with conn.transaction():
        if "jobs" in todo_by_queue:
            jobs = name("jobs")
            key = conn.execute(PRIMARY_KEY_COLUMNS, (f"{schema}.jobs",)).fetchone()
            if key is None or key[0] != ["queue_name", "id"]:
                conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS jobs_pkey").format(jobs))
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD CONSTRAINT jobs_pkey PRIMARY KEY (queue_name, id)").format(jobs)
                )
            conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(name("jobs_schedule_tick_idx")))
            conn.execute(
                sql.SQL(
                    "CREATE UNIQUE INDEX IF NOT EXISTS jobs_schedule_tick_idx ON {} (queue_name, schedule, "
                    "scheduled_for) WHERE schedule IS NOT NULL"
                ).format(jobs)
            )
        for table in todo_by_queue:
            colocate = "none" if table == "jobs" else f"{schema}.jobs"
            conn.execute(
                "SELECT create_distributed_table(%s, 'queue_name', colocate_with => %s)",
                (f"{schema}.{table}", colocate),
            )
            made.append(table)
        for table in todo_reference:
            conn.execute("SELECT create_reference_table(%s)", (f"{schema}.{table}",))
            made.append(table)
    log.info("distributed on Citus: %s", ", ".join(made))
    return made
