"""Enqueue from SQL in the caller's own transaction: enqueue() and enqueue_batch() (migrations/0045_sql_enqueue.sql,
docs/producers.md). One service and database for the module; each test works on queues of its own."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from app.db.migrate import load_migrations
from tests.conftest import make_settings
from tests.support import LiveServer, record_messages, report, settle_long_poll, wait_until

SCHEMA = "jobq"  # jobq's schema (JOBQ_DB_SCHEMA), where the migrations made the functions

_names = itertools.count()


@pytest.fixture
def queue() -> str:
    return f"sql-{next(_names)}"


@pytest.fixture
def url(module_database_url: str) -> str:
    return module_database_url


@pytest.fixture
def conn(url: str) -> Iterator[psycopg.Connection]:
    """A caller's connection: transactions are the test's to commit or roll back."""
    with psycopg.connect(url) as c:
        yield c


def enqueue(conn: psycopg.Connection, queue: str, payload: Any, **options: Any) -> int:
    """SELECT enqueue(queue, payload, name => value, ...) in the connection's current transaction."""
    named = "".join(f", {name} => %({name})s" for name in options)
    params = {"queue": queue, "payload": Jsonb(payload), **options}
    row = conn.execute(f"SELECT {SCHEMA}.enqueue(%(queue)s, %(payload)s{named})", params).fetchone()
    assert row is not None
    return int(row[0])


def enqueue_batch(conn: psycopg.Connection, queue: str, jobs: Any) -> list[int]:
    row = conn.execute(f"SELECT {SCHEMA}.enqueue_batch(%s, %s)", (queue, Jsonb(jobs))).fetchone()
    assert row is not None
    return list(row[0])


def count(db: psycopg.Connection, queue: str) -> int:
    row = db.execute("SELECT count(*) FROM jobq.jobs WHERE queue_name = %s", (queue,)).fetchone()
    assert row is not None
    return int(row[0])


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def claim_when_free(server: LiveServer, queue: str) -> dict[str, Any]:
    """The one job a claim gets, once it gets one: right after an SQL enqueue with dependencies commits, the
    service's marking and release of its parents (the "sql d" message) hold rows for a moment, and a claim
    skips locked rows."""
    got: list[dict[str, Any]] = []

    def claimed() -> bool:
        got.extend(server.claim(queue))
        return bool(got)

    wait_until(claimed, what=f"a job claimed on {queue}")
    assert len(got) == 1, got
    return got[0]


def test_a_committed_enqueue_is_the_job_the_api_shows(
    shared_server: LiveServer, conn: psycopg.Connection, queue: str
) -> None:
    job_id = enqueue(
        conn,
        queue,
        {"to": "a@b"},
        priority=5,
        delay_seconds=10,
        max_attempts=3,
        group_key="tenant-7",
        timeout_seconds=60,
    )
    conn.commit()
    job = shared_server.job(job_id)
    assert (job["queue"], job["payload"], job["status"], job["priority"]) == (queue, {"to": "a@b"}, "pending", 5)
    assert (job["max_attempts"], job["group"], job["timeout_seconds"], job["attempts"]) == (3, "tenant-7", 60, 0)
    assert at(job["run_at"]) - at(job["created_at"]) == timedelta(seconds=10)
    assert queue in {q["queue"] for q in shared_server.client.get("/queues").json()["queues"]}


def test_the_queue_configuration_gives_the_defaults(
    shared_server: LiveServer, conn: psycopg.Connection, queue: str
) -> None:
    r = shared_server.client.patch(f"/queues/{queue}/config", json={"default_priority": 9, "max_attempts": 2})
    assert r.status_code == 200, r.text
    job_id = enqueue(conn, queue, None)
    conn.commit()
    job = shared_server.job(job_id)
    assert (job["priority"], job["max_attempts"], job["payload"]) == (9, 2, None)


def test_a_rollback_leaves_no_trace_and_a_savepoint_undoes_only_its_part(
    shared_server: LiveServer, conn: psycopg.Connection, shared_db: psycopg.Connection, queue: str
) -> None:
    gone = enqueue(conn, queue, "rolled back")
    conn.rollback()
    assert shared_server.client.get(f"/jobs/{gone}").status_code == 404
    kept = enqueue(conn, queue, "kept")
    with pytest.raises(psycopg.errors.RaiseException), conn.transaction():  # a savepoint, rolled back
        undone = enqueue(conn, queue, "undone")
        raise psycopg.errors.RaiseException("the business write failed")
    conn.commit()
    assert shared_server.job(kept)["payload"] == "kept"
    assert undone > kept and shared_server.client.get(f"/jobs/{undone}").status_code == 404
    assert count(shared_db, queue) == 1


def test_a_job_is_claimable_once_its_transaction_commits_and_not_before(
    shared_server: LiveServer, conn: psycopg.Connection, queue: str
) -> None:
    job_id = enqueue(conn, queue, 1)
    assert shared_server.claim(queue) == []
    assert shared_server.client.get(f"/jobs/{job_id}").status_code == 404
    conn.commit()
    assert shared_server.claim_one(queue)["id"] == job_id


def test_many_concurrent_callers_each_make_their_job(url: str, shared_db: psycopg.Connection, queue: str) -> None:
    barrier = threading.Barrier(20)
    ids: list[int] = []

    def caller(n: int) -> None:
        with psycopg.connect(url) as c:
            barrier.wait()
            ids.append(enqueue(c, queue, {"n": n}))
            c.commit()

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 20
    assert count(shared_db, queue) == 20


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


DEEP = {"a": nested(32)}  # 33 levels: one past JOBQ_MAX_JSON_DEPTH's default

BAD = [
    # (queue, options, the field named)
    ("bad queue!", {}, "queue"),
    ("q" * 129, {}, "queue"),
    ("é", {}, "queue"),
    (None, {"priority": 40000}, "priority"),
    (None, {"run_at": datetime(2030, 1, 1).astimezone(), "delay_seconds": 1}, "run_at"),
    (None, {"delay_seconds": -1.0}, "delay_seconds"),
    (None, {"max_attempts": 0}, "max_attempts"),
    (None, {"idempotency_key": "k" * 256}, "idempotency_key"),
    (None, {"group_key": "tab\there"}, "group_key"),
    (None, {"timeout_seconds": 0}, "timeout_seconds"),
    (None, {"depends_on": [987654321]}, "depends_on"),
    (None, {"depends_on": list(range(1, 102))}, "depends_on"),
    (None, {"on_dependency_failure": "run"}, "on_dependency_failure"),
    (None, {"unique_while": ["pending", "completed"]}, "unique_while"),
    (None, {"unique_key": "u", "idempotency_key": "i"}, "unique_key"),
    (None, {"unique_job": True, "depends_on": [1]}, "unique_key"),
    (None, {"debounce_key": "d"}, "debounce_seconds"),
    (
        None,
        {"debounce_key": "d", "debounce_seconds": 10.0, "debounce_max_wait_seconds": 5.0},
        "debounce_max_wait_seconds",
    ),
    (None, {"debounce_key": "d", "debounce_seconds": 10.0, "delay_seconds": 1.0}, "debounce_key"),
]


@pytest.mark.parametrize(("bad_queue", "options", "field"), BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_each_bad_argument_is_22023_naming_its_field_and_writes_nothing(
    conn: psycopg.Connection, shared_db: psycopg.Connection, queue: str, bad_queue: str | None,
    options: dict[str, Any], field: str,
) -> None:  # fmt: skip
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        enqueue(conn, bad_queue or queue, {"x": 1}, **options)
    assert caught.value.sqlstate == "22023"
    assert caught.value.diag.column_name == field
    assert field in str(caught.value) and caught.value.diag.message_hint
    conn.rollback()
    assert count(shared_db, queue) == 0


def test_payloads_jsonb_cannot_hold_or_too_big_or_too_deep_are_refused(
    conn: psycopg.Connection, shared_db: psycopg.Connection, queue: str
) -> None:
    for payload in ("x" * 1_048_577, DEEP):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="payload"):
            enqueue(conn, queue, payload)
        conn.rollback()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="payload: is required"):
        conn.execute(f"SELECT {SCHEMA}.enqueue(%s, NULL)", (queue,))
    conn.rollback()
    assert count(shared_db, queue) == 0
    enqueue(conn, queue, DEEP["a"][0])  # 32 levels: the limit
    conn.rollback()


def test_a_too_deep_dependency_is_refused(conn: psycopg.Connection, shared_db: psycopg.Connection, queue: str) -> None:
    parent = enqueue(conn, queue, "parent")
    conn.commit()
    shared_db.execute("UPDATE jobq.jobs SET dependency_depth = 1000 WHERE id = %s", (parent,))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="1001 dependencies deep"):
        enqueue(conn, queue, "child", depends_on=[parent])
    conn.rollback()
    assert count(shared_db, queue) == 1


def test_a_full_queue_is_jq429_and_a_replace_or_a_hit_still_goes_through(
    shared_server: LiveServer, conn: psycopg.Connection, shared_db: psycopg.Connection, queue: str
) -> None:
    assert shared_server.client.patch(f"/queues/{queue}/config", json={"max_pending": 2}).status_code == 200
    enqueue(conn, queue, 1, unique_key="u")
    enqueue(conn, queue, 2, debounce_key="d", debounce_seconds=60.0)
    conn.commit()
    with pytest.raises(psycopg.Error) as caught:
        enqueue(conn, queue, 3)
    assert caught.value.sqlstate == "JQ429", caught.value
    assert "limit is 2" in str(caught.value) and caught.value.diag.message_hint
    conn.rollback()
    # Counted after the write: what adds no job passes at a full queue (HTTP refuses it, docs/producers.md).
    enqueue(conn, queue, 1, unique_key="u")
    enqueue(conn, queue, 4, debounce_key="d", debounce_seconds=60.0)
    conn.commit()
    assert count(shared_db, queue) == 2


def test_an_idempotency_key_returns_the_same_job(
    shared_server: LiveServer, conn: psycopg.Connection, shared_db: psycopg.Connection, queue: str
) -> None:
    first = enqueue(conn, queue, 1, idempotency_key="order-7")
    conn.commit()
    assert enqueue(conn, queue, 2, idempotency_key="order-7") == first
    conn.commit()
    over_http = shared_server.client.post(f"/queues/{queue}/jobs", json={"payload": 3, "idempotency_key": "order-7"})
    assert (over_http.status_code, over_http.json()["id"]) == (200, first)
    assert count(shared_db, queue) == 1 and shared_server.job(first)["payload"] == 1


def test_twenty_concurrent_unique_enqueues_make_one_job_http_agrees(
    shared_server: LiveServer, url: str, shared_db: psycopg.Connection, queue: str
) -> None:
    barrier = threading.Barrier(20)
    ids: list[int] = []

    def caller() -> None:
        with psycopg.connect(url) as c:
            barrier.wait()
            ids.append(enqueue(c, queue, {"digest": 7}, unique_job=True, unique_for_seconds=3600))
            c.commit()

    threads = [threading.Thread(target=caller) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and count(shared_db, queue) == 1
    # The same key (the payload's hash) and window as the HTTP path's.
    body = {"payload": {"digest": 7}, "unique": {"for_seconds": 3600}}
    r = shared_server.client.post(f"/queues/{queue}/jobs", json=body)
    assert (r.status_code, r.headers["jobq-enqueued"], r.json()["id"]) == (200, "existing", ids[0])
    shown = shared_server.job(ids[0])["unique"]
    assert (shown["for_seconds"], shown["while"]) == (3600, ["pending", "running", "completed"])


def test_debounce_replaces_the_payload_moves_the_run_time_and_keeps_the_max_wait(
    shared_server: LiveServer, conn: psycopg.Connection, shared_db: psycopg.Connection, queue: str
) -> None:
    opts: dict[str, Any] = {"debounce_key": "reindex-9", "debounce_seconds": 100.0, "debounce_max_wait_seconds": 150.0}
    first = enqueue(conn, queue, {"rev": 1}, **opts)
    conn.commit()
    before = shared_server.job(first)
    assert at(before["run_at"]) - at(before["created_at"]) == timedelta(seconds=100)
    # As if enqueued 100 s ago: now + 100 s would pass created_at + 150 s, so it is capped there.
    # (The new times computed in a CTE: Citus refuses timestamptz - interval on a column in an UPDATE.)
    shared_db.execute(
        "WITH t AS (SELECT id, created_at - interval '100 s' AS c, run_at - interval '100 s' AS r FROM jobq.jobs"
        " WHERE queue_name = %(queue)s AND id = %(id)s)"
        " UPDATE jobq.jobs j SET created_at = t.c, run_at = t.r FROM t WHERE j.queue_name = %(queue)s AND j.id = t.id",
        {"queue": queue, "id": first},
    )
    assert enqueue(conn, queue, {"rev": 2}, priority=3, **opts) == first
    conn.commit()
    job = shared_server.job(first)
    assert (job["payload"], job["priority"], job["status"]) == ({"rev": 2}, 3, "pending")
    assert at(job["run_at"]) == at(job["created_at"]) + timedelta(seconds=150) == at(job["debounce"]["run_by"])
    assert count(shared_db, queue) == 1


def test_an_http_and_an_sql_debounce_of_one_key_serialise_into_one_pending_job(
    shared_server: LiveServer, conn: psycopg.Connection, shared_db: psycopg.Connection, queue: str
) -> None:
    opts = {"key": "k", "seconds": 600}
    sql_id = enqueue(conn, queue, "from sql", debounce_key="k", debounce_seconds=600.0)  # holds the key's lock
    answers: list[httpx.Response] = []

    def over_http() -> None:
        with httpx.Client(base_url=shared_server.url, timeout=30) as c:
            answers.append(c.post(f"/queues/{queue}/jobs", json={"payload": "from http", "debounce": opts}))

    thread = threading.Thread(target=over_http)
    thread.start()

    def http_waits_for_the_lock() -> bool:
        row = shared_db.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
        return row is not None and row[0] > 0

    wait_until(http_waits_for_the_lock, what="the HTTP debounce to wait for the SQL one's lock")
    conn.commit()
    thread.join(30)
    [answer] = answers
    assert (answer.status_code, answer.headers["jobq-enqueued"], answer.json()["id"]) == (200, "replaced", sql_id)
    rows = shared_db.execute("SELECT id, payload, status FROM jobq.jobs WHERE queue_name = %s", (queue,)).fetchall()
    assert rows == [(sql_id, "from http", "pending")]


def test_depends_on_waits_and_is_released_when_the_parent_completes(
    shared_server: LiveServer, conn: psycopg.Connection, queue: str
) -> None:
    parent = shared_server.enqueue(queue, "parent")["id"]
    done = enqueue(conn, queue, "done first")
    conn.commit()
    completed = shared_server.claim(queue, limit=2)
    for claim in completed:
        if claim["id"] == done:
            shared_server.client.post(f"/jobs/{done}/complete", json={"claim_token": claim["claim_token"]})
    child = enqueue(conn, queue, "child", depends_on=[parent, done, parent])
    conn.commit()
    job = shared_server.job(child)
    assert (job["status"], job["depends_on"], job["pending_dependencies"]) == ("waiting", [parent, done], 1)
    token = next(c["claim_token"] for c in completed if c["id"] == parent)
    assert shared_server.client.post(f"/jobs/{parent}/complete", json={"claim_token": token}).status_code == 200
    wait_until(lambda: shared_server.job(child)["status"] == "pending", what="the child's release")
    assert claim_when_free(shared_server, queue)["id"] == child
    # A parent that failed for good cancels a job enqueued after it (on_dependency_failure: cancel).
    failed = enqueue(conn, queue, "doomed")
    conn.commit()
    claim = shared_server.claim_one(queue)
    shared_server.client.post(
        f"/jobs/{failed}/fail", json={"claim_token": claim["claim_token"], "error": "e", "retry": False}
    )
    doomed = enqueue(conn, queue, "after a failure", depends_on=[failed])
    runs = enqueue(conn, queue, "runs anyway", depends_on=[failed], on_dependency_failure="run")
    conn.commit()
    assert shared_server.job(doomed)["status"] == "cancelled"
    assert shared_server.job(doomed)["last_error"] == f"dependency {failed} failed"
    assert shared_server.job(runs)["status"] == "pending"


def test_a_batch_is_in_order_all_or_nothing_and_refers_to_its_items(
    shared_server: LiveServer, conn: psycopg.Connection, shared_db: psycopg.Connection, queue: str
) -> None:
    ids = enqueue_batch(
        conn,
        queue,
        [
            {"payload": 0, "ref": "extract", "priority": 2.0},
            {"payload": 1, "depends_on": ["extract"], "group": "g"},
            {"payload": 2, "depends_on": [{"ref": 0}, {"ref": 1}], "delay_seconds": 5},
        ],
    )
    conn.commit()
    assert ids == sorted(ids) and len(set(ids)) == 3
    jobs = [shared_server.job(i) for i in ids]
    assert [j["payload"] for j in jobs] == [0, 1, 2]
    assert [j["status"] for j in jobs] == ["pending", "waiting", "waiting"]
    assert (jobs[0]["priority"], jobs[1]["group"], jobs[2]["depends_on"]) == (2, "g", ids[:2])
    for items, field in [
        ([{"payload": 1}, {"payload": 2}, {"payload": 3, "priority": "high"}], "jobs[2].priority"),
        ([{"payload": 1}, {"payload": 2, "colour": "red"}], "jobs[1]"),
        ([{"payload": 1}, {"payload": 2, "depends_on": [{"ref": 1}]}], "jobs[1].depends_on.0"),
        ([{"payload": 1, "depends_on": [ids[0]]}, {"payload": 2, "unique": {}}], "jobs[1].unique"),
        (
            [{"payload": 1, "debounce": {"key": "k", "seconds": 1, "max_wait_seconds": None}}],
            "jobs[0].debounce.max_wait_seconds",
        ),
        ([{"payload": 1, "run_at": "tomorrow"}], "jobs[0].run_at"),
        ([], "jobs"),
    ]:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            enqueue_batch(conn, queue, items)
        assert caught.value.diag.column_name == field, (field, str(caught.value))
        conn.rollback()
    assert count(shared_db, queue) == 3
    # Unique and debounced items, as over HTTP: the same key twice names one job.
    made = enqueue_batch(
        conn,
        queue,
        [
            {"payload": "u", "unique": {"key": "u", "while": ["pending", "running"]}},
            {"payload": "u2", "unique": {"key": "u"}},
            {"payload": "d1", "debounce": {"key": "d", "seconds": 30}},
            {"payload": "d2", "debounce": {"key": "d", "seconds": 30}},
        ],
    )
    conn.commit()
    assert made[0] == made[1] and made[2] == made[3] and shared_server.job(made[2])["payload"] == "d2"


def test_the_producer_role_may_enqueue_and_nothing_else(url: str, shared_db: psycopg.Connection, queue: str) -> None:
    with psycopg.connect(url) as c:
        c.execute("SET ROLE jobq_producer")
        c.execute("CREATE TEMP TABLE jobs (id bigint, queue_name text)")  # found first, were pg_temp not pinned last
        job_id = enqueue(c, queue, "from the role")
        ids = enqueue_batch(c, queue, [{"payload": 1}])
        c.commit()
        for statement in [
            "SELECT * FROM {s}.jobs",
            "UPDATE {s}.jobs SET priority = 1",
            "DELETE FROM {s}.jobs",
            "SELECT * FROM {s}.queue_state",
            "INSERT INTO {s}.queue_state (queue_name) VALUES ('x')",
            "SELECT * FROM {s}.api_keys",
            "SELECT {s}.enqueue_job('q', '1', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
            "NULL, NULL, NULL, NULL, NULL, NULL, 0, 5)",
        ]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(statement.format(s=SCHEMA))
            c.rollback()
    assert count(shared_db, queue) == 2
    assert shared_db.execute("SELECT id FROM jobq.jobs WHERE queue_name = %s ORDER BY id", (queue,)).fetchall() == [
        (job_id,),
        (ids[0],),
    ]


def test_a_long_poll_claim_is_woken_by_the_commit_and_a_rollback_wakes_nothing(
    shared_server: LiveServer, conn: psycopg.Connection, queue: str
) -> None:
    messages = record_messages(shared_server)
    answered: list[tuple[float, list[dict[str, Any]]]] = []

    def long_poll() -> None:
        with httpx.Client(base_url=shared_server.url, timeout=60) as c:
            r = c.post(f"/queues/{queue}/claim", json={"worker": "w", "wait_seconds": 25})
            answered.append((time.monotonic(), r.json()["jobs"]))

    thread = threading.Thread(target=long_poll)
    thread.start()
    settle_long_poll(shared_server, queue)
    enqueue(conn, queue, "never")
    conn.rollback()
    job_id = enqueue(conn, queue, "hello")
    conn.commit()
    committed = time.monotonic()
    thread.join(60)
    [(when, jobs)] = answered
    assert [j["id"] for j in jobs] == [job_id]
    wait_until(lambda: f"sql w {queue}" in messages, what="the wake-up message")
    assert messages.count(f"sql w {queue}") == 1  # the rolled-back enqueue sent none
    report(f"SQL enqueue: commit -> long-poll claim answered in {(when - committed) * 1000:.1f} ms")


def test_every_process_hears_the_commit(
    shared_server: LiveServer, url: str, conn: psycopg.Connection, queue: str
) -> None:
    """Two processes (replicas) on the database, a claim parked on each: one commit wakes both, and each
    claim gets one of the two jobs."""
    other = LiveServer(make_settings(url)).start()
    try:
        answered: list[list[int]] = []

        def long_poll(server: LiveServer) -> None:
            with httpx.Client(base_url=server.url, timeout=60) as c:
                r = c.post(f"/queues/{queue}/claim", json={"worker": "w", "wait_seconds": 25})
                answered.append([j["id"] for j in r.json()["jobs"]])

        threads = [threading.Thread(target=long_poll, args=(s,)) for s in (shared_server, other)]
        for t in threads:
            t.start()
        settle_long_poll(shared_server, queue)
        settle_long_poll(other, queue)
        ids = [enqueue(conn, queue, "a"), enqueue(conn, queue, "b")]
        conn.commit()
        for t in threads:
            t.join(60)
        assert sorted(i for got in answered for i in got) == sorted(ids)
        assert all(len(got) == 1 for got in answered), answered  # each process's claim was woken
    finally:
        other.stop()


def test_a_malformed_message_on_the_channel_is_dropped_and_the_listener_stays(
    shared_server: LiveServer, shared_db: psycopg.Connection, queue: str
) -> None:
    """Any role that may connect may NOTIFY: ids int() refuses ("²", a digit for str.isdigit) are dropped, and
    the LISTEN connection (every message after them) stays."""
    wakeups = shared_server.services.wakeups
    connections = wakeups.connections
    messages = record_messages(shared_server)
    shared_db.execute(
        "SELECT pg_notify('jobq_wakeup', 'x d q ²'), pg_notify('jobq_wakeup', 'x p #²'),"
        " pg_notify('jobq_wakeup', 'x d q ' || repeat('9', 5000)), pg_notify('jobq_wakeup', %s)",
        (f"x w {queue}",),
    )
    wait_until(lambda: f"x w {queue}" in messages, what="the message sent after the malformed ones")
    assert wakeups.connections == connections  # not reconnected: nothing was lost around them


def test_a_delayed_job_is_claimed_when_due(
    shared_server: LiveServer, conn: psycopg.Connection, shared_db: psycopg.Connection, queue: str
) -> None:
    job_id = enqueue(conn, queue, "later", delay_seconds=3600.0)
    conn.commit()
    assert shared_server.claim(queue) == []  # not due for an hour
    # Its time comes (moved by hand, not waited for): the service finds it as it finds an HTTP delayed job.
    shared_db.execute("UPDATE jobq.jobs SET run_at = now() + interval '1 second' WHERE id = %s", (job_id,))
    assert [j["id"] for j in shared_server.claim(queue, wait_seconds=20)] == [job_id]


def test_debounce_refuses_a_repeatable_read_transaction(conn: psycopg.Connection, queue: str) -> None:
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="READ COMMITTED"):
        enqueue(conn, queue, 1, debounce_key="k", debounce_seconds=1.0)
    conn.rollback()
    assert enqueue(conn, queue, 1, unique_key="u") > 0  # other options take any isolation level
    conn.rollback()


def test_the_migrations_run_again_unchanged(url: str, conn: psycopg.Connection, queue: str) -> None:
    """0045 and the files that replace some of its functions since (0046: the Citus forms), in their order."""
    with psycopg.connect(url, autocommit=True) as again:
        again.execute("SET search_path = jobq, pg_temp")  # as the migration runner sets it
        for migration in load_migrations():
            if migration.own_schema:
                again.execute(migration.sql.encode())
    assert enqueue(conn, queue, 1) > 0
    conn.rollback()


def test_two_batches_naming_debounce_keys_in_crossed_orders_both_go_through(
    url: str, shared_db: psycopg.Connection, queue: str
) -> None:
    """Each batch takes all of its keys' locks first, in one order: no deadlock (40P01), whatever the items'
    order. Lined up as a reviewer did: a third session holds k3's lock until both batches wait."""
    errors: list[BaseException] = []
    made: dict[str, list[int]] = {}

    def batch(name: str, keys: list[str]) -> None:
        try:
            with psycopg.connect(url) as c:
                made[name] = enqueue_batch(
                    c, queue, [{"payload": f"{name}-{k}", "debounce": {"key": k, "seconds": 60}} for k in keys]
                )
                c.commit()
        except BaseException as exc:
            errors.append(exc)

    def waiting() -> int:
        row = shared_db.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
        assert row is not None
        return int(row[0])

    with psycopg.connect(url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s || '/' || 'k3', 24))", (queue,))
        threads = [
            threading.Thread(target=batch, args=("a", ["k1", "k3", "k2"])),
            threading.Thread(target=batch, args=("b", ["k2", "k3", "k1"])),
        ]
        for t in threads:
            t.start()
        wait_until(lambda: waiting() == 2, what="both batches waiting for a key's lock")
        holder.commit()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(set(made["a"])) == 3 and set(made["a"]) == set(made["b"])
    rows = shared_db.execute(
        "SELECT debounce_key, status FROM jobq.jobs WHERE queue_name = %s ORDER BY debounce_key", (queue,)
    ).fetchall()
    assert rows == [("k1", "pending"), ("k2", "pending"), ("k3", "pending")]


FUNCTIONS = [
    "enqueue(text, jsonb, integer, timestamptz, double precision, integer, text, text, integer, bigint[], text, "
    "boolean, text, integer, text[], text, double precision, double precision, text)",
    "enqueue_batch(text, jsonb, text)",
    "enqueue_job(text, jsonb, integer, timestamptz, double precision, integer, text, text, integer, bigint[], text, "
    "boolean, text, integer, text[], text, double precision, double precision, text, text, integer, integer)",
    "enqueue_queue(text)",
    "enqueue_item_field(jsonb, text, text, text)",
    "enqueue_check_quotas(text, boolean)",
    "enqueue_queue_live(text)",
    "enqueue_deeper_than(jsonb, integer)",
    "enqueue_check_label(text, text, bigint)",
    "enqueue_refuse(text, text, text)",
    "enqueue_limit(text)",
]


def test_each_function_pins_pg_catalog_first_and_is_marked_as_jobqs(shared_db: psycopg.Connection) -> None:
    for signature in FUNCTIONS:
        row = shared_db.execute(
            "SELECT p.proconfig, obj_description(p.oid, 'pg_proc') FROM pg_proc p WHERE p.oid = %s::regprocedure",
            (f"{SCHEMA}.{signature}",),
        ).fetchone()
        assert row is not None, signature
        assert row[0][0] == f"search_path=pg_catalog, {SCHEMA}, pg_temp", signature
        assert row[1] == "jobq: enqueue from SQL (docs/producers.md)", signature


def test_the_migration_refuses_to_replace_an_applications_function_and_leaves_other_signatures_alone(
    url: str,
) -> None:
    sql = (Path(__file__).parent.parent / "migrations" / "0045_sql_enqueue.sql").read_text()
    schema = f"app_{next(_names)}"
    with psycopg.connect(url) as c:  # one transaction, rolled back: nothing of it stays
        c.execute(f"CREATE SCHEMA {schema}")
        c.execute(f"SET LOCAL search_path = {schema}, pg_temp")  # as the migration runner sets it
        c.execute("SET LOCAL check_function_bodies = off")  # this schema has no jobq tables
        # The application's own: same name, other arguments (kept), then same name and arguments (refused).
        c.execute("CREATE FUNCTION enqueue(q text) RETURNS bigint LANGUAGE sql AS 'SELECT 1'")
        c.execute("SAVEPOINT before")
        c.execute(sql.encode())
        assert c.execute(
            "SELECT obj_description(%s::regprocedure, 'pg_proc'), proconfig FROM pg_proc WHERE oid = %s::regprocedure",
            (f"{schema}.enqueue(text)", f"{schema}.enqueue(text)"),
        ).fetchone() == (None, None)
        c.execute("ROLLBACK TO SAVEPOINT before")
        c.execute("CREATE FUNCTION enqueue_limit(name text) RETURNS bigint LANGUAGE sql AS 'SELECT 7'")
        with pytest.raises(psycopg.errors.DuplicateFunction, match="is not jobq's"):
            c.execute(sql.encode())
        c.rollback()


def test_a_producers_open_transaction_holds_up_no_complete_and_its_dependant_is_released_after_the_commit(
    server_factory: Any, database_url: str
) -> None:
    """The SQL path takes no lock on a parent that a complete waits for: a worker completes the parent while the
    producer's transaction is still open, and the dependant is released right after the commit (by the
    "sql d" message), not by the periodic reconciliation, which this server runs once at start only."""
    server: LiveServer = server_factory(dependency_reconcile_seconds=86400)
    releaser = server.services.maintenance["releaser"]
    wait_until(lambda: releaser._reconciled > -1e17, what="the reconciliation at start, before any job is made")
    queue = "sql-parents"

    def complete(job_id: int, token: str, answers: list[httpx.Response], answered: threading.Event) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            answers.append(c.post(f"/jobs/{job_id}/complete", json={"claim_token": token}))
        answered.set()

    # The parent completes before the dependant's commit (its transaction open meanwhile).
    parent = server.enqueue(queue, "parent")["id"]
    token = server.claim_one(queue)["claim_token"]
    answers: list[httpx.Response] = []
    answered = threading.Event()
    with psycopg.connect(database_url) as producer:
        child = enqueue(producer, queue, "child", depends_on=[parent])
        worker = threading.Thread(target=complete, args=(parent, token, answers, answered))
        worker.start()
        try:
            assert answered.wait(60), "the complete waited for the producer's transaction"
            assert producer.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        finally:
            producer.commit()
            worker.join(60)
    assert [a.status_code for a in answers] == [200]
    wait_until(lambda: server.job(child)["status"] == "pending", what="the dependant released after the commit")
    assert claim_when_free(server, queue)["id"] == child

    # The parent completes after the dependant's commit.
    later = server.enqueue(queue, "later parent")["id"]
    token = server.claim_one(queue)["claim_token"]
    with psycopg.connect(database_url) as producer:
        second = enqueue(producer, queue, "second child", depends_on=[later])
        producer.commit()
    assert server.job(second)["status"] == "waiting"
    r = server.client.post(f"/jobs/{later}/complete", json={"claim_token": token})
    assert r.status_code == 200, r.text
    wait_until(lambda: server.job(second)["status"] == "pending", what="the dependant released by the complete")
    assert claim_when_free(server, queue)["id"] == second

    # A batch's dependants, on an earlier item and on a job the batch does not make: one message names them.
    outside = server.enqueue(queue, "outside parent")["id"]
    with psycopg.connect(database_url) as producer:
        first, after_first, after_both = enqueue_batch(
            producer,
            queue,
            [
                {"payload": "first", "ref": "first"},
                {"payload": "after first", "depends_on": ["first"]},
                {"payload": "after both", "depends_on": ["first", outside]},
            ],
        )
        producer.commit()
    # Claimed until both are: right after the commit the service's marking of the parents (the "sql d"
    # message) holds their rows for a moment, and a claim, which skips locked rows, may pass over them.
    claims: list[dict[str, Any]] = []

    def both_claimed() -> bool:
        claims.extend(server.claim(queue, limit=10))
        return {c["id"] for c in claims} == {first, outside}

    wait_until(both_claimed, what="both parents claimed")
    for claim in claims:
        r = server.client.post(f"/jobs/{claim['id']}/complete", json={"claim_token": claim["claim_token"]})
        assert r.status_code == 200, r.text
    wait_until(
        lambda: [server.job(i)["status"] for i in (after_first, after_both)] == ["pending", "pending"],
        what="the batch's dependants released",
    )


def test_concurrent_sql_enqueues_with_dependencies_and_completes_of_their_parents_all_go_through(
    server: LiveServer, database_url: str
) -> None:
    """Producers' transactions enqueue dependants of jobs that workers complete meanwhile, and those completes
    release dependants of their own (the release takes the dependency rows, then counts dependants down), while
    an HTTP enqueue names the same parents. No side is cancelled as a deadlock (40P01; on Citus by the
    distributed deadlock detection: the release holds job_dependencies' one shard while it updates the parents,
    and an SQL enqueue holds its parents FOR KEY SHARE, which no such UPDATE waits for, while it waits for that
    shard), every complete answers 200, and every dependant is released once its parents have completed."""
    queue = "sql-crossed"
    rounds, producers = 6, 4
    errors: list[BaseException] = []
    children: list[int] = []

    def produce(parents: list[int], barrier: threading.Barrier, n: int) -> None:
        try:
            with psycopg.connect(database_url) as c:
                barrier.wait(30)
                children.append(enqueue(c, queue, {"child": n}, depends_on=parents))
                children.extend(
                    enqueue_batch(
                        c, queue, [{"payload": n, "depends_on": parents[:1]}, {"payload": n, "depends_on": parents}]
                    )
                )
                time.sleep(0.02)  # the transaction still open while the completes go on
                c.commit()
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    def produce_over_http(parents: list[int], barrier: threading.Barrier) -> None:
        # The HTTP path locks the parents FOR UPDATE (it marks them itself): it meets the producers' locks.
        try:
            with httpx.Client(base_url=server.url, timeout=60) as c:
                barrier.wait(30)
                r = c.post(f"/queues/{queue}/jobs", json={"payload": "http child", "depends_on": parents})
                assert r.status_code == 201, r.text
                children.append(r.json()["id"])
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    def complete_all(ids: list[int], barrier: threading.Barrier) -> None:
        try:
            with httpx.Client(base_url=server.url, timeout=60) as c:
                barrier.wait(30)
                left = set(ids)
                deadline = time.monotonic() + 60
                while left and time.monotonic() < deadline:
                    r = c.post(f"/queues/{queue}/claim", json={"worker": "w", "limit": 10})
                    assert r.status_code == 200, r.text
                    for job in r.json()["jobs"]:
                        done = c.post(f"/jobs/{job['id']}/complete", json={"claim_token": job["claim_token"]})
                        assert done.status_code == 200, done.text
                        left.discard(job["id"])
                assert not left, f"never claimed: {sorted(left)}"
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    for _ in range(rounds):
        # A grandparent and parents waiting for it: completing it releases the parents (their rows updated
        # under the release's hold on the dependency rows) while producers name those parents.
        grand = server.enqueue(queue, "grand")["id"]
        parents = [server.enqueue(queue, "parent", depends_on=[grand])["id"] for _ in range(3)]
        barrier = threading.Barrier(producers + 2)
        threads = [threading.Thread(target=produce, args=(parents, barrier, n)) for n in range(producers)]
        threads.append(threading.Thread(target=produce_over_http, args=(parents, barrier)))
        threads.append(threading.Thread(target=complete_all, args=([grand, *parents], barrier)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
    # Every parent has completed: every dependant is released (by the complete, or by the "sql d" message when
    # its parent completed before its commit), and perhaps claimed and completed by a later round's worker.
    assert len(children) == rounds * (producers * 3 + 1)
    wait_until(
        lambda: all(server.job(i)["status"] in ("pending", "completed") for i in children),
        timeout=60,
        what="every dependant released",
    )


def test_a_batch_past_a_statements_chunk_is_all_or_nothing_in_the_callers_transaction(
    shared_server: LiveServer, conn: psycopg.Connection, shared_db: psycopg.Connection, queue: str
) -> None:
    """enqueue_batch() of more jobs than one statement inserts on Citus (app/db/jobs.py CHUNK, 500): undone whole
    by a savepoint's rollback, refused whole by a bad last item, kept whole with the caller's commit, in order."""
    n = 600
    before = enqueue(conn, queue, "before")
    with pytest.raises(psycopg.errors.RaiseException), conn.transaction():  # a savepoint, rolled back
        assert len(enqueue_batch(conn, queue, [{"payload": i} for i in range(n)])) == n
        raise psycopg.errors.RaiseException("the business write failed")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught, conn.transaction():
        enqueue_batch(conn, queue, [*({"payload": i} for i in range(n - 1)), {"payload": 0, "priority": 40000}])
    assert caught.value.diag.column_name == f"jobs[{n - 1}].priority"
    # Keys out of order, one of them twice: ids in the batch's order all the same.
    jobs = [{"payload": i, **({"idempotency_key": f"k{n - i:04}"} if i % 3 else {})} for i in range(n)]
    jobs[n - 1] = {"payload": n - 1, "idempotency_key": jobs[1]["idempotency_key"]}
    ids = enqueue_batch(conn, queue, jobs)
    conn.commit()
    assert ids[n - 1] == ids[1] and ids[:-1] == sorted(ids[:-1]) and ids[0] > before
    assert count(shared_db, queue) == 1 + n - 1
    rows = shared_db.execute(
        "SELECT id, payload FROM jobq.jobs WHERE queue_name = %s AND id <> %s ORDER BY id", (queue, before)
    ).fetchall()
    assert [r[1] for r in rows] == list(range(n - 1))
