"""Quotas that keep one tenant from hurting the others: a request rate per key, a client's share of the
requests in flight, the jobs not yet started per queue (max_pending), the number of queues, and searches at
once per key. Each refusal is a 429 (or 409) problem of its own type, and writes nothing."""

from __future__ import annotations

import os
import subprocess
import threading
from typing import Any

import httpx
import psycopg

from tests.processes import JOBQ
from tests.support import LiveServer, problem, wait_until
from tests.test_security import ENV_KEY, as_key, create_key
from tests.test_waiting import long_poll

# --- a request rate per key ------------------------------------------------------------------------------------

# A bucket that refills one request every 100 s: nothing refills while a test runs, however slow the machine.
SLOW_RATE = 0.01


def test_a_key_past_its_rate_gets_429_with_ratelimit_fields(server_factory: Any, db: psycopg.Connection) -> None:
    """JOBQ_KEY_RATE_PER_SECOND and _BURST: a token bucket per key. Past it, 429 `rate-limited` with Retry-After
    and the IETF RateLimit and RateLimit-Policy fields; another key, and JOBQ_API_KEY, are served as usual."""
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY, key_rate_per_second=SLOW_RATE, key_rate_burst=3)
    busy, calm = as_key(server, create_key(db, "busy", ["admin"])), as_key(server, create_key(db, "calm", ["admin"]))
    for _ in range(3):
        assert busy.get("/queues").status_code == 200
    r = busy.post("/queues/q/jobs", json={"payload": 1})
    body = problem(r, 429, "rate-limited")
    assert "3 at once" in body["detail"]
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["ratelimit-policy"] == '"key";q=3;w=300'
    assert r.headers["ratelimit"] == f'"key";r=0;t={r.headers["retry-after"]}'
    assert db.execute("SELECT count(*) FROM jobq.jobs").fetchone() == (0,)  # refused before the body was read
    assert calm.get("/queues").status_code == 200
    root = as_key(server, ENV_KEY)
    assert all(root.get("/queues").status_code == 200 for _ in range(10))


def test_the_rate_holds_on_workers_explain_and_scale_too(server_factory: Any, db: psycopg.Connection) -> None:
    """The listings and diagnostics any key may poll (GET /workers, /jobs/{id}/explain, /queues/{queue}/scale,
    the last by a `metrics` key too) count against the key's rate like every other route."""
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY, key_rate_per_second=SLOW_RATE, key_rate_burst=1)
    job = as_key(server, ENV_KEY).post("/queues/q/jobs", json={"payload": 1}).json()
    for n, (path, scope) in enumerate(
        (
            ("/workers", "admin"),
            (f"/jobs/{job['id']}/explain", "admin"),
            ("/queues/q/scale", "admin"),
            ("/queues/q/scale", "metrics"),
        )
    ):
        client = as_key(server, create_key(db, f"poller-{n}", [scope]))
        assert client.get(path).status_code == 200, path
        r = client.get(path)
        problem(r, 429, "rate-limited")
        assert int(r.headers["retry-after"]) >= 1


def test_a_key_has_a_rate_of_its_own_set_by_the_command(server_factory: Any, database_url: str) -> None:
    """`jobq keys create --rate --burst` and `jobq keys rate`: a key's own rate replaces the global one, at once
    in every process (the change is announced like a revocation)."""
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY)
    env = {**os.environ, "JOBQ_DATABASE_URL": database_url}

    def jobq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([JOBQ, "keys", *args], env=env, capture_output=True, text=True, timeout=60)

    made = jobq("create", "--name", "tenant", "--scope", "admin", "--rate", str(SLOW_RATE), "--burst", "2")
    assert made.returncode == 0, made.stderr
    tenant = as_key(server, made.stdout.strip())
    assert [tenant.get("/queues").status_code for _ in range(3)] == [200, 200, 429]
    listed = jobq("list")
    assert "0.01/s, burst 2" in listed.stdout, listed.stdout
    assert jobq("rate", "tenant", "--rate", "0").returncode == 0  # no limit
    wait_until(lambda: tenant.get("/queues").status_code == 200, what="the new rate reaching the server")
    assert all(tenant.get("/queues").status_code == 200 for _ in range(20))
    assert jobq("rate", "tenant", "--rate", "-1").returncode == 2
    assert jobq("rate", "nobody", "--default").returncode == 1


def test_without_keys_nothing_is_rate_limited(server_factory: Any) -> None:
    server: LiveServer = server_factory(key_rate_per_second=SLOW_RATE, key_rate_burst=1)
    assert all(server.client.get("/queues").status_code == 200 for _ in range(5))


# --- a client's share of the requests in flight ------------------------------------------------------------------


def test_one_client_cannot_hold_more_than_its_share_of_requests_in_flight(
    server_factory: Any, db: psycopg.Connection
) -> None:
    """JOBQ_MAX_CONNECTIONS_PER_CLIENT: a key with that many requests in flight (long-polls here, which its share
    of the waiting places would still allow) gets 429 `too-many-requests-in-flight` for one more, at once;
    another key is served; once its requests end, it is served again."""
    server: LiveServer = server_factory(
        auth="on", api_key=ENV_KEY, max_connections_per_client=2, max_waiters=20, max_waiters_per_client=10
    )
    hog, other = create_key(db, "hog", ["admin"]), create_key(db, "other", ["admin"])
    polls = [long_poll(server, hog) for _ in range(2)]
    wait_until(lambda: server.services.dispatcher.parked == 2, what="two long-polls waiting")
    body = problem(as_key(server, hog).get("/queues"), 429, "too-many-requests-in-flight")
    assert "2 requests in flight" in body["detail"]
    assert as_key(server, other).get("/queues").status_code == 200
    root = as_key(server, ENV_KEY)
    for _ in polls:
        assert root.post("/queues/q/jobs", json={"payload": 1}).status_code == 201
    assert all(answer().status_code == 200 for answer in polls)
    assert as_key(server, hog).get("/queues").status_code == 200


def test_without_a_key_the_share_is_the_client_address(server_factory: Any) -> None:
    server: LiveServer = server_factory(max_connections_per_client=1, max_waiters=4, max_waiters_per_client=4)
    poll = long_poll(server, None, wait=3)
    wait_until(lambda: server.services.dispatcher.parked == 1, what="a long-poll waiting")
    problem(server.client.get("/healthz"), 429, "too-many-requests-in-flight")
    assert poll().json()["jobs"] == []  # its deadline: the request ends
    assert server.client.get("/healthz").status_code == 200


# --- searches at once per key --------------------------------------------------------------------------------


def test_one_key_runs_at_most_its_share_of_searches_at_once(
    server_factory: Any, db: psycopg.Connection, database_url: str
) -> None:
    """The review's probe: 20 parallel searches by one key took the pool from another key's enqueues (p50 from
    2.2 ms to 117 ms). JOBQ_MAX_SEARCHES_PER_KEY (2) run at once per key; more are 429 `too-many-searches` at
    once, holding nothing, while another key's search still runs. Here the table is locked so that the
    searches admitted stay running until the test lets them go (their budget made longer than the test: one
    that ran out would free its place early)."""
    server: LiveServer = server_factory(
        auth="on", api_key=ENV_KEY, max_searches_per_key=2, max_searches=3, search_timeout_ms=120_000
    )
    greedy, other = create_key(db, "greedy", ["admin"]), create_key(db, "other", ["admin"])
    search = {"error_contains": "boom"}
    answers: list[tuple[str, int]] = []
    threads: list[threading.Thread] = []

    def send(who: str, key: str) -> None:
        def run() -> None:
            with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {key}"}, timeout=60) as c:
                answers.append((who, c.post("/jobs/search", json=search).status_code))

        threads.append(threading.Thread(target=run))
        threads[-1].start()

    def waiting_on_the_lock() -> int:
        row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()
        return int(row[0]) if row else 0

    with psycopg.connect(database_url, autocommit=False) as locker:
        locker.execute("LOCK TABLE jobq.jobs IN ACCESS EXCLUSIVE MODE")
        for _ in range(2):
            send("greedy", greedy)
        wait_until(lambda: waiting_on_the_lock() == 2, what="two searches running")
        with as_key(server, greedy) as c:
            for _ in range(3):
                body = problem(c.post("/jobs/search", json=search), 429, "too-many-searches")
                assert "JOBQ_MAX_SEARCHES_PER_KEY" in body["detail"]
        send("other", other)
        wait_until(lambda: waiting_on_the_lock() == 3, what="another key's search running")
        problem(as_key(server, ENV_KEY).post("/jobs/search", json=search), 429, "too-many-searches")  # all 3 taken
        locker.rollback()
    for t in threads:
        t.join(60)
    assert sorted(answers) == [("greedy", 200), ("greedy", 200), ("other", 200)]
    with as_key(server, greedy) as c:  # their places are free again
        assert c.post("/jobs/search", json=search).status_code == 200
        bulk = {"action": "retry", "dry_run": True, "filter": search}
        assert c.post("/jobs/bulk", json=bulk).status_code == 200


# --- jobs not yet started per queue (max_pending) ----------------------------------------------------------------


def pending_jobs(db: psycopg.Connection, queue: str) -> int:
    row = db.execute(
        "SELECT count(*) FROM jobq.jobs WHERE queue_name = %s AND status IN ('pending', 'waiting')", (queue,)
    )
    return int(row.fetchone()[0])  # type: ignore[index]


def test_a_queue_at_its_max_pending_refuses_enqueues_and_writes_nothing(
    server: LiveServer, db: psycopg.Connection
) -> None:
    """A runaway producer fills its own queue, not the table: past `max_pending` (queue config) an enqueue,
    single or batch, with dependencies or not, is 429 `queue-full` with Retry-After and writes nothing; delayed
    and waiting jobs count; once a worker has taken a job there is room again; other queues are untouched."""
    c = server.client
    r = c.patch("/queues/capped/config", json={"max_pending": 4})
    assert r.status_code == 200 and r.json()["max_pending"] == 4
    assert c.get("/queues/capped/config").json()["max_pending"] == 4
    first = server.enqueue("capped", 1)
    assert c.post("/queues/capped/jobs", json={"payload": 2, "delay_seconds": 3600}).status_code == 201
    assert c.post("/queues/capped/jobs", json={"payload": 3, "depends_on": [first["id"]]}).status_code == 201
    assert c.post("/queues/capped/jobs/batch", json={"jobs": [{"payload": 4}, {"payload": 5}]}).status_code == 429
    assert c.post("/queues/capped/jobs", json={"payload": 4}).status_code == 201
    for refused in (
        c.post("/queues/capped/jobs", json={"payload": 5}),
        c.post("/queues/capped/jobs/batch", json={"jobs": [{"payload": 5}]}),
        c.post("/queues/capped/jobs", json={"payload": 5, "depends_on": [first["id"]]}),
    ):
        body = problem(refused, 429, "queue-full")
        assert "max_pending" in body["detail"] and int(refused.headers["retry-after"]) >= 1
    assert pending_jobs(db, "capped") == 4
    assert server.enqueue("elsewhere", 1)["status"] == "pending"
    claimed = server.claim_one("capped")  # a worker takes one: room for one more
    assert c.post(f"/jobs/{claimed['id']}/complete", json={"claim_token": claimed["claim_token"]}).status_code == 200
    # A refusal counts again, at most ten times a second per queue: the room shows within a moment.
    wait_until(lambda: c.post("/queues/capped/jobs", json={"payload": 6}).status_code == 201, what="room again")
    problem(c.post("/queues/capped/jobs", json={"payload": 7}), 429, "queue-full")
    assert c.patch("/queues/capped/config", json={"max_pending": None}).json()["max_pending"] is None
    assert c.post("/queues/capped/jobs", json={"payload": 7}).status_code == 201  # back to the global default


def test_every_queue_has_a_default_max_pending_and_sqs_sends_are_held_to_it(
    server_factory: Any, db: psycopg.Connection
) -> None:
    """JOBQ_MAX_PENDING_JOBS holds every queue without a `max_pending` of its own; an SQS SendMessage past it
    is refused as SQS throttles (RequestThrottled), and writes nothing."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    server: LiveServer = server_factory(max_pending_jobs=3)
    assert (
        server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(3)]}).status_code == 201
    )
    problem(server.client.post("/queues/q/jobs", json={"payload": 3}), 429, "queue-full")
    assert server.client.patch("/queues/q/config", json={"max_pending": 5}).status_code == 200
    assert server.client.post("/queues/q/jobs", json={"payload": 3}).status_code == 201
    sqs = boto3.client(
        "sqs", endpoint_url=server.url, region_name="us-east-1", aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret", config=Config(retries={"max_attempts": 0}),
    )  # fmt: skip
    try:
        url = sqs.create_queue(QueueName="sqs-q")["QueueUrl"]
        for n in range(3):
            sqs.send_message(QueueUrl=url, MessageBody=f"m{n}")
        for send in (
            lambda: sqs.send_message(QueueUrl=url, MessageBody="over"),
            lambda: sqs.send_message(QueueUrl=url, MessageBody="over", MessageAttributes={
                "a": {"DataType": "String", "StringValue": "b"}}),
            lambda: sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "over"}]),
        ):  # fmt: skip
            try:
                answer = send()
            except ClientError as exc:
                assert exc.response["Error"]["Code"] == "RequestThrottled", exc.response
            else:  # a batch reports the refusal per entry
                assert [f["Code"] for f in answer["Failed"]] == ["RequestThrottled"], answer
    finally:
        sqs.close()
    assert pending_jobs(db, "sqs-q") == 3


def test_one_process_never_passes_a_limit_under_concurrent_enqueues(server: LiveServer, db: psycopg.Connection) -> None:
    """Its own enqueues are counted as they are admitted: 40 at once onto a queue with room for 15 make exactly
    15 jobs (with other processes enqueueing too, what they add within a count's interval may pass it)."""
    assert server.client.patch("/queues/q/config", json={"max_pending": 15}).status_code == 200
    statuses: list[int] = []

    def enqueue() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            statuses.append(c.post("/queues/q/jobs", json={"payload": 1}).status_code)

    threads = [threading.Thread(target=enqueue) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(statuses) == [201] * 15 + [429] * 25
    assert pending_jobs(db, "q") == 15


# --- the number of queues ----------------------------------------------------------------------------------------


def test_the_number_of_live_queues_is_capped(server_factory: Any, db: psycopg.Connection) -> None:
    """JOBQ_MAX_QUEUES: queues holding jobs not yet finished, or a configuration. An enqueue that would make one
    more is 409 `too-many-queues` and writes nothing; queues that exist take jobs as usual; once a queue has
    emptied, a new one may take its place."""
    server: LiveServer = server_factory(max_queues=3)
    assert server.client.patch("/queues/c/config", json={"max_attempts": 2}).status_code == 200  # a queue too
    for queue in ("a", "b"):
        server.enqueue(queue, 1)
    body = problem(server.client.post("/queues/d/jobs", json={"payload": 1}), 409, "too-many-queues")
    assert "JOBQ_MAX_QUEUES" in body["detail"]
    problem(server.client.post("/queues/d/jobs/batch", json={"jobs": [{"payload": 1}]}), 409, "too-many-queues")
    assert db.execute("SELECT count(*) FROM jobq.jobs WHERE queue_name = 'd'").fetchone() == (0,)
    assert server.client.post("/queues/a/jobs", json={"payload": 2}).status_code == 201
    assert server.client.post("/queues/c/jobs", json={"payload": 1}).status_code == 201
    job = server.claim_one("b")
    assert (
        server.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": job["claim_token"]}).status_code == 200
    )

    def d_accepted() -> bool:
        return server.client.post("/queues/d/jobs", json={"payload": 1}).status_code == 201

    wait_until(d_accepted, what="queue b, emptied, making room for d")  # counted again within an interval
    problem(server.client.post("/queues/e/jobs", json={"payload": 1}), 409, "too-many-queues")
