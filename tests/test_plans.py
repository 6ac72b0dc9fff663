"""Plans that cannot fall off a cliff: every statement on a hot path reaches `jobs` by its primary key or by
the partial index it was written for, whatever the statistics say.

Slow (about 10 s): it builds 300,000-row tables whose statistics are stale in the ways seen in the field
(autovacuum off, no ANALYZE after the load):
  * the column statistics were taken while the table held 100 pending jobs, so the planner believes
    nothing else exists (no running job, one queue) and a partial index over running jobs looks empty;
  * on one table a VACUUM after the load updated the table's size but not the indexes' statistics; on
    the other nothing did, and the planner reads the sizes off the files.
Then 5,000 jobs are running. Each statement is planned with its real parameters, both as a custom plan
(EXPLAIN ANALYZE, in a transaction rolled back) and as the generic plan a prepared statement may switch to,
on a session configured like the service's pool (app/db/pool.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from app.db import claim, finishing, live_counts
from app.db import debounce as store_debounce
from app.db import dependencies as deps
from app.db import explain as store_explain
from app.db import jobs as store
from app.db import operations as store_ops
from app.db import releases as store_releases
from app.db import rescue as store_rescue
from app.db import retention as store_retention
from app.db import scale as store_scale
from app.db import timeouts as store_timeouts
from app.db import waiting as store_waiting
from app.db import workers as store_workers
from app.db import writes as store_writes
from app.db.pool import SESSION_SETTINGS
from tests import citus

pytestmark = [
    pytest.mark.slow,
    # Plans over one local table; on Citus the coordinator plans each statement as a task sent to a shard, and
    # tests/test_citus_plans.py checks that every hot one is a single-task router plan.
    citus.plain_only("plain PostgreSQL's plans over a local table (Citus's: tests/test_citus_plans.py)"),
]

RUNNING = 5_000


def stale_table(url: str, rows: int, running: int, vacuum: bool = True) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE jobq.jobs SET (autovacuum_enabled = false)")
        conn.execute(
            "INSERT INTO jobq.jobs (queue_name, payload) SELECT 'q', '{\"n\": 1}' FROM generate_series(1, 100)"
        )
        conn.execute("ANALYZE jobq.jobs")
        conn.execute(
            "INSERT INTO jobq.jobs (queue_name, payload, idempotency_key, group_key)"
            " SELECT 'q', '{\"n\": 1}', CASE WHEN g %% 100 = 0 THEN 'k' || g END,"
            "        CASE WHEN g > %s * 0.8 THEN 'g' || g %% 50 END"  # the newest fifth in 50 groups
            " FROM generate_series(1, %s) g",
            (rows, rows - 100),
        )
        if vacuum:
            conn.execute("VACUUM jobq.jobs")
        # Running jobs, as claims leave them; some on their last attempt; a few finished ones.
        conn.execute(
            """UPDATE jobq.jobs SET status = 'running', attempts = 1, claimed_at = now(), lease_seconds = 60,
                      lease_expires_at = now() + interval '60 seconds', claim_token = 't' || id,
                      max_attempts = CASE WHEN id %% 2 = 0 THEN 1 ELSE 5 END
               WHERE id BETWEEN 1001 AND 1000 + %s""",
            (running,),
        )
        conn.execute(
            """UPDATE jobq.jobs SET status = 'completed', finished_at = now() - interval '2 days'
               WHERE id BETWEEN 101 AND 200"""
        )


@pytest.fixture(scope="module", params=["vacuumed after the load", "not vacuumed"])
def stale_url(request: pytest.FixtureRequest, pg_admin_url: str, template_db: str) -> Iterator[str]:
    """The 300,000-row table, in the two states: a VACUUM after the load (the table's size known, the
    indexes' not, no column statistics), or none (the planner reads the sizes off the files)."""
    vacuum = request.param == "vacuumed after the load"
    name = "jobq_plans_stale" if vacuum else "jobq_plans_stale_unvacuumed"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template_db))
        )
    info = psycopg.conninfo.conninfo_to_dict(pg_admin_url)
    info["dbname"] = name
    url = psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]
    stale_table(url, 300_000, RUNNING, vacuum)
    yield url
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def session(url: str) -> psycopg.Connection:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(SESSION_SETTINGS, ("30000",))
    return conn


def custom_plan(conn: psycopg.Connection, query: str, params: dict[str, Any], prelude: str = "") -> dict[str, Any]:
    """EXPLAIN ANALYZE with the real parameters, in a transaction that is rolled back."""
    conn.execute("BEGIN")
    for statement in filter(None, prelude.split(";\n")):
        conn.execute(statement)
    try:
        row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()
    finally:
        conn.execute("ROLLBACK")
    assert row is not None
    return row[0][0]  # type: ignore[no-any-return]


def generic_plan(conn: psycopg.Connection, query: str, params: dict[str, Any], prelude: str = "") -> dict[str, Any]:
    """The plan a prepared statement uses once PostgreSQL settles on a generic plan."""
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, query)
    conn.execute("DEALLOCATE ALL")
    conn.execute(f"PREPARE hot AS {text}")
    conn.execute("BEGIN")
    for statement in filter(None, prelude.split(";\n")):
        conn.execute(statement)
    conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    try:
        args = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
        execute = sql.SQL("EXECUTE hot({})").format(args) if names else sql.SQL("EXECUTE hot")
        row = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) {}").format(execute)).fetchone()
    finally:
        conn.execute("ROLLBACK")
        conn.execute("DEALLOCATE hot")
    assert row is not None
    return row[0][0]  # type: ignore[no-any-return]


def reads_of_jobs(node: dict[str, Any]) -> set[str]:
    """How the plan reads `jobs`: "Seq Scan", "Bitmap Heap Scan", or the name of each index it scans."""
    found: set[str] = set()
    if node.get("Relation Name") == "jobs" and node["Node Type"] in ("Seq Scan", "Bitmap Heap Scan", "Tid Scan"):
        found.add(node["Node Type"])
    if node.get("Index Name", "").startswith("jobs_"):
        found.add(node["Index Name"])
    for child in node.get("Plans", []):
        found |= reads_of_jobs(child)
    return found


def j(doc: Any) -> str:
    return store.as_json(doc)


def new_jobs(n: int, key: Callable[[int], str | None], full: bool = True) -> tuple[str, dict[str, Any]]:
    """The plain insert of n jobs and its parameters: a VALUES list (store.job_insert_values) up to
    store.VALUES_MAX jobs, else store.JOB_INSERT_BATCH."""
    if n > store.VALUES_MAX:
        batch = [{"ord": i, "queue_name": "q", "payload": {"n": i}, "priority": 0, "run_at": None, "delay": None,
                  "max_attempts": 5, "idempotency_key": key(i)} for i in range(n)]  # fmt: skip
        return store.JOB_INSERT_BATCH["full" if full else "brief"], {"batch": j(batch)}
    params: dict[str, Any] = {}
    rows = [store._insert_row(k, store.NewJob("q", j({"n": k}), 0, None, None, 5, key(k)), params) for k in range(n)]
    return store.job_insert_values(rows, full), params


def unique_jobs(n: int, for_seconds: int | None = None) -> str:
    return j(
        [
            {"ord": i, "queue_name": "q", "payload": {"n": i}, "priority": 0, "max_attempts": 5, "is_unique": True,
             "unique_key": f"u{i}" if i % 2 else None, "unique_for": for_seconds,
             "unique_states": ["pending", "running", "completed"]}
            for i in range(n)
        ]
    )  # fmt: skip


DEBOUNCE = {"queue": "q", "key": "d", "payload": "1", "priority": 0, "seconds": 10.0, "max_wait": 60.0,
            "max_attempts": 5, "traceparent": None, "group": None, "timeout": None}  # fmt: skip


def slots(n: int) -> str:
    return j([{"ord": i, "worker": "w", "lease": 30, "lim": 10} for i in range(n)])


def fail_params(job_id: int, token: str) -> dict[str, Any]:
    return {"queue": "q", "id": job_id, "token": token, "error": "boom", "allowed": None, "retry": True,
            "retry_in": None, "base": 1.0, "cap": 60.0}  # fmt: skip


def items(ids: range, token: Callable[[int], str] = lambda i: f"t{i}") -> list[dict[str, Any]]:
    return [{"ord": n, "id": i, "token": token(i), "result": None, "allowed": None} for n, i in enumerate(ids)]


BY_ID = {"jobs_pkey"}
INSERT = {"jobs_idempotency_idx"}

# statement, parameters, the ways into `jobs` it may use
HOT: dict[str, tuple[str, dict[str, Any], set[str]]] = {
    "enqueue one": (*new_jobs(1, lambda i: None), set()),
    "enqueue one, minimal": (*new_jobs(1, lambda i: None, full=False), set()),
    "enqueue 30": (*new_jobs(30, lambda i: f"new{i}"), set()),
    "enqueue batch": (*new_jobs(100, lambda i: f"new{i}"), set()),
    "enqueue, keys taken": (
        store.JOB_GET_BY_KEYS,
        {"queue": "q", "keys": j([f"k{n}" for n in range(300, 1300, 100)])},
        INSERT,
    ),
    # Unique jobs (docs/producers.md): the insert reads nothing, the lookup of held keys only jobs_unique_idx.
    "enqueue unique": (store.JOB_INSERT_UNIQUE, {"batch": unique_jobs(10, 3600)}, set()),
    "enqueue unique, keys held": (
        store.JOB_GET_BY_UNIQUE,
        {"queue": "q", "batch": unique_jobs(10)},
        {"jobs_unique_idx"},
    ),
    # Debounce: the pending job of the key through jobs_debounce_idx, then by id.
    "enqueue debounced": (store_debounce.JOB_DEBOUNCE, DEBOUNCE, {"jobs_debounce_idx", "jobs_pkey"}),
    "claim 10": (
        claim.JOB_CLAIM,
        {"queue": "q", "total": 10, "slots": slots(1), "suffix": "cQ"},  # cQ: tokens.queue_suffix("q")
        {"jobs_claim_idx", "jobs_pkey"},
    ),
    "claim 100, 10 requests": (
        claim.JOB_CLAIM,
        {
            "queue": "q",
            "total": 100,
            "slots": j([{"ord": n, "worker": "w", "lease": 30, "lim": 10} for n in range(10)]),
            "suffix": "cQ",
        },
        {"jobs_claim_idx", "jobs_pkey"},
    ),
    "claim 10, concurrency limit": (
        claim.JOB_CLAIM_LIMITED,
        {"queue": "q", "total": 10, "slots": slots(1), "suffix": "cQ", "after": None, "window": claim.LANE_WINDOW},
        {"jobs_claim_idx", "jobs_group_idx", "jobs_running_idx", "jobs_pkey"},  # the group walk: planned, not run
    ),
    "claim 100, fair groups": (
        claim.JOB_CLAIM_LIMITED,
        {"queue": "q", "total": 100, "slots": slots(10), "suffix": "cQ", "after": "g7", "window": claim.LANE_WINDOW},
        {"jobs_claim_idx", "jobs_group_idx", "jobs_running_idx", "jobs_pkey"},
    ),
    "heartbeat": (
        store_writes.JOB_HEARTBEAT_MANY,
        {"queue": "q", "beats": j([{"ord": 0, "id": 1501, "token": "t1501", "lease": None, "allowed": None}])},
        BY_ID,
    ),
    "heartbeats, one stale": (
        store_writes.JOB_HEARTBEAT_MANY,
        {
            "queue": "q",
            "beats": j(
                [
                    {"ord": n, "id": i, "token": "stale" if n == 0 else f"t{i}", "lease": 60, "allowed": "^q$"}
                    for n, i in enumerate(range(1501, 1511))
                ]
            ),
        },
        BY_ID,
    ),
    "complete one": (
        store_writes.JOB_COMPLETE_MANY,
        {"queue": "q", "items": j(items(range(1601, 1602))), "full": True},
        BY_ID,
    ),
    "complete 10, one stale": (
        store_writes.JOB_COMPLETE_MANY,
        {
            "queue": "q",
            "items": j(items(range(1611, 1621), lambda i: "stale" if i == 1611 else f"t{i}")),
            "full": False,
        },
        BY_ID,
    ),
    "fail": (store_writes.JOB_FAIL, fail_params(1701, "t1701"), BY_ID),
    "fail, stale token": (store_writes.JOB_FAIL, fail_params(1702, "stale"), BY_ID),
    # The same on Citus (app/db/finishing.py): without the counter and outbox CTEs, which follow as statements
    # of their own in the same transaction (below, "a finish's counter" and "a finish's outbox rows").
    "complete one, Citus form": (
        store_writes.JOB_COMPLETE_MANY_CITUS,
        {"queue": "q", "items": j(items(range(1621, 1622))), "full": True},
        BY_ID,
    ),
    "complete 10, one stale, Citus form": (
        store_writes.JOB_COMPLETE_MANY_CITUS,
        {
            "queue": "q",
            "items": j(items(range(1631, 1641), lambda i: "stale" if i == 1631 else f"t{i}")),
            "full": False,
        },
        BY_ID,
    ),
    "fail, Citus form": (store_writes.JOB_FAIL_CITUS, fail_params(1703, "t1703"), BY_ID),
    "a finish's counter": (finishing.COUNTS_ADD, {"queue": "q", "status": "completed", "n": 10}, set()),
    "a finish's outbox rows": (
        finishing.releases_record_values(2),
        {"queue": "q", "i0": 1641, "s0": "completed", "i1": 1642, "s1": "failed"},
        set(),
    ),
    "release": (
        store_writes.JOB_RELEASE_CLAIM,
        {"queue": "q", "id": 1801, "token": "t1801", "delay": 0.0, "allowed": None},
        BY_ID,
    ),
    "release undelivered claims": (
        store_writes.JOB_RELEASE,
        {"queue": "q", "claims": j([{"id": i, "token": f"t{i}"} for i in range(1901, 1911)])},
        BY_ID,
    ),
    # The queues of the jobs that tokens from before 1.2.0 (which name none) write to: by id, once per call.
    "queues of jobs by id": (store_writes.JOB_QUEUES, {"ids": list(range(1501, 1511))}, BY_ID),
    "get": (store.JOB_GET, {"id": 1901, "queue": "q", "allowed": None}, BY_ID),
    "jobs waited for": (store.JOBS_GET_WAITED, {"ids": list(range(1501, 1601)), "queues": ["q"]}, BY_ID),
    # The sweeper (app/db/rescue.py): the queues with lapsed leases (index only), then one queue at a time.
    "queues with lapsed leases": (
        store_rescue.JOB_LAPSED_QUEUES,
        {"now": "2100-01-01T00:00:00+00:00", "skip": ["other"], "scan": 10_000},
        {"jobs_lease_idx", "jobs_queue_lease_idx"},  # either: running jobs only, index only
    ),
    "rescue lapsed leases": (
        store_rescue.JOB_RESCUE_EXPIRED,
        {"queue": "q", "now": "2100-01-01T00:00:00+00:00", "batch": 1000},
        {"jobs_queue_lease_idx", "jobs_pkey"},
    ),
    "fail exhausted leases": (
        store_rescue.JOB_FAIL_EXHAUSTED,
        {"queue": "q", "now": "2100-01-01T00:00:00+00:00", "batch": 1000},
        {"jobs_queue_lease_idx", "jobs_pkey"},
    ),
    "retention": (
        store_retention.JOBS_DELETE_FINISHED,
        {"queue": "q", "status": "completed", "age": 86400, "batch": 1000, "now": None},
        {"jobs_finished_idx", "jobs_pkey"},
    ),
    "stats": (
        store_ops.QUEUE_STATS,
        {"queue": "q", "window": 300, "over": 10_001, "trust": 120.0},
        {"jobs_claim_idx", "jobs_running_idx", "jobs_last_attempts_idx", "jobs_waiting_idx"},
    ),
    "queues": (
        store_ops.QUEUES_PAGE,
        {"after": "", "allowed": None, "n": 1001, "over": 11, "over_new": 10_001, "trust": 120.0},
        {"jobs_claim_idx", "jobs_running_idx", "jobs_waiting_idx"},
    ),
    # The background's count of every queue's live jobs (app/db/live_counts.py), once per interval.
    "live counts": (
        live_counts.LIVE_COUNTS_WRITE,
        {},
        {"jobs_claim_idx", "jobs_running_idx", "jobs_waiting_idx", "jobs_last_attempts_idx"},
    ),
    # Dependencies (app/db/dependencies.py): the parents locked, the new dependants settled.
    "enqueue with dependencies, parents": (
        deps.JOB_LOCK_PARENTS,
        {"queue": "q", "ids": list(range(1501, 1511)), "allowed": None},
        BY_ID,
    ),
    "enqueue with dependencies, settle": (
        deps.JOB_SETTLE,
        {
            "queue": "q",
            "items": j(
                [
                    {
                        "id": i,
                        "status": "waiting",
                        "pending": 1,
                        "depends_on": [1501],
                        "policy": None,
                        "error": None,
                        "mark": None,
                    }
                    for i in range(250_001, 250_101)
                ]
                + [{"id": 1501, "mark": True}]
            ),
        },
        BY_ID,
    ),
    # The dependency release (app/db/releases.py) on a parent with 10,000 waiting dependants: its outbox rows,
    # one batch of its dependency rows, one batch of dependants settled, the reconciliation's walk.
    "release, outbox rows": (
        store_releases.RELEASES_CLAIM,
        {"queue": "q", "jobs": None, "limit": 1000},
        BY_ID,
    ),
    "release, the request's own outbox rows": (
        store_releases.RELEASES_CLAIM_OWN,
        {"queue": "q", "jobs": [1, 2], "limit": 1000},
        BY_ID,
    ),
    "release, dependency rows": (
        store_releases.EDGES_TAKE,
        {"queue": "q", "parents": [1501], "limit": 1000},
        set(),
    ),
    "release, 1,000 dependants settled": (
        store_releases.DEPENDANTS_SETTLE,
        {
            "queue": "q",
            "items": j([{"id": i, "n": 1, "bad_id": 1501, "bad_status": "failed"} for i in range(250_001, 251_001)]),
            "now": "2026-01-01T00:00:00+00:00",
        },
        BY_ID,
    ),
    "release, reconciliation page": (
        store_releases.EDGES_FINISHED_PARENTS,
        {"queue": "q", "after": 0, "limit": 1000},
        BY_ID,
    ),
    # An SQL enqueue's message naming 1,000 of those dependants: their parents marked (app/core/dependencies.py).
    "release, parents of 1,000 SQL-enqueued dependants found": (
        store_releases.PARENT_EDGES,
        {"queue": "q", "jobs": list(range(250_001, 251_001)), "only": None},
        BY_ID,
    ),
    "release, parents of SQL-enqueued dependants marked": (
        store_releases.PARENTS_MARK,
        {"queue": "q", "parents": [1501, 1502]},
        BY_ID,
    ),
}
# The stats' top groups (app/db/operations.py QUEUE_GROUPS): 60,000 pending jobs with a group, read up to the
# maximum; and the background's count of every queue's top groups (app/db/live_counts.py), once per interval.
HOT["stats, top groups"] = (
    store_ops.QUEUE_GROUPS,
    {"queue": "q", "top": 20, "over": 10_001},
    {"jobs_group_idx", "jobs_running_idx"},
)
HOT["live groups"] = (live_counts.LIVE_GROUPS_WRITE, {}, {"jobs_group_idx", "jobs_running_idx"})
# The fallback poll's look over every waited queue (app/db/waiting.py): one index probe per queue, never
# the pending jobs of all queues hashed.
HOT["queues with ready jobs, 1,000 waited"] = (
    store_waiting.QUEUES_READY,
    {"queues": ["q", *(f"tenant-{i}" for i in range(999))]},
    {"jobs_claim_idx"},
)
# The same look at one queue: on Citus, one such statement per waited queue (app/db/waiting.py).
HOT["queue with ready jobs, one waited"] = (store_waiting.QUEUE_READY, {"queue": "q"}, {"jobs_claim_idx"})
# 10,000 dependants of job 1501 (running, so finished as far as the release cares once it is recorded), and its
# outbox row.
WAITING_10K = (
    "WITH w AS (UPDATE jobq.jobs SET status = 'waiting', pending_dependencies = 1, dependency_depth = 1"
    " WHERE id BETWEEN 250001 AND 260000 RETURNING id)"
    " INSERT INTO jobq.job_dependencies (parent_id, job_id, parent_queue, job_queue)"
    " SELECT 1501, id, 'q', 'q' FROM w;\n"
    "UPDATE jobq.jobs SET has_dependants = true WHERE id = 1501;\n"
    "INSERT INTO jobq.dependency_releases (queue_name, job_id, status) VALUES ('q', 1501, 'failed')"
)
# Issue 25: the scaling signal (polled by autoscalers), the timeout sweep (every second), explain, the
# worker registry's reads (the dashboard's Workers page refreshes every 3 s).
HOT["scale"] = (
    store_scale.QUEUE_SCALE,
    {"queue": "q", "cap": 1000, "levels": store_scale.LEVELS, "groups": store_scale.GROUPS},
    {"jobs_claim_idx", "jobs_group_idx", "jobs_running_idx"},
)
HOT["scale, group limits"] = HOT["scale"]
HOT["fail timed-out jobs"] = (
    store_timeouts.JOB_FAIL_TIMED_OUT,
    {"queue": "q", "now": "2100-01-01T00:00:00+00:00", "batch": 1000, "base": 1.0, "cap": 60.0},
    # A queue's running jobs, by either index that holds exactly them (jobs_queue_lease_idx: the sweeper's).
    {"jobs_timeout_idx", "jobs_running_idx", "jobs_queue_lease_idx", "jobs_pkey"},
)
HOT["queues with jobs past their timeout"] = (
    store_timeouts.JOB_TIMEOUT_QUEUES,
    {"now": "2100-01-01T00:00:00+00:00", "skip": ["other"], "scan": 10_000},
    {"jobs_timeout_idx", "jobs_running_idx", "jobs_queue_lease_idx"},
)
HOT["explain"] = (
    store_explain.JOB_EXPLAIN,
    {"id": 250_000, "queue": "q"},
    {"jobs_group_idx", "jobs_running_idx", "jobs_pkey"},
)
HOT["workers"] = (
    store_workers.WORKERS_LIST,
    {"allowed": None, "gone": 60, "keep": 86400, "limit": 200, "ids": store_workers.JOB_IDS_LISTED},
    # The running jobs, through either index that holds exactly them.
    {"jobs_lease_idx", "jobs_queue_lease_idx"},
)
HOT["a worker's jobs"] = (
    store_workers.WORKER_JOBS,
    {"name": "w", "allowed": None, "limit": 1000},
    {"jobs_lease_idx", "jobs_queue_lease_idx"},
)
# Statements that run after a SET LOCAL of their own (app/db/operations.py), or on a configured queue.
PRELUDE = {
    **dict.fromkeys(
        [
            "release, outbox rows",
            "release, dependency rows",
            "release, 1,000 dependants settled",
            "release, reconciliation page",
        ],
        WAITING_10K,
    ),
    **dict.fromkeys(
        [
            "release, parents of 1,000 SQL-enqueued dependants found",
            "release, parents of SQL-enqueued dependants marked",
        ],
        WAITING_10K + ";\nUPDATE jobq.jobs SET depends_on = ARRAY[1501::bigint] WHERE id BETWEEN 250001 AND 260000",
    ),
    "stats": store_ops.NO_SEQSCAN,
    "queues": store_ops.NO_SEQSCAN,
    "live counts": store_ops.NO_SEQSCAN,
    # 5,000 running jobs with a group (100 in each of the 50 groups), past the maximum of the bounded test below
    # (id::text: Citus refuses a STABLE function of a column in an UPDATE, and text || bigint is one).
    **dict.fromkeys(
        ["stats, top groups", "live groups"],
        store_ops.NO_SEQSCAN + ";\nUPDATE jobq.jobs SET status = 'running', attempts = 1, claimed_at = now(),"
        " lease_seconds = 60, lease_expires_at = now() + interval '60 seconds', claim_token = 't' || id::text"
        " WHERE id BETWEEN 290001 AND 295000",
    ),
    "claim 10, concurrency limit": "INSERT INTO jobq.queue_state (queue_name, concurrency) VALUES ('q', 6000)",
    "scale, group limits": "INSERT INTO jobq.queue_state (queue_name, concurrency, group_concurrency)"
    " VALUES ('q', 6000, 2)",
    **dict.fromkeys(
        ["fail timed-out jobs", "queues with jobs past their timeout"],
        "INSERT INTO jobq.queue_state (queue_name, timeout_seconds) VALUES ('q', 60);\n"
        "UPDATE jobq.jobs SET timeout_seconds = 30 WHERE id BETWEEN 1001 AND 1500",
    ),
    "explain": "INSERT INTO jobq.queue_state (queue_name, concurrency, ordered) VALUES ('q', 6000, true)",
    "workers": "INSERT INTO jobq.workers (name, queue_name, first_seen, last_seen) SELECT 'w' || g, 'q', now(), now()"
    " FROM generate_series(1, 100) g",
    "claim 100, fair groups": "INSERT INTO jobq.queue_state (queue_name, concurrency, fair, group_concurrency,"
    " group_rate_limit, group_rate_per_seconds) VALUES ('q', 6000, true, 3, 100, 60)",
}


@pytest.mark.parametrize("name", list(HOT))
def test_hot_statements_keep_their_plans_on_stale_statistics(stale_url: str, name: str) -> None:
    query, params, allowed = HOT[name]
    with session(stale_url) as conn:
        prelude = PRELUDE.get(name, "")
        plans = {
            "custom": custom_plan(conn, query, params, prelude),
            "generic": generic_plan(conn, query, params, prelude),
        }
        for kind, plan in plans.items():
            reads = reads_of_jobs(plan["Plan"])
            assert reads <= allowed, f"{name} ({kind} plan) reads jobs by {sorted(reads - allowed)}"
    if name == "release, 1,000 dependants settled":
        # One lookup per dependant, not the list again per dependant (10,000 x 10,000 in an older plan of the
        # release): tens of buffers each (the update writes index entries), and every one of them settled.
        top = plans["custom"]["Plan"]
        assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] <= 50 * 1000, top["Shared Hit Blocks"]
        assert top["Actual Rows"] == 1000, top["Actual Rows"]


def rows_read_from_jobs(node: dict[str, Any]) -> int:
    """Rows the plan's scans of `jobs` returned, over all their loops."""
    n = 0
    if node.get("Relation Name") == "jobs" or node.get("Index Name", "").startswith("jobs_"):
        n += int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
    for child in node.get("Plans", []):
        n += rows_read_from_jobs(child)
    return n


# What each read may return from `jobs` with a maximum of 1,000: pending, running, waiting and last attempts, up to
# 1,001 each, and one probe per priority level; the top groups, pending jobs with a group and their running ones.
BOUNDED = {"stats": 4 * 1001 + 2 * store_scale.LEVELS, "queues": 4 * 1001 + 2 * store_scale.LEVELS,
           "stats, top groups": 2 * 1001}  # fmt: skip


@pytest.mark.parametrize("name", list(BOUNDED))
def test_live_counts_read_at_most_the_exact_maximum_of_a_big_queue(stale_url: str, name: str) -> None:
    """Issue 22: a queue's stats (its top groups too) and GET /queues read each kind of live job up to
    JOBQ_STATS_EXACT_MAX (here 1,000), however many there are (300,000 pending here, 60,000 of them with a group);
    past it they answer from the background's count (app/db/live_counts.py)."""
    query, params, _ = HOT[name]
    with session(stale_url) as conn:
        plan = custom_plan(conn, query, {**params, "over": 1001, "over_new": 1001}, PRELUDE[name])
    read = rows_read_from_jobs(plan["Plan"])
    assert read <= BOUNDED[name], read


def complete_ten_cost(url: str, first: int) -> tuple[int, float]:
    """(shared buffers touched, ms) of completing ten running jobs in one statement."""
    with session(url) as conn:
        plan = custom_plan(
            conn,
            store_writes.JOB_COMPLETE_MANY,
            {"queue": "q", "items": j(items(range(first, first + 10))), "full": False},
        )
    top = plan["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"], plan["Execution Time"]


def test_a_batch_complete_costs_the_same_on_a_big_stale_table(stale_url: str, database_factory) -> None:  # type: ignore[no-untyped-def]
    """A 10-job batch complete on 300,000 rows with 5,000 running costs within 1.5x of the same on 3,000
    rows with 50 running. Cost is counted in buffers touched, which timing on a shared machine cannot
    measure as steadily; the times are printed beside them."""
    small = database_factory()
    stale_table(small, 3_000, 50)
    small_buffers, small_ms = complete_ten_cost(small, 1011)
    big_buffers, big_ms = complete_ten_cost(stale_url, 1011)
    print(f"10-job complete: {small_buffers} buffers, {small_ms:.2f} ms at 3k rows; "
          f"{big_buffers} buffers, {big_ms:.2f} ms at 300k rows")  # fmt: skip
    assert big_buffers <= 1.5 * small_buffers, (small_buffers, big_buffers)
