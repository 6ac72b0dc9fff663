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
    assert db.execute("SELECT count(*) FROM jobs").fetchone() == (0,)  # refused before the body was read
    assert calm.get("/queues").status_code == 200
    root = as_key(server, ENV_KEY)
    assert all(root.get("/queues").status_code == 200 for _ in range(10))


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
    searches admitted stay running until the test lets them go."""
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY, max_searches_per_key=2, max_searches=3)
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
        locker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
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
