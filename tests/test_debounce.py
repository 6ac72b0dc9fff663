"""Debounced enqueues: `debounce: {key, seconds, max_wait_seconds?}` (docs/producers.md)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from tests.support import LiveServer, problem


def count_jobs(db: psycopg.Connection) -> int:
    row = db.execute("SELECT count(*) FROM jobq.jobs").fetchone()
    assert row is not None
    return int(row[0])


def post(server: LiveServer, body: dict[str, Any], queue: str = "q") -> httpx.Response:
    return server.client.post(f"/queues/{queue}/jobs", json=body)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_a_second_enqueue_replaces_the_pending_job_and_moves_it_later(server: LiveServer) -> None:
    opts = {"key": "reindex-9", "seconds": 600, "max_wait_seconds": 3600}
    first = post(server, {"payload": {"rev": 1}, "priority": 1, "debounce": opts})
    assert (first.status_code, first.headers["jobq-enqueued"]) == (201, "created")
    job = first.json()
    assert at(job["run_at"]) - at(job["created_at"]) == timedelta(seconds=600)
    shown = job["debounce"]
    assert (shown["key"], shown["seconds"], shown["max_wait_seconds"]) == ("reindex-9", 600, 3600)
    assert at(shown["run_by"]) == at(job["created_at"]) + timedelta(hours=1)
    assert server.job(job["id"])["debounce"] == shown
    again = post(server, {"payload": {"rev": 2}, "priority": 7, "debounce": opts})
    assert (again.status_code, again.headers["jobq-enqueued"]) == (200, "replaced")
    replaced = again.json()
    assert replaced["id"] == job["id"]
    assert (replaced["payload"], replaced["priority"], replaced["status"]) == ({"rev": 2}, 7, "pending")
    assert at(replaced["run_at"]) >= at(job["run_at"])
    assert server.job(job["id"])["payload"] == {"rev": 2}
    assert post(server, {"payload": 1, "debounce": opts}, "other").status_code == 201  # per queue
    assert post(server, {"payload": 1, "debounce": {**opts, "key": "reindex-10"}}).status_code == 201


def test_the_run_time_never_passes_the_first_enqueue_plus_max_wait(server: LiveServer, db: psycopg.Connection) -> None:
    opts = {"key": "k", "seconds": 100, "max_wait_seconds": 150}
    job = post(server, {"payload": 1, "debounce": opts}).json()
    # As if it had been enqueued 100 s ago (instead of waiting 100 s): due about now.
    # (The new times computed in a CTE: Citus refuses timestamptz - interval on a column in an UPDATE.)
    db.execute(
        "WITH t AS (SELECT id, created_at - interval '100 s' AS c, run_at - interval '100 s' AS r FROM jobq.jobs"
        " WHERE queue_name = 'q' AND id = %(id)s)"
        " UPDATE jobq.jobs j SET created_at = t.c, run_at = t.r FROM t WHERE j.queue_name = 'q' AND j.id = t.id",
        {"id": job["id"]},
    )
    moved = post(server, {"payload": 2, "debounce": opts}).json()
    assert moved["id"] == job["id"]
    # now + 100 s would pass created_at + 150 s (now + 50 s): capped there.
    assert at(moved["run_at"]) == at(moved["created_at"]) + timedelta(seconds=150)
    assert at(moved["debounce"]["run_by"]) == at(moved["run_at"])


def test_the_run_time_never_moves_earlier(server: LiveServer) -> None:
    job = post(server, {"payload": 1, "debounce": {"key": "k", "seconds": 3600}}).json()
    shorter = post(server, {"payload": 2, "debounce": {"key": "k", "seconds": 10}}).json()
    assert shorter["id"] == job["id"] and shorter["run_at"] == job["run_at"] and shorter["payload"] == 2
    assert server.claim("q") == []  # and nothing became due early


def test_once_the_job_runs_the_next_enqueue_makes_a_new_one(server: LiveServer) -> None:
    opts = {"key": "k", "seconds": 0}
    job = post(server, {"payload": 1, "debounce": opts}).json()
    claim = server.claim_one()
    assert (claim["id"], claim["payload"]) == (job["id"], 1)
    again = post(server, {"payload": 2, "debounce": opts})
    assert again.status_code == 201 and again.json()["id"] != job["id"]
    assert server.job(job["id"])["payload"] == 1  # the running job keeps what it runs
    assert server.claim_one()["payload"] == 2


def race(server: LiveServer, queue: str) -> tuple[list[dict[str, Any]], httpx.Response]:
    """A claim and a debounced enqueue of payload B, at once; returns what the claim got, and the answer."""
    barrier = threading.Barrier(2)
    claimed: list[list[dict[str, Any]]] = []
    enqueued: list[httpx.Response] = []

    def claim() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            barrier.wait()
            claimed.append(c.post(f"/queues/{queue}/claim", json={"worker": "w", "limit": 10}).json()["jobs"])

    def enqueue() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            barrier.wait()
            body = {"payload": "B", "debounce": {"key": "k", "seconds": 0}}
            enqueued.append(c.post(f"/queues/{queue}/jobs", json=body))

    threads = [threading.Thread(target=claim), threading.Thread(target=enqueue)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return claimed[0], enqueued[0]


def test_a_debounce_racing_a_claim_loses_no_payload_and_runs_none_twice(server: LiveServer) -> None:
    for n in range(15):
        queue = f"race-{n}"
        first = post(server, {"payload": "A", "debounce": {"key": "k", "seconds": 0}}, queue).json()
        claimed, answer = race(server, queue)
        runs = [(j["id"], j["payload"]) for j in claimed]
        runs += [(j["id"], j["payload"]) for j in server.claim(queue, limit=10)]  # whatever is left
        if answer.status_code == 201:  # the claim came first: it ran A, and B is a new job
            assert runs == [(first["id"], "A"), (answer.json()["id"], "B")]
        else:  # the enqueue came first: A was replaced before any claim saw it, and B runs once
            assert answer.headers["jobq-enqueued"] == "replaced"
            assert runs == [(first["id"], "B")]


def test_concurrent_debounces_leave_one_pending_job(server: LiveServer, db: psycopg.Connection) -> None:
    results: list[httpx.Response] = []
    barrier = threading.Barrier(12)

    def enqueue(n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            barrier.wait()
            results.append(c.post("/queues/q/jobs", json={"payload": n, "debounce": {"key": "k", "seconds": 60}}))

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.headers["jobq-enqueued"] for r in results) == ["created"] + ["replaced"] * 11
    assert len({r.json()["id"] for r in results}) == 1
    assert count_jobs(db) == 1


def test_a_batch_debounces_in_order(server: LiveServer, db: psycopg.Connection) -> None:
    body = {
        "jobs": [
            {"payload": 1, "debounce": {"key": "k", "seconds": 60}},
            {"payload": "plain"},
            {"payload": 2, "debounce": {"key": "k", "seconds": 60}},
            {"payload": 3, "unique": {"key": "u"}},
        ]
    }
    r = server.client.post("/queues/q/jobs/batch", json=body)
    assert r.status_code == 201
    out = r.json()
    assert out["enqueued"] == ["created", "created", "replaced", "created"]
    assert out["jobs"][0]["id"] == out["jobs"][2]["id"]
    assert server.job(out["jobs"][0]["id"])["payload"] == 2
    assert count_jobs(db) == 3


@pytest.mark.parametrize(
    "body",
    [
        {"payload": 1, "debounce": {"seconds": 10}},
        {"payload": 1, "debounce": {"key": "k"}},
        {"payload": 1, "debounce": {"key": "k", "seconds": -1}},
        {"payload": 1, "debounce": {"key": "k", "seconds": 10, "max_wait_seconds": 5}},
        {"payload": 1, "debounce": {"key": "k", "seconds": 10**9}},
        {"payload": 1, "debounce": {"key": "", "seconds": 1}},
        {"payload": 1, "debounce": {"key": "k", "seconds": "1"}},
        {"payload": 1, "debounce": {"key": "k", "seconds": 1, "extra": 1}},
        {"payload": 1, "debounce": {"key": "k", "seconds": 1}, "unique": {}},
        {"payload": 1, "debounce": {"key": "k", "seconds": 1}, "idempotency_key": "k"},
        {"payload": 1, "debounce": {"key": "k", "seconds": 1}, "depends_on": [1]},
        {"payload": 1, "debounce": {"key": "k", "seconds": 1}, "delay_seconds": 5},
        {"payload": 1, "debounce": {"key": "k", "seconds": 1}, "run_at": "2030-01-01T00:00:00Z"},
    ],
)
def test_bad_debounce_options_are_refused(server: LiveServer, db: psycopg.Connection, body: dict[str, Any]) -> None:
    problem(post(server, body), 422, "validation-error")
    problem(server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": 0}, body]}), 422, "validation-error")
    assert count_jobs(db) == 0
