"""Workers claiming: order, limits, leases, disjoint concurrent claims, and long-polls."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from app.db import tokens
from tests.support import LiveServer, leave_while_waiting, problem, wait_until


def test_claim_order_is_priority_then_run_at_then_id(server: LiveServer) -> None:
    low = server.enqueue(payload="low", priority=-5)
    old = server.enqueue(payload="old", run_at="2001-01-01T00:00:00Z")
    a = server.enqueue(payload="a")
    b = server.enqueue(payload="b")
    high = server.enqueue(payload="high", priority=7)
    claimed = server.claim(limit=10)
    assert [c["id"] for c in claimed] == [high["id"], old["id"], a["id"], b["id"], low["id"]]


def test_claim_shape_and_lease(server: LiveServer, db: psycopg.Connection) -> None:
    job = server.enqueue(payload={"x": 1}, max_attempts=3, priority=2)
    before = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    c = server.claim_one(worker="w-1", lease_seconds=120)
    assert set(c) == {"id", "queue", "payload", "priority", "attempts", "max_attempts", "claim_token",
                      "lease_expires_at", "run_at", "created_at", "traceparent", "group"}  # fmt: skip
    assert c["traceparent"] is None  # the enqueue carried no trace context
    assert (c["id"], c["queue"], c["payload"], c["priority"]) == (job["id"], "q", {"x": 1}, 2)
    assert (c["attempts"], c["max_attempts"]) == (1, 3)
    assert len(c["claim_token"]) >= 22  # >= 128 bits, URL-safe base64
    lease = datetime.fromisoformat(c["lease_expires_at"])
    assert before + timedelta(seconds=119) < lease < before + timedelta(seconds=180)
    row = db.execute("SELECT status, locked_by, claim_token FROM jobq.jobs WHERE id = %s", (job["id"],)).fetchone()
    assert row == ("running", "w-1", c["claim_token"])
    assert server.job(job["id"])["worker"] == "w-1"


def test_default_lease(server: LiveServer, db: psycopg.Connection) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    row = db.execute("SELECT lease_expires_at - claimed_at FROM jobq.jobs WHERE id = %s", (c["id"],)).fetchone()
    assert row is not None and row[0] == timedelta(seconds=30)


def test_tokens_are_distinct(server: LiveServer) -> None:
    for i in range(50):
        server.enqueue(payload=i)
    tokens = [c["claim_token"] for c in server.claim(limit=50)]
    assert len(set(tokens)) == 50


@pytest.mark.parametrize("limits", [{}, {"rate": {"limit": 100, "per_seconds": 60}, "group_concurrency": 1}])
def test_tokens_name_their_queue(server: LiveServer, limits: dict[str, Any]) -> None:
    """A claim's token is 43 random characters, then its queue's name (app/db/tokens.py), URL-safe whatever
    the queue: the longest queue name makes a token that every write takes back (plain and limited claims)."""
    queue = "Q:" + "x.-_" * 31 + "yz"
    assert len(queue) == 128
    if limits:
        assert server.client.patch(f"/queues/{queue}/config", json=limits).status_code == 200
    ids = {server.enqueue(queue=queue, payload=i, group=f"g{i}")["id"] for i in range(3)}
    claimed = server.claim(queue=queue, limit=3)
    assert {c["id"] for c in claimed} == ids
    for c in claimed:
        token = c["claim_token"]
        assert len(token) == tokens.RANDOM_CHARS + 171 and token.endswith(tokens.queue_suffix(queue))
        assert tokens.queue_of(token) == queue
        r = server.client.post(f"/jobs/{c['id']}/heartbeat", json={"claim_token": token})
        assert r.status_code == 200, r.text
        r = server.client.post(f"/jobs/{c['id']}/complete", json={"claim_token": token, "result": 1})
        assert r.status_code == 200, r.text
    assert len({c["claim_token"][: tokens.RANDOM_CHARS] for c in claimed}) == 3


def test_claim_respects_limit_and_queue(server: LiveServer) -> None:
    for i in range(5):
        server.enqueue(payload=i)
    server.enqueue(queue="other", payload="x")
    assert server.claim(queue="empty") == []
    assert len(server.claim(limit=3)) == 3
    assert len(server.claim(limit=3)) == 2
    assert server.claim(limit=3) == []
    assert [c["payload"] for c in server.claim(queue="other")] == ["x"]


@pytest.mark.parametrize(
    "body",
    [
        {"worker": "w", "limit": 0},
        {"worker": "w", "limit": 101},
        {"worker": "w", "limit": "1"},
        {"worker": "w", "lease_seconds": 0},
        {"worker": "w", "lease_seconds": 43201},
        {"worker": "w", "lease_seconds": 1.5},
        {"worker": "w", "wait_seconds": 31},
        {"worker": "w", "wait_seconds": -1},
        {"worker": "w", "wait_seconds": "1"},
        {"worker": ""},
        {"worker": "x" * 256},
        {"worker": "tab\there"},
        {"limit": 1},
        {"worker": "w", "queue": "other"},
    ],
)
def test_bad_claims_are_422_and_claim_nothing(server: LiveServer, body: dict[str, Any]) -> None:
    job = server.enqueue(payload=1)
    problem(server.client.post("/queues/q/claim", json=body), 422, "validation-error")
    assert server.job(job["id"])["status"] == "pending"


def test_concurrent_claimers_get_disjoint_jobs(server: LiveServer, db: psycopg.Connection) -> None:
    """20 workers over 2,000 jobs: every job is claimed exactly once, no claim exceeds its limit."""
    r = server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(1000)]})
    assert r.status_code == 201
    r = server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(1000, 2000)]})
    assert r.status_code == 201
    claimed: list[list[int]] = [[] for _ in range(20)]
    over_limit: list[tuple[int, int]] = []

    async def worker(n: int, client: httpx.AsyncClient) -> None:
        rng = random.Random(n)
        empty = 0
        while empty < 3:
            limit = rng.randint(1, 10)
            r = await client.post("/queues/q/claim", json={"worker": f"w{n}", "limit": limit})
            assert r.status_code == 200, r.text
            jobs = r.json()["jobs"]
            if len(jobs) > limit:
                over_limit.append((limit, len(jobs)))
            empty = empty + 1 if not jobs else 0
            claimed[n].extend(j["id"] for j in jobs)

    async def main() -> None:
        limits = httpx.Limits(max_connections=40)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            await asyncio.gather(*(worker(n, client) for n in range(20)))

    asyncio.run(main())
    every = [i for ids in claimed for i in ids]
    assert not over_limit
    assert len(every) == 2000
    assert len(set(every)) == 2000
    assert sum(1 for ids in claimed if ids) > 1  # the work was really shared
    row = db.execute("SELECT count(*) FILTER (WHERE status = 'running' AND attempts = 1) FROM jobq.jobs").fetchone()
    assert row == (2000,)


# --- long-polls ---------------------------------------------------------------------------------------------


def test_long_poll_is_woken_by_an_enqueue(server_factory) -> None:  # type: ignore[no-untyped-def]
    # With the fallback poll at 60 s, only the in-process wake-up can deliver the job in time.
    server: LiveServer = server_factory(poll_interval_seconds=60)
    result: dict[str, Any] = {}

    def poll() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            start = time.monotonic()
            r = c.post("/queues/q/claim", json={"worker": "w", "wait_seconds": 20})
            result["elapsed"] = time.monotonic() - start
            result["jobs"] = r.json()["jobs"]

    t = threading.Thread(target=poll)
    t.start()
    wait_until(lambda: server.services.dispatcher.parked == 1, what="the claim parking")
    job = server.enqueue(payload="hello")
    t.join()
    assert [j["id"] for j in result["jobs"]] == [job["id"]]
    assert result["elapsed"] < 20  # answered by the wake-up, not by the deadline


def test_long_poll_returns_empty_at_the_deadline(server: LiveServer) -> None:
    start = time.monotonic()
    jobs = server.claim(wait_seconds=0.5)
    assert jobs == []
    assert time.monotonic() - start >= 0.5  # never early
    assert server.services.dispatcher.parked == 0


def test_long_poll_across_processes(server_factory) -> None:  # type: ignore[no-untyped-def]
    """A job enqueued through one instance wakes a long-poll waiting on another (LISTEN/NOTIFY)."""
    a: LiveServer = server_factory(poll_interval_seconds=60)
    b: LiveServer = server_factory(poll_interval_seconds=60)
    wait_until(
        lambda: a.services.wakeups.connected.is_set() and b.services.wakeups.connected.is_set(), what="listening"
    )
    answer = a.claim_in_background(wait_seconds=20)
    wait_until(lambda: a.services.dispatcher.parked == 1, what="the claim parking")
    wait_until(lambda: b.services.wakeups.remote_waiters("q"), what="b learning that a waits on q")
    sent = b.services.wakeups.sent
    job = b.enqueue(payload="cross")
    assert [j["id"] for j in answer()] == [job["id"]]
    # The wake-up went over NOTIFY. b counts a message once pg_notify has returned, which can be after a
    # already received it, claimed and answered: wait for the count rather than read it once.
    wait_until(lambda: b.services.wakeups.sent > sent, what="b counting the NOTIFY it sent")


def test_no_wake_up_is_sent_when_nobody_waits_elsewhere(server_factory) -> None:  # type: ignore[no-untyped-def]
    a: LiveServer = server_factory()
    b: LiveServer = server_factory()
    wait_until(
        lambda: a.services.wakeups.connected.is_set() and b.services.wakeups.connected.is_set(), what="listening"
    )
    wait_until(lambda: a.services.wakeups.idle(), what="a's hello going out")
    sent = a.services.wakeups.sent
    for i in range(20):
        a.enqueue(payload=i)
    # publish() runs inside the enqueue request, so a wake-up would be queued (or on its way) by now.
    wait_until(lambda: a.services.wakeups.idle(), what="a's sender settling")
    assert a.services.wakeups.sent == sent


def test_delayed_job_reaches_a_waiting_worker_by_the_fallback_poll(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(poll_interval_seconds=0.1)
    job = server.enqueue(payload="soon", delay_seconds=0.3)
    jobs = server.claim(wait_seconds=20)
    assert [j["id"] for j in jobs] == [job["id"]]


def test_waiting_long_polls_hold_no_connections(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(pool_max_size=4, poll_interval_seconds=60)
    results: list[list[dict[str, Any]]] = []

    async def poll(client: httpx.AsyncClient, n: int) -> None:
        r = await client.post("/queues/q/claim", json={"worker": f"w{n}", "wait_seconds": 25})
        results.append(r.json()["jobs"])

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=httpx.Limits(max_connections=60)) as c:
            polls = [asyncio.create_task(poll(c, n)) for n in range(50)]
            while server.services.dispatcher.parked < 50:
                await asyncio.sleep(0.01)

            # 50 requests wait on a pool of at most 4 connections: they cannot be holding any. The pool
            # goes idle (background statements such as the presence NOTIFY are brief) while all 50 wait.
            def idle() -> bool:
                stats = server.services.db.pool.get_stats()
                busy = db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'jobq' AND state <> 'idle'"
                ).fetchone()
                return stats["pool_size"] == stats["pool_available"] and busy == (0,)

            deadline = time.monotonic() + 20
            while not idle():
                assert time.monotonic() < deadline, "the pool never went idle while long-polls waited"
                await asyncio.sleep(0.02)
            assert server.services.dispatcher.parked == 50
            r = await c.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(50)]})
            assert r.status_code == 201
            await asyncio.gather(*polls)

    asyncio.run(main())
    assert sorted(len(r) for r in results) == [1] * 50
    assert len({r[0]["id"] for r in results}) == 50


def test_waiter_cap_answers_429(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_waiters=3, max_waiters_per_client=3, poll_interval_seconds=60)

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            # The three wait long enough that none can give up before the fourth arrives on a slow machine;
            # jobs end them below.
            polls = [
                asyncio.create_task(c.post("/queues/q/claim", json={"worker": "w", "wait_seconds": 20}))
                for _ in range(3)
            ]
            while server.services.dispatcher.parked < 3:
                await asyncio.sleep(0.01)
            r = await c.post("/queues/q/claim", json={"worker": "w", "wait_seconds": 2})
            body = problem(r, 429, "too-many-waiters")
            assert r.headers["retry-after"] == "1"
            assert body["status"] == 429
            # A claim that does not wait is still served.
            assert (await c.post("/queues/q/claim", json={"worker": "w"})).status_code == 200
            r = await c.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(3)]})
            assert r.status_code == 201, r.text
            answers = await asyncio.gather(*polls)
            assert sorted(len(a.json()["jobs"]) for a in answers) == [1, 1, 1]

    asyncio.run(main())
    assert server.services.dispatcher.parked == 0


def test_a_long_poll_whose_client_left_claims_nothing(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(poll_interval_seconds=60)
    leave_while_waiting(server, "POST", "/queues/q/claim", {"worker": "gone", "wait_seconds": 25},
                        lambda: server.services.dispatcher.parked == 1, "the long-poll to park")  # fmt: skip
    wait_until(lambda: server.services.dispatcher.parked == 0, what="the departed waiter being dropped")
    job = server.enqueue(payload="for someone alive")
    time.sleep(0.2)
    after = server.job(job["id"])
    assert (after["status"], after["attempts"]) == ("pending", 0)
    assert server.claim_one()["id"] == job["id"]


def test_listener_reconnects_by_itself(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    a: LiveServer = server_factory(poll_interval_seconds=60)
    b: LiveServer = server_factory(poll_interval_seconds=60)
    wait_until(
        lambda: a.services.wakeups.connected.is_set() and b.services.wakeups.connected.is_set(), what="listening"
    )
    killed = db.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = 'jobq-listener'"
    ).fetchone()
    assert killed == (2,)
    wait_until(lambda: a.services.wakeups.connections == 2 and b.services.wakeups.connections == 2, what="relistening")
    answer = a.claim_in_background(wait_seconds=20)
    wait_until(lambda: b.services.wakeups.remote_waiters("q"), what="b learning that a waits on q")
    job = b.enqueue(payload="after the reconnect")
    assert [j["id"] for j in answer()] == [job["id"]]


# --- results handed in on the next claim (one request per job) ------------------------------------------------


def test_a_claim_completes_the_jobs_it_hands_in_first(server: LiveServer, db: psycopg.Connection) -> None:
    a, b, c = (server.enqueue(payload=n) for n in range(3))
    first = server.claim(limit=2)
    r = server.client.post(
        "/queues/q/claim",
        json={
            "worker": "w",
            "complete": [
                {"id": first[0]["id"], "claim_token": first[0]["claim_token"], "result": {"ok": 1}},
                {"id": first[1]["id"], "claim_token": "not-the-token"},
                {"id": 10**12, "claim_token": "nobody"},
            ],
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    # Each item has its outcome, in order; a refused one does not stop the claim.
    assert body["completed"] == [
        {"id": first[0]["id"], "outcome": "completed", "status": "completed"},
        {"id": first[1]["id"], "outcome": "claim_lost", "status": "running"},
        {"id": 10**12, "outcome": "not_found", "status": None},
    ]
    assert [j["id"] for j in body["jobs"]] == [c["id"]]
    rows = dict(db.execute("SELECT id, status FROM jobq.jobs").fetchall())
    assert rows == {a["id"]: "completed", b["id"]: "running", c["id"]: "running"}
    assert db.execute("SELECT result FROM jobq.jobs WHERE id = %s", (a["id"],)).fetchone() == ({"ok": 1},)
    # A repeat with the same token is a success, as a retried complete is.
    again = server.client.post(
        "/queues/q/claim", json={"worker": "w", "complete": [{"id": a["id"], "claim_token": first[0]["claim_token"]}]}
    )
    assert again.json() == {"jobs": [], "completed": [{"id": a["id"], "outcome": "completed", "status": "completed"}]}


def test_completes_handed_in_are_kept_when_the_claim_waits_and_finds_nothing(server: LiveServer) -> None:
    job = server.enqueue(payload=1)
    c = server.claim_one()
    answer = server.claim_in_background(wait_seconds=0.5, complete=[{"id": c["id"], "claim_token": c["claim_token"]}])
    # Committed before the long-poll waits: visible while it waits, answered at its deadline.
    wait_until(lambda: server.job(job["id"])["status"] == "completed", what="the handed-in complete")
    assert answer() == []


def test_a_claim_with_a_result_it_cannot_take_changes_nothing(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_result_bytes=1024, max_batch_complete=2)
    for n in range(3):
        server.enqueue(payload=n)
    claims = server.claim(limit=3)
    items = [{"id": c["id"], "claim_token": c["claim_token"]} for c in claims]
    body = problem(
        server.client.post("/queues/q/claim", json={"worker": "w", "complete": [{**items[0], "result": "x" * 2000}]}),
        422,
        "validation-error",
    )
    assert body["errors"][0]["loc"] == ["body", "complete", 0, "result"]
    problem(server.client.post("/queues/q/claim", json={"worker": "w", "complete": items}), 422, "validation-error")
    assert db.execute("SELECT DISTINCT status FROM jobq.jobs").fetchall() == [("running",)]


def test_handed_in_completes_keep_to_the_keys_queues(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """A key limited to queue `a` hands in a job of queue `b` (its id and token leaked): not found, as a
    complete of it would be, and the job stays running."""
    from app.auth.keys import new_key
    from app.db import keys as store_keys

    server: LiveServer = server_factory(auth="on", api_key="k" * 40)
    admin = {"Authorization": "Bearer " + "k" * 40}
    key, selector, key_hash = new_key()
    store_keys.api_key_insert(db, "a-worker", selector, key_hash, ["consume"], ["a"])
    for queue in ("a", "b"):
        assert server.client.post(f"/queues/{queue}/jobs", json={"payload": 1}, headers=admin).status_code == 201
    other = server.client.post("/queues/b/claim", json={"worker": "w"}, headers=admin).json()["jobs"][0]
    r = server.client.post(
        "/queues/a/claim",
        json={"worker": "w", "complete": [{"id": other["id"], "claim_token": other["claim_token"]}]},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["completed"] == [{"id": other["id"], "outcome": "not_found", "status": None}]
    assert db.execute("SELECT status FROM jobq.jobs WHERE id = %s", (other["id"],)).fetchone() == ("running",)
