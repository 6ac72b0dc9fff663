"""On Citus, every statement of a hot or maintenance path runs on one shard: EXPLAIN shows one Citus node with
one task and no subplans (docs/scale-out.md). Runs only on a Citus cluster (JOBQ_TEST_CITUS_URL, make
test-citus); the plain-PostgreSQL plans are tests/test_plans.py's, over the same statements.

A statement Citus must split (a subplan through the coordinator) or send to every shard would multiply the
round trips of each call by the number of nodes or shards; one it cannot plan fails the call. A few reads
may go to every shard by design (FAN_OUT, each with its reason): none of them is on an enqueue, claim or
worker write."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import psycopg
import pytest

from app.db import claim as store_claim
from app.db import debounce as store_debounce
from app.db import jobs as store
from app.db import operations as store_ops
from app.db.tokens import queue_suffix
from tests import citus
from tests.test_plans import DEBOUNCE, HOT, PRELUDE, unique_jobs


def citus_batch(n: int, unique: bool = False) -> dict[str, Any]:
    """The parameters of store.citus_insert_values(n, unique=unique): jobs of queue q with ids and keys, every
    other one unique (in a window of an hour) when unique."""
    params: dict[str, Any] = {}
    for k in range(n):
        job = store.NewJob("q", json.dumps({"n": k}), 0, None, None, 5, None if unique else f"new{k}")
        store._citus_params(k, 10_000_000 + k, job, params)
        if unique:
            params |= {f"uk{k}": f"u{k}", f"uf{k}": "2026-01-01 00:00:00+00", f"us{k}": 3600,
                       f"ut{k}": ["pending", "running", "completed"]}  # fmt: skip
    return params


pytestmark = [
    pytest.mark.citus,
    pytest.mark.skipif(not os.environ.get(citus.URL_VARIABLE), reason=f"a Citus cluster only ({citus.URL_VARIABLE})"),
]

# Statements the service sends on Citus only (tests/test_plans.py's catalogue holds those of plain PostgreSQL).
CITUS_ONLY = {
    # GET /queues where the walks are refused (app/db/operations.py QUEUES_PAGE_FANOUT).
    "queues, Citus page": (
        store_ops.QUEUES_PAGE_FANOUT,
        {"after": "", "allowed": None, "n": 1001, "over": 10_001},
        set(),
    ),
    # An enqueue the one VALUES list does not serve (more than VALUES_MAX jobs, keys out of order): a chunk of
    # store.CHUNK rows at most, with ids drawn first (app/db/jobs.py _citus_insert).
    "enqueue batch, Citus": (store.citus_insert_values(100), citus_batch(100), set()),
    "enqueue batch, Citus, minimal": (store.citus_insert_values(100, False), citus_batch(100), set()),
    # Unique jobs (_citus_insert_unique): keys and windows computed first, then the rows, then the jobs made.
    "enqueue unique, Citus": (store.citus_insert_values(10, unique=True), citus_batch(10, unique=True), set()),
    "enqueue unique, Citus, jobs made": (store.JOBS_GET_MADE, {"queue": "q", "ids": [1, 2, 3]}, set()),
    # A debounced enqueue (app/db/debounce.py _debounce_citus): the target, then its replacement or a new job.
    "enqueue debounced, Citus target": (store_debounce.JOB_DEBOUNCE_TARGET, DEBOUNCE, set()),
    "enqueue debounced, Citus replace": (
        store_debounce.JOB_DEBOUNCE_REPLACE,
        {**DEBOUNCE, "id": 1, "run_at": "2026-01-01 00:00:00+00"},
        set(),
    ),
    "enqueue debounced, Citus new": (store_debounce.JOB_DEBOUNCE_INSERT, DEBOUNCE, set()),
    # The ids (and unique keys) of those enqueues: no table read, the coordinator answers alone (LOCAL).
    "enqueue, Citus ids": (store.CITUS_IDS, {"n": 100}, set()),
    "enqueue unique, Citus ids and keys": (store.CITUS_UNIQUE_IDS, {"batch": unique_jobs(10, 3600)}, set()),
    # A claim of key 5 of a spread queue (app/core/dispatcher.py _claim_keys): the claim, naming the key.
    "claim 10, a key of a spread queue": (
        store_claim.JOB_CLAIM,
        {"queue": "q#5", "total": 10, "slots": HOT["claim 10"][1]["slots"], "suffix": queue_suffix("q#5")},
        set(),
    ),
}
# Statements that read no distributed table: no Citus node, nothing sent to a worker.
LOCAL = {"enqueue, Citus ids", "enqueue unique, Citus ids and keys"}
STATEMENTS = {**HOT, **CITUS_ONLY}

# Reads that go to every shard by design: (name in HOT) -> why.
FAN_OUT = {
    "queues of jobs by id": "a worker's write with a token from before 1.2.0 (it names no queue), once per call",
    "queues with lapsed leases": "the sweeper's one look over all queues per pass, then one queue at a time",
    "queues with jobs past their timeout": "the timeout sweep's look over all queues, then one queue at a time",
    "queues, Citus page": "GET /queues lists every queue",
    "live counts": "the background's count of every queue's live jobs, once per interval for the whole cluster",
    "live groups": "the background's count of every queue's top groups, with the live counts",
    "workers": "GET /workers lists every queue's workers",
    "a worker's jobs": "a worker may hold jobs of any queue",
}

# Statements of plain PostgreSQL only: on Citus the service sends another (named in the reason).
PLAIN_ONLY = {
    "queues": "index walks over every queue (recursive), which Citus refuses: on Citus GET /queues sends "
    'QUEUES_PAGE_FANOUT ("queues, Citus page")',
    "queues with ready jobs, 1,000 waited": "a recursive walk over many queues, which Citus refuses: on Citus the "
    "fallback poll sends QUEUE_READY once per waited queue, pipelined (app/db/waiting.py)",
    **dict.fromkeys(
        ["complete one", "complete 10, one stale", "fail", "fail, stale token"],
        "its finished-job count and dependency outbox are INSERTs in CTEs, which Citus runs as subplans: on "
        "Citus the service sends the Citus form and writes those two by statements of their own in the same "
        "transaction (app/db/finishing.py)",
    ),
    "enqueue batch": "an INSERT ... SELECT, which Citus pulls through the coordinator: on Citus a batch of more than "
    'VALUES_MAX jobs is inserted by VALUES lists ("enqueue batch, Citus")',
    "enqueue unique": "an INSERT ... SELECT computing each row's unique key and window: on Citus those are computed "
    'first, and the rows inserted by VALUES lists ("enqueue unique, Citus")',
    "enqueue debounced": "a conditional INSERT ... SELECT beside the replacing UPDATE: on Citus each part is a "
    'statement of its own in the same transaction ("enqueue debounced, Citus ...")',
}

# Statements Citus still splits, each with its reason: the test expects them split (xfail) until they are not.
SPLIT = {
    "enqueue batch": "more than VALUES_MAX jobs: INSERT ... SELECT, which Citus pulls through the coordinator "
    "(a VALUES list of that size costs 2-3x on PostgreSQL)",
    "enqueue unique": "its INSERT ... SELECT (the unique key and window computed per row)",
    "enqueue debounced": "the conditional INSERT ... SELECT of a new job beside the replacing UPDATE",
}


def tasks(plan: dict[str, Any]) -> tuple[list[int], bool]:
    """The task counts of every Citus node in a plan, and whether it has subplans."""
    text = json.dumps(plan)
    return [int(n) for n in re.findall(r'"Task Count": (\d+)', text)], '"Subplans"' in text


@pytest.fixture
def citus_url(database_url: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobq.jobs (queue_name, payload) SELECT 'q', '{\"n\": 1}' FROM generate_series(1, 200)"
        )
    return database_url


@pytest.mark.parametrize("name", list(STATEMENTS))
def test_each_hot_statement_runs_on_one_shard(citus_url: str, name: str) -> None:
    if name in PLAIN_ONLY:
        pytest.skip(PLAIN_ONLY[name])
    query, params, _ = STATEMENTS[name]
    with psycopg.connect(citus_url, autocommit=True) as conn:
        conn.execute("BEGIN")
        try:
            for statement in filter(None, PRELUDE.get(name, "").split(";\n")):
                conn.execute(statement)
            row = conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()
        finally:
            conn.execute("ROLLBACK")
    assert row is not None
    counts, subplans = tasks(row[0][0])
    if name in LOCAL:
        assert not counts and not subplans, f"{name}: tasks {counts}, subplans {subplans}"
        return
    if name in FAN_OUT:
        assert counts, f"{name}: not a Citus plan"
        return
    if name in SPLIT and (counts != [1] or subplans):
        pytest.xfail(SPLIT[name])
    assert counts == [1] and not subplans, f"{name}: tasks {counts}, subplans {subplans}"
