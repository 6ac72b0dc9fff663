"""Long-polls that wait: fair shares of the waiting places, a wait that rides out a dropped database
connection, and a key checked again before a request that waited receives jobs (app/core/dispatcher.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest

from app.auth.keys import new_key
from app.core.effects import Moves, Path
from app.core.wakeups import RENEW_INTERVAL
from app.db import keys as store_keys
from tests.support import LiveServer, problem, record_wakeups, settle_long_poll, wait_until

ENV_KEY = "container-key-" + "k" * 40


def create_key(db: psycopg.Connection, name: str, scopes: list[str]) -> str:
    key, selector, key_hash = new_key()
    store_keys.api_key_insert(db, name, selector, key_hash, scopes, None)
    return key


_threads: list[threading.Thread] = []


@pytest.fixture(autouse=True)
def _join_threads() -> Iterator[None]:
    yield
    while _threads:
        _threads.pop().join(60)


def long_poll(server: LiveServer, key: str | None, queue: str = "q", wait: int = 20) -> Callable[[], httpx.Response]:
    """A claim waiting up to `wait` seconds, on its own connection and thread; returns what waits for its answer."""
    answers: list[httpx.Response] = []
    headers = {"authorization": f"Bearer {key}"} if key else {}

    def run() -> None:
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as c:
            answers.append(c.post(f"/queues/{queue}/claim", json={"worker": "w", "wait_seconds": wait}))

    thread = threading.Thread(target=run)
    thread.start()
    _threads.append(thread)

    def answer() -> httpx.Response:
        thread.join(60)
        return answers[0]

    return answer


def as_key(server: LiveServer, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {key}"}, timeout=30)


# --- fair shares -------------------------------------------------------------------------------------------------


def test_one_key_cannot_take_every_waiting_place(server_factory: Any, db: psycopg.Connection) -> None:
    """Key B asks for more long-polls than its share: past its share it gets 429 at once, and key A's
    long-poll still waits and receives the next job."""
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY, max_waiters=4, max_waiters_per_client=2,
                                        poll_interval_seconds=60)  # fmt: skip
    key_a, key_b = create_key(db, "a", ["consume"]), create_key(db, "b", ["consume"])
    dispatcher = server.services.dispatcher
    b_polls = [long_poll(server, key_b) for _ in range(2)]
    wait_until(lambda: dispatcher.parked == 2, what="B's two long-polls waiting")
    with as_key(server, key_b) as b:
        for _ in range(2):
            body = problem(b.post("/queues/q/claim", json={"worker": "w", "wait_seconds": 20}), 429, "too-many-waiters")
            assert "share" in body["detail"]
        assert b.post("/queues/q/claim", json={"worker": "w"}).status_code == 200  # not waiting: not counted
    a_poll = long_poll(server, key_a, queue="a-only")
    wait_until(lambda: dispatcher.parked == 3, what="A's long-poll waiting")
    with as_key(server, ENV_KEY) as admin:
        job = admin.post("/queues/a-only/jobs", json={"payload": "for A"}).json()
        r = a_poll()
        assert r.status_code == 200 and [j["id"] for j in r.json()["jobs"]] == [job["id"]]
        for _ in b_polls:
            admin.post("/queues/q/jobs", json={"payload": "for B"})
    assert all(answer().status_code == 200 for answer in b_polls)


def test_with_auth_off_the_share_is_per_client_address(server_factory: Any) -> None:
    server: LiveServer = server_factory(max_waiters=4, max_waiters_per_client=1, poll_interval_seconds=60)
    first = long_poll(server, None)
    wait_until(lambda: server.services.dispatcher.parked == 1, what="a long-poll waiting")
    problem(server.client.post("/queues/q/claim", json={"worker": "w", "wait_seconds": 5}), 429, "too-many-waiters")
    server.enqueue()
    assert first().json()["jobs"]


def test_waits_for_results_count_against_the_clients_share(server_factory: Any) -> None:
    """GET /jobs/{id}?wait_seconds takes a waiting place like a long-poll claim, and from the same share: one
    client cannot take every place with waits for results either."""
    server: LiveServer = server_factory(max_waiters=4, max_waiters_per_client=1, poll_interval_seconds=60)
    job = server.enqueue(queue="other", payload=1)
    answers: list[httpx.Response] = []

    def wait() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            answers.append(c.get(f"/jobs/{job['id']}", params={"wait_seconds": 20}))

    thread = threading.Thread(target=wait)
    thread.start()
    _threads.append(thread)
    wait_until(lambda: server.services.results.parked == 1, what="a wait for a result")
    body = problem(server.client.get(f"/jobs/{job['id']}", params={"wait_seconds": 5}), 429, "too-many-waiters")
    assert "share" in body["detail"]
    problem(server.client.post("/queues/q/claim", json={"worker": "w", "wait_seconds": 5}), 429, "too-many-waiters")
    claim = server.claim_one(queue="other")
    server.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": claim["claim_token"]})
    thread.join(60)
    assert answers[0].json()["status"] == "completed"
    assert server.services.dispatcher.cap.taken == 0 and server.services.dispatcher.cap.by_client == {}


# --- a dropped database connection --------------------------------------------------------------------------------


def terminate_jobq_sessions(db: psycopg.Connection) -> int:
    """pg_terminate_backend on every session of the service (pool and listener), as a failover would."""
    rows = db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name LIKE 'jobq%'"
    ).fetchall()
    return len(rows)


def test_a_waiting_long_poll_rides_out_a_dropped_connection(server_factory: Any, db: psycopg.Connection) -> None:
    """Every connection of the service is terminated while a 20 s long-poll waits. The listener reconnects
    and looks at the queue again, on one of the pool's idle connections, all dead: the long-poll must keep
    waiting, and be answered by the next enqueue."""
    server: LiveServer = server_factory(pool_min_size=4)
    wait_until(lambda: server.services.db.pool.get_stats()["pool_available"] >= 4, what="4 idle pooled connections")
    answer = long_poll(server, None, wait=20)
    settle_long_poll(server)
    assert terminate_jobq_sessions(db) >= 2  # the pool's and the listener's
    wait_until(lambda: server.services.wakeups.connections >= 2, what="the listener reconnecting")
    wait_until(lambda: server.services.dispatcher.settled("q"), what="the claims of the reconnect to run")

    job: dict[str, Any] = {}

    def enqueued() -> bool:  # a producer retries a 503, as the SDKs do
        r = server.client.post("/queues/q/jobs", json={"payload": "after the drop"})
        job.update(r.json() if r.status_code == 201 else {})
        return r.status_code == 201

    wait_until(enqueued, what="an enqueue to succeed")
    r = answer()
    assert r.status_code == 200, r.text
    assert [j["id"] for j in r.json()["jobs"]] == [job["id"]]


# --- a key revoked while its long-poll waits -------------------------------------------------------------------------


def test_a_key_revoked_while_its_long_poll_waits_receives_nothing(server_factory: Any, db: psycopg.Connection) -> None:
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY, auth_cache_seconds=3600)
    wait_until(lambda: server.services.wakeups.connected.is_set(), what="listening")
    key = create_key(db, "worker", ["consume"])
    answer = long_poll(server, key)
    settle_long_poll(server)
    generation = server.services.keys.generation
    store_keys.api_key_revoke(db, "worker")  # its NOTIFY empties every process's key cache
    wait_until(lambda: server.services.keys.generation > generation, what="the revocation to arrive")
    with as_key(server, ENV_KEY) as admin:
        job = admin.post("/queues/q/jobs", json={"payload": "not for a revoked key"}).json()
        body = problem(answer(), 401, "unauthorized")
        assert "revoked" in body["detail"]
        wait_until(lambda: admin.get(f"/jobs/{job['id']}").json()["status"] == "pending", what="the job back")
        assert admin.get(f"/jobs/{job['id']}").json()["attempts"] == 0
        claimed = admin.post("/queues/q/claim", json={"worker": "w"}).json()["jobs"]
        assert [j["id"] for j in claimed] == [job["id"]]


def test_a_job_taken_back_from_a_revoked_key_wakes_the_next_waiting_claim(
    server_factory: Any, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job handed to a long-poll whose key was revoked goes back to the queue; a claim waiting behind it is
    woken by that release at once, not at the next presence renewal's look. (The enqueue may have handed the job
    to the first claim in its own transaction, which wakes nobody, or woken the line: either way the release's
    own wake-up is the one looked for.)"""
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY, auth_cache_seconds=3600, poll_interval_seconds=60)
    wait_until(lambda: server.services.wakeups.connected.is_set(), what="listening")
    key = create_key(db, "worker", ["consume"])
    other = create_key(db, "other", ["consume"])
    first = long_poll(server, key)
    settle_long_poll(server)
    second = long_poll(server, other)
    wait_until(lambda: server.services.dispatcher.parked == 2, what="both claims waiting")
    generation = server.services.keys.generation
    store_keys.api_key_revoke(db, "worker")
    wait_until(lambda: server.services.keys.generation > generation, what="the revocation to arrive")
    woken = record_wakeups(server)
    effects = server.services.dispatcher.effects
    apply = effects.apply
    released: list[bool] = []  # per hand-back of the dispatcher: whether it woke the queue's claims

    def spy(moves: Moves) -> None:
        before = len(woken)
        apply(moves)
        if moves.path == Path.HAND_BACK:
            released.append(any("q" in w for w in woken[before:]))

    monkeypatch.setattr(effects, "apply", spy)
    with as_key(server, ENV_KEY) as admin:
        job = admin.post("/queues/q/jobs", json={"payload": "for whoever may have it"}).json()
    problem(first(), 401, "unauthorized")
    wait_until(lambda: released == [True], what="the release to wake the waiting claim")
    r = second()
    assert r.status_code == 200, r.text
    assert [j["id"] for j in r.json()["jobs"]] == [job["id"]]


def test_a_key_revoked_while_it_waits_for_a_result_gets_401(server_factory: Any, db: psycopg.Connection) -> None:
    """GET /jobs/{id}?wait_seconds, like a long-poll claim, checks its key again before answering a request
    that waited: a key revoked meanwhile gets 401, not the job's result."""
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY, auth_cache_seconds=3600)
    wait_until(lambda: server.services.wakeups.connected.is_set(), what="listening")
    key = create_key(db, "producer", ["produce"])
    with as_key(server, key) as producer:
        job = producer.post("/queues/q/jobs", json={"payload": "x"}).json()
    answers: list[httpx.Response] = []

    def wait() -> None:
        with as_key(server, key) as c:
            answers.append(c.get(f"/jobs/{job['id']}", params={"wait_seconds": 20}))

    thread = threading.Thread(target=wait)
    thread.start()
    _threads.append(thread)
    wait_until(lambda: server.services.results.parked == 1, what="the wait parked")
    generation = server.services.keys.generation
    store_keys.api_key_revoke(db, "producer")
    wait_until(lambda: server.services.keys.generation > generation, what="the revocation to arrive")
    with as_key(server, ENV_KEY) as admin:
        claim = admin.post("/queues/q/claim", json={"worker": "w"}).json()["jobs"][0]
        done = {"claim_token": claim["claim_token"], "result": "not for a revoked key"}
        assert admin.post(f"/jobs/{job['id']}/complete", json=done).status_code == 200
    thread.join(60)
    body = problem(answers[0], 401, "unauthorized")
    assert "revoked" in body["detail"] and "not for a revoked key" not in answers[0].text
    assert server.services.dispatcher.cap.taken == 0


# --- idle queues cost nothing -------------------------------------------------------------------------------------


class CountingDatabase:
    """The dispatcher's database, counting the connections its statements take (one a statement: every claim,
    release and look of the dispatcher takes its own)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.taken = 0

    def connection(self, timeout: float | None = None) -> Any:
        self.taken += 1
        return self.db.connection(timeout)


def settle_all(server: LiveServer, queues: list[str]) -> None:
    wakeups, dispatcher = server.services.wakeups, server.services.dispatcher
    wait_until(
        lambda: wakeups.idle() and all(wakeups.announced(q) and dispatcher.settled(q) for q in queues),
        what=f"the long-polls on {len(queues)} queues to settle",
    )


def test_a_fallback_poll_over_many_idle_queues_is_one_statement(
    server_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fifty claims parked on fifty empty queues: a pass of the fallback poll asks the database once which of
    them have a job ready, not once a queue (one queue per tenant must not cost a statement per tenant per
    second)."""
    monkeypatch.setattr("app.maintenance.listener.RENEW_INTERVAL", 3600.0)  # no presence renewal looks too
    server: LiveServer = server_factory(poll_interval_seconds=60)  # the passes are run by hand
    queues = [f"tenant-{i}" for i in range(50)]
    answers = [long_poll(server, None, queue=q, wait=30) for q in queues]
    dispatcher, wakeups = server.services.dispatcher, server.services.wakeups
    wait_until(lambda: dispatcher.parked == len(queues), what="fifty long-polls waiting")
    settle_all(server, queues)
    poll = server.services.maintenance["poll"]
    counting = CountingDatabase(dispatcher.db)
    dispatcher.db = counting
    sent, passes = wakeups.sent, 3
    for _ in range(passes):
        server.run(poll.run_once)
    settle_all(server, queues)
    assert wakeups.sent == sent  # nothing else looked meanwhile
    assert counting.taken == passes
    # A presence renewal announces the fifty queues again and looks once more for jobs enqueued elsewhere
    # before the announcement arrived: one statement too. Only announcements older than the renewal
    # interval are renewed, so that much time must pass first.
    time.sleep(RENEW_INTERVAL)
    counting.taken = 0
    server.loop.call_soon_threadsafe(wakeups.renew)
    wait_until(lambda: wakeups.sent > sent, what="the renewal sent")
    settle_all(server, queues)
    assert counting.taken == 1
    assert dispatcher.parked == len(queues)  # nobody was answered: there was nothing to claim
    first = server.enqueue(queue=queues[7], payload="for tenant 7")
    assert [j["id"] for j in answers[7]().json()["jobs"]] == [first["id"]]
    for q in queues[:7] + queues[8:]:
        server.enqueue(queue=q)
    assert all(len(answer().json()["jobs"]) == 1 for answer in answers)


def test_a_job_no_wake_up_announced_is_found_by_the_fallback_poll(server_factory: Any, db: psycopg.Connection) -> None:
    """Jobs written behind jobq's back (no statement of jobq, so no wake-up at all) still reach a waiting claim
    within a poll interval: a job ready below a crowd of delayed higher-priority ones, and one whose queue
    is resumed by SQL."""
    server: LiveServer = server_factory(poll_interval_seconds=0.1)
    idle = [long_poll(server, None, queue=f"idle-{i}", wait=30) for i in range(5)]
    crowd = long_poll(server, None, queue="crowd", wait=20)
    wait_until(lambda: server.services.dispatcher.parked == 6, what="the long-polls waiting")
    settle_long_poll(server, "crowd")
    db.execute(
        "INSERT INTO jobq.jobs (queue_name, payload, priority, run_at)"
        " SELECT 'crowd', '1', 5, now() + interval '1 hour' FROM generate_series(1, 200)"
    )
    ready = db.execute("INSERT INTO jobq.jobs (queue_name, payload) VALUES ('crowd', '2') RETURNING id").fetchone()
    assert ready is not None
    r = crowd()
    assert r.status_code == 200 and [j["id"] for j in r.json()["jobs"]] == [ready[0]]

    server.client.post("/queues/paused/pause")
    job = server.enqueue(queue="paused", payload=3)
    resumed = long_poll(server, None, queue="paused", wait=20)
    wait_until(lambda: server.services.dispatcher.parked == 6, what="a long-poll waiting on the paused queue")
    settle_long_poll(server, "paused")
    db.execute("UPDATE jobq.queue_state SET paused = false WHERE queue_name = 'paused'")
    r = resumed()
    assert r.status_code == 200 and [j["id"] for j in r.json()["jobs"]] == [job["id"]]
    for i in range(5):
        server.enqueue(queue=f"idle-{i}")
    assert all(len(answer().json()["jobs"]) == 1 for answer in idle)
