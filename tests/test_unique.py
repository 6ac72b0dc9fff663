"""Unique jobs: enqueue `unique: {key?, for_seconds?, while?}` (docs/producers.md)."""

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


def finish(server: LiveServer, how: str) -> dict[str, Any]:
    claim = server.claim_one()
    if how == "complete":
        body: dict[str, Any] = {"claim_token": claim["claim_token"]}
    else:
        body = {"claim_token": claim["claim_token"], "error": "boom", "retry": False}
    r = server.client.post(f"/jobs/{claim['id']}/{how}", json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_the_same_payload_twice_returns_the_first_job(server: LiveServer, db: psycopg.Connection) -> None:
    first = post(server, {"payload": {"a": 1, "b": [2, 3]}, "unique": {}})
    assert first.status_code == 201
    assert first.headers["jobq-enqueued"] == "created"
    # The same JSON value, written otherwise: the same default key.
    again = post(server, {"payload": {"b": [2, 3], "a": 1}, "unique": {}})
    assert again.status_code == 200
    assert again.headers["jobq-enqueued"] == "existing"
    assert again.json() == first.json()
    unique = first.json()["unique"]
    assert len(unique["key"]) == 64
    assert unique == {
        "key": unique["key"],
        "for_seconds": None,
        "while": ["pending", "running", "completed"],
        "window_start": None,
        "window_end": None,
    }
    assert server.job(first.json()["id"])["unique"] == unique
    assert post(server, {"payload": {"a": 2}, "unique": {}}).status_code == 201  # another payload
    assert post(server, {"payload": {"a": 1, "b": [2, 3]}, "unique": {}}, "other").status_code == 201  # queue
    assert post(server, {"payload": {"a": 1, "b": [2, 3]}}).status_code == 201  # not unique: always made
    assert count_jobs(db) == 4


def test_a_plain_enqueue_says_created(server: LiveServer) -> None:
    r = post(server, {"payload": 1})
    assert (r.status_code, r.headers["jobq-enqueued"], r.json()["unique"]) == (201, "created", None)


def test_a_key_names_the_job_whatever_the_payload(server: LiveServer) -> None:
    first = server.enqueue(payload={"doc": 1, "v": 1}, unique={"key": "reindex-1"})
    again = post(server, {"payload": {"doc": 1, "v": 2}, "unique": {"key": "reindex-1"}})
    assert (again.status_code, again.json()["id"], again.json()["payload"]) == (200, first["id"], {"doc": 1, "v": 1})
    assert first["unique"]["key"] == "reindex-1"


def test_by_default_running_and_completed_jobs_hold_the_key_failed_ones_free_it(server: LiveServer) -> None:
    job = server.enqueue(payload=1, unique={"key": "k"})
    claim = server.claim_one()
    assert post(server, {"payload": 2, "unique": {"key": "k"}}).json()["id"] == job["id"]  # running
    r = server.client.post(f"/jobs/{claim['id']}/complete", json={"claim_token": claim["claim_token"]})
    assert r.status_code == 200
    assert post(server, {"payload": 3, "unique": {"key": "k"}}).status_code == 200  # completed

    job = server.enqueue(payload=1, unique={"key": "f"})
    assert finish(server, "fail")["status"] == "failed"
    again = post(server, {"payload": 1, "unique": {"key": "f"}})
    assert again.status_code == 201 and again.json()["id"] != job["id"]


def test_while_pending_or_running_a_completed_job_frees_the_key(server: LiveServer) -> None:
    opts = {"key": "sync", "while": ["running", "pending"]}
    job = server.enqueue(payload=1, unique=opts)
    assert job["unique"]["while"] == ["pending", "running"]
    assert post(server, {"payload": 1, "unique": opts}).status_code == 200
    finish(server, "complete")
    again = post(server, {"payload": 1, "unique": opts})
    assert again.status_code == 201 and again.json()["id"] != job["id"]


def test_a_window_is_aligned_and_a_later_window_makes_a_new_job(server: LiveServer, db: psycopg.Connection) -> None:
    job = server.enqueue(payload=1, unique={"key": "hourly", "for_seconds": 3600})
    start = datetime.fromisoformat(job["unique"]["window_start"])
    end = datetime.fromisoformat(job["unique"]["window_end"])
    assert start.timestamp() % 3600 == 0 and end - start == timedelta(hours=1)
    assert start <= datetime.fromisoformat(job["created_at"]) < end
    assert post(server, {"payload": 2, "unique": {"key": "hourly", "for_seconds": 3600}}).status_code == 200
    # The same key with another window length is another key.
    assert post(server, {"payload": 2, "unique": {"key": "hourly", "for_seconds": 60}}).status_code == 201
    # An hour later: the first job's window is over (moved back an hour rather than waiting for one), and
    # it holds the key no more, though it is still pending.
    # (The new time computed in a CTE: Citus refuses timestamptz - interval on a column in an UPDATE.)
    db.execute(
        "WITH t AS (SELECT id, unique_from - interval '1 hour' AS u FROM jobq.jobs"
        " WHERE queue_name = 'q' AND id = %(id)s)"
        " UPDATE jobq.jobs j SET unique_from = t.u FROM t WHERE j.queue_name = 'q' AND j.id = t.id",
        {"id": job["id"]},
    )
    later = post(server, {"payload": 3, "unique": {"key": "hourly", "for_seconds": 3600}})
    assert later.status_code == 201 and later.json()["id"] != job["id"]
    assert server.job(job["id"])["status"] == "pending"


def test_windows_of_different_lengths_that_start_together_are_different_keys(
    server: LiveServer, db: psycopg.Connection
) -> None:
    # Aligned windows of different lengths share starts (12:00:00 starts a 60 s and a 3600 s window). Rather
    # than wait for such an instant, the hourly job's window is moved to the start of the current minute; the
    # minute may turn before the next enqueue (bounded retry, the answer's window_start says).
    for attempt in range(5):
        key = f"shared-start-{attempt}"
        hourly = server.enqueue(payload=1, unique={"key": key, "for_seconds": 3600})
        row = db.execute(
            "WITH t AS (SELECT to_timestamp(floor(extract(epoch FROM now()) / 60) * 60) AS u)"
            " UPDATE jobq.jobs j SET unique_from = t.u FROM t WHERE j.queue_name = 'q' AND j.id = %s"
            " RETURNING j.unique_from",
            (hourly["id"],),
        ).fetchone()
        assert row is not None
        minutely = post(server, {"payload": 2, "unique": {"key": key, "for_seconds": 60}})
        if datetime.fromisoformat(minutely.json()["unique"]["window_start"]) != row[0]:
            continue  # the minute turned in between
        assert minutely.status_code == 201, minutely.json()
        assert minutely.json()["id"] != hourly["id"] and minutely.json()["unique"]["for_seconds"] == 60
        again = post(server, {"payload": 3, "unique": {"key": key, "for_seconds": 60}})
        if datetime.fromisoformat(again.json()["unique"]["window_start"]) != row[0]:
            continue
        assert again.status_code == 200 and again.json()["id"] == minutely.json()["id"]
        return
    pytest.fail("the minute kept turning")


def test_a_job_deleted_by_retention_frees_its_key(server: LiveServer, db: psycopg.Connection) -> None:
    job = server.enqueue(payload=1, unique={"key": "k"})
    finish(server, "complete")
    db.execute("DELETE FROM jobq.jobs WHERE id = %s", (job["id"],))  # what the retention sweeper does
    assert post(server, {"payload": 1, "unique": {"key": "k"}}).status_code == 201


def test_concurrent_enqueues_make_exactly_one_job(server: LiveServer, db: psycopg.Connection) -> None:
    results: list[httpx.Response] = []
    barrier = threading.Barrier(20)

    def enqueue(n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            barrier.wait()
            body = {"payload": {"n": n}, "unique": {"key": "once", "for_seconds": 86400}}
            results.append(c.post("/queues/q/jobs", json=body))

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in results) == [200] * 19 + [201]
    assert len({r.json()["id"] for r in results}) == 1
    assert count_jobs(db) == 1


def test_concurrent_batches_with_the_same_keys_make_each_job_once(server: LiveServer, db: psycopg.Connection) -> None:
    results: list[httpx.Response] = []
    barrier = threading.Barrier(8)

    def enqueue(n: int) -> None:
        keys = [f"k{i}" for i in range(10)]
        keys = keys if n % 2 else keys[::-1]  # opposite orders: no deadlock
        with httpx.Client(base_url=server.url, timeout=30) as c:
            barrier.wait()
            body = {"jobs": [{"payload": n, "unique": {"key": k}} for k in keys]}
            results.append(c.post("/queues/q/jobs/batch", json=body))

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [201] * 8
    assert sum(r.json()["enqueued"].count("created") for r in results) == 10
    assert count_jobs(db) == 10


def test_a_batch_that_fails_after_its_insert_leaves_nothing(
    server: LiveServer, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch with a new key and a held one: the insert makes the first job, the lookup of the held key
    # follows. When the lookup fails, the insert is undone with it (one transaction), not left half-made.
    held = server.enqueue(payload=0, unique={"key": "held"})
    monkeypatch.setattr("app.db.jobs.JOB_GET_BY_UNIQUE", "SELECT 1 / 0")
    body = {"jobs": [{"payload": 1, "unique": {"key": "new"}}, {"payload": 2, "unique": {"key": "held"}}]}
    r = server.client.post("/queues/q/jobs/batch", json=body)
    assert r.status_code == 422, r.text  # the database refused it (a data error)
    rows = db.execute("SELECT id FROM jobq.jobs").fetchall()
    assert rows == [(held["id"],)]


def test_a_batch_names_one_job_per_key(server: LiveServer, db: psycopg.Connection) -> None:
    body = {
        "jobs": [
            {"payload": 1, "unique": {"key": "a"}},
            {"payload": 2, "unique": {"key": "a"}},
            {"payload": 3},
            {"payload": 4, "idempotency_key": "i"},
            {"payload": 5, "unique": {}},
        ]
    }
    r = server.client.post("/queues/q/jobs/batch", json=body)
    assert r.status_code == 201
    out = r.json()
    assert out["enqueued"] == ["created", "existing", "created", "created", "created"]
    assert out["jobs"][1]["id"] == out["jobs"][0]["id"]
    assert [j["payload"] for j in out["jobs"]] == [1, 1, 3, 4, 5]
    again = server.client.post("/queues/q/jobs/batch", json=body).json()
    assert again["enqueued"] == ["existing", "existing", "created", "existing", "existing"]
    assert count_jobs(db) == 5
    plain = server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": 1}]}).json()
    assert plain["enqueued"] == ["created"]


def test_retrying_a_job_whose_key_another_holds_is_refused(server: LiveServer) -> None:
    first = server.enqueue(payload=1, unique={"key": "k"})
    finish(server, "fail")
    second = server.enqueue(payload=2, unique={"key": "k"})
    assert second["id"] != first["id"]
    problem(server.client.post(f"/jobs/{first['id']}/retry"), 409, "invalid-state")
    assert server.job(first["id"])["status"] == "failed"
    # Once the other job no longer holds it (cancelled), the retry goes through.
    assert server.client.post(f"/jobs/{second['id']}/cancel").status_code == 200
    assert server.client.post(f"/jobs/{first['id']}/retry").json()["status"] == "pending"


@pytest.mark.parametrize(
    "body",
    [
        {"payload": 1, "unique": {"while": ["pending", "running", "sleeping"]}},
        {"payload": 1, "unique": {"while": ["pending", "completed"]}},
        {"payload": 1, "unique": {"while": []}},
        {"payload": 1, "unique": {"for_seconds": -1}},
        {"payload": 1, "unique": {"for_seconds": 0}},
        {"payload": 1, "unique": {"for_seconds": 1.5}},
        {"payload": 1, "unique": {"for_seconds": 10**9}},
        {"payload": 1, "unique": {"key": ""}},
        {"payload": 1, "unique": {"key": "a\u0000"}},
        {"payload": 1, "unique": {"kee": "a"}},
        {"payload": 1, "unique": None},
        {"payload": 1, "unique": "k"},
        {"payload": 1, "unique": {"key": "k"}, "idempotency_key": "k"},
        {"payload": 1, "unique": {"key": "k"}, "depends_on": [1]},
    ],
)
def test_bad_unique_options_are_refused(server: LiveServer, db: psycopg.Connection, body: dict[str, Any]) -> None:
    problem(post(server, body), 422, "validation-error")
    problem(server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": 0}, body]}), 422, "validation-error")
    assert count_jobs(db) == 0


def test_a_batch_with_depends_on_and_unique_is_refused(server: LiveServer, db: psycopg.Connection) -> None:
    body = {"jobs": [{"payload": 1, "ref": "a"}, {"payload": 2, "depends_on": ["a"]}, {"payload": 3, "unique": {}}]}
    err = problem(server.client.post("/queues/q/jobs/batch", json=body), 422, "validation-error")
    assert err["errors"][0]["loc"] == ["body", "jobs", 2, "unique"]
    assert count_jobs(db) == 0


def test_a_bulk_retry_that_meets_a_holder_is_refused(server: LiveServer) -> None:
    first = server.enqueue(payload=1, unique={"key": "k"})
    finish(server, "fail")
    server.enqueue(payload=2, unique={"key": "k"})
    bulk = server.client.post("/jobs/bulk", json={"action": "retry", "ids": [first["id"]]})
    problem(bulk, 409, "invalid-state")
    assert server.job(first["id"])["status"] == "failed"


def test_a_bulk_retry_by_filter_skips_jobs_whose_key_is_held(server: LiveServer) -> None:
    held = server.enqueue(payload=1, unique={"key": "held"})
    finish(server, "fail")
    server.enqueue(payload=2, unique={"key": "held"})  # the holder, pending
    server.claim_one()  # ... now running
    plain = server.enqueue(payload=3)
    finish(server, "fail")
    r = server.client.post("/jobs/bulk", json={"action": "retry", "filter": {"queue": "q", "status": "failed"}})
    assert r.status_code == 200, r.text
    outcomes = {o["id"]: (o["outcome"], o["status"]) for o in r.json()["jobs"]}
    assert outcomes == {held["id"]: ("skipped", "failed"), plain["id"]: ("done", "pending")}


def test_a_redrive_skips_failed_jobs_whose_key_is_held_or_shared(server: LiveServer) -> None:
    # Oldest first: a failed job whose key another job holds now, two failed jobs sharing a key, then a
    # plain failed job. The redrive moves one of the pair and the plain job; the others stay failed.
    held = server.enqueue(payload=1, unique={"key": "held"})
    finish(server, "fail")
    server.enqueue(payload=2, unique={"key": "held"})  # the holder, pending
    server.claim_one()  # ... now running (claims take the oldest: the holder)
    pair = [server.enqueue(payload=3, unique={"key": "pair"})]
    finish(server, "fail")
    pair.append(server.enqueue(payload=4, unique={"key": "pair"}))
    finish(server, "fail")
    plain = server.enqueue(payload=5)
    finish(server, "fail")
    dry = server.client.post("/queues/q/redrive", json={"dry_run": True})
    assert dry.status_code == 200 and dry.json()["jobs"] == 2, dry.text
    r = server.client.post("/queues/q/redrive", json={})
    assert r.status_code == 200 and r.json()["jobs"] == 2, r.text
    assert server.job(held["id"])["status"] == "failed"
    assert [server.job(j["id"])["status"] for j in pair] == ["pending", "failed"]
    assert server.job(plain["id"])["status"] == "pending"
    # Nothing left to move: the rest are held.
    again = server.client.post("/queues/q/redrive", json={})
    assert again.status_code == 200 and again.json()["jobs"] == 0, again.text
