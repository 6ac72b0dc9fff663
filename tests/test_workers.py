"""The worker registry: GET /workers and GET /workers/{name}, fed by claims, heartbeats, completes and fails
through each process's flush (app/maintenance/workers.py)."""

from __future__ import annotations

import os
from typing import Any

import httpx
import psycopg

from tests.support import LiveServer, problem, wait_until
from tests.test_security import ENV_KEY, as_key, create_key

UA = {"user-agent": "jobq-client-python/9.8.7 (host=box-1)"}


def flush(server: LiveServer) -> None:
    server.run(server.services.maintenance["workers"].run_once)


def claim(server: LiveServer, queue: str, worker: str, n: int = 1, client: httpx.Client | None = None) -> list[Any]:
    c = client or server.client
    r = c.post(f"/queues/{queue}/claim", json={"worker": worker, "limit": n}, headers=UA)
    assert r.status_code == 200, r.text
    return r.json()["jobs"]  # type: ignore[no-any-return]


def workers(client: httpx.Client) -> dict[str, dict[str, Any]]:
    r = client.get("/workers")
    assert r.status_code == 200, r.text
    return {w["name"]: w for w in r.json()["workers"]}


def test_claims_heartbeats_and_outcomes_make_a_worker_record(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(workers_flush_interval_seconds=0)  # flushed by this test only
    server.client.headers.update(UA)  # as the SDK does, on every call
    for _ in range(3):
        server.enqueue("emails")
    held, done, failed = claim(server, "emails", "box-1-42", 3)
    assert server.client.post(f"/jobs/{held['id']}/heartbeat", json={"claim_token": held["claim_token"]}).is_success
    assert server.client.post(f"/jobs/{done['id']}/complete", json={"claim_token": done["claim_token"]}).is_success
    r = server.client.post(f"/jobs/{failed['id']}/fail", json={"claim_token": failed["claim_token"], "error": "x"})
    assert r.is_success
    assert workers(server.client) == {}  # nothing written before the flush: no statement on the hot path
    flush(server)

    w = workers(server.client)["box-1-42"]
    assert w["state"] == "live"
    assert w["queues"] == ["emails"]
    assert (w["sdk"], w["version"], w["host"]) == ("jobq-client-python", "9.8.7", "box-1")
    assert w["jobs_held"] == 1
    assert (w["completed_last_hour"], w["failed_last_hour"]) == (1, 1)
    assert w["first_seen"] <= w["last_seen"]
    assert w["lease_expires_at"] is not None

    detail = server.client.get("/workers/box-1-42").json()
    assert [j["id"] for j in detail["jobs"]] == [held["id"]]
    assert detail["jobs"][0]["queue"] == "emails"
    assert detail["completed_last_hour"] == 1

    # A heartbeat alone keeps the worker seen: its last_seen moves on.
    # A constant: Citus refuses a column minus an interval in an UPDATE.
    db.execute("UPDATE jobq.workers SET last_seen = now() - interval '10 minutes'")
    before = server.client.get("/workers/box-1-42").json()["last_seen"]
    assert server.client.post(f"/jobs/{held['id']}/heartbeat", json={"claim_token": held["claim_token"]}).is_success
    flush(server)
    assert server.client.get("/workers/box-1-42").json()["last_seen"] > before


def test_a_worker_without_the_sdk_is_named_by_its_address(server: LiveServer) -> None:
    server.enqueue()
    r = server.client.post("/queues/q/claim", json={"worker": "curl"}, headers={"user-agent": "curl/8.5.0"})
    assert r.status_code == 200
    flush(server)
    w = workers(server.client)["curl"]
    assert (w["sdk"], w["version"], w["host"]) == ("curl", "8.5.0", "127.0.0.1")


def test_a_vanished_worker_shows_as_gone_once_its_leases_lapse(server: LiveServer, db: psycopg.Connection) -> None:
    server.enqueue()
    job = claim(server, "q", "vanishing")[0]
    flush(server)
    # Not seen for an hour (the process died), but its lease has not lapsed: it may still be working.
    db.execute("UPDATE jobq.workers SET last_seen = now() - interval '1 hour', first_seen = now() - interval '2 hours'")
    assert workers(server.client)["vanishing"]["state"] == "live"
    # Its lease lapses: gone, and still listed (recently gone), holding the job until the sweeper returns it.
    db.execute("UPDATE jobq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (job["id"],))
    w = workers(server.client)["vanishing"]
    assert (w["state"], w["jobs_held"]) == ("gone", 1)
    server.run(server.services.maintenance["rescuer"].run_once)
    assert workers(server.client)["vanishing"]["jobs_held"] == 0
    # A worker seen recently that holds nothing is live.
    claim(server, "q", "idle")
    flush(server)
    assert workers(server.client)["idle"]["state"] == "live"
    assert list(workers(server.client)) == ["idle", "vanishing"]  # live ones first


def test_gone_workers_are_forgotten_after_the_keep_time(server_factory, database_url: str) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(workers_keep_seconds=3600)
    claim(server, "q", "old")
    claim(server, "q", "new")
    flush(server)
    with psycopg.connect(database_url, autocommit=True) as db:
        db.execute("UPDATE jobq.workers SET last_seen = now() - interval '2 hours' WHERE name = 'old'")
        assert list(workers(server.client)) == ["new"]  # not listed once past the keep time
        server.services.maintenance["workers"]._next_prune = 0.0
        flush(server)
        assert db.execute("SELECT name FROM jobq.workers").fetchall() == [("new",)]  # and deleted


def test_a_key_limited_to_some_queues_sees_only_their_workers(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(auth="on", api_key=ENV_KEY)
    with as_key(server, ENV_KEY) as admin:
        _limited_keys(server, db, admin)


def _limited_keys(server: LiveServer, db: psycopg.Connection, admin: httpx.Client) -> None:
    for queue in ("team-a.x", "team-b.x", "team-b.x"):
        admin.post(f"/queues/{queue}/jobs", json={"payload": 1})
    a_job = claim(server, "team-a.x", "both", client=admin)[0]
    claim(server, "team-b.x", "both", client=admin)
    claim(server, "team-b.x", "b-only", client=admin)
    flush(server)
    assert set(workers(admin)) == {"both", "b-only"}
    with as_key(server, create_key(db, "team-a-ops", ["admin"], ["team-a.*"])) as ops:
        seen = workers(ops)
        assert list(seen) == ["both"]
        assert seen["both"]["queues"] == ["team-a.x"]
        assert seen["both"]["jobs_held"] == 1
        detail = ops.get("/workers/both").json()
        assert [j["id"] for j in detail["jobs"]] == [a_job["id"]]
        a = problem(ops.get("/workers/b-only"), 404, "worker-not-found")
        b = problem(ops.get("/workers/nobody"), 404, "worker-not-found")
        assert {**a, "instance": None, "detail": None} == {**b, "instance": None, "detail": None}
    with as_key(server, create_key(db, "worker", ["consume"])) as worker:
        problem(worker.get("/workers"), 403, "forbidden")
        problem(worker.get("/workers/both"), 403, "forbidden")


def test_bad_worker_requests_are_422(server: LiveServer) -> None:
    problem(server.client.get("/workers", params={"limit": 0}), 422, "validation-error")
    problem(server.client.get("/workers", params={"limit": "many"}), 422, "validation-error")
    problem(server.client.get("/workers/a%01b"), 422, "validation-error")
    problem(server.client.get("/workers/" + "x" * 256), 422, "validation-error")


def test_jobq_workers_lists_them_and_shows_one(server: LiveServer) -> None:
    from tests.test_cli_api import as_json, jobq, ok

    server.enqueue()
    job = claim(server, "q", "box-1-42")[0]
    flush(server)
    header, row = ok(jobq(server, "workers")).splitlines()
    assert header.split()[:3] == ["WORKER", "STATE", "QUEUES"]
    assert row.split()[:5] == ["box-1-42", "live", "q", "jobq-client-python", "9.8.7"]
    assert as_json(jobq(server, "workers", "--json")) == server.client.get("/workers").json()
    shown = ok(jobq(server, "workers", "box-1-42"))
    assert shown.splitlines()[0] == "worker box-1-42" and "holds       1 jobs" in shown
    assert str(job["id"]) in shown
    r = jobq(server, "workers", "nobody")
    assert r.returncode == 3 and "worker-not-found" in r.stderr


def test_the_python_sdk_worker_is_listed_with_its_identity(server: LiveServer) -> None:
    import re
    import socket
    import threading

    from jobq_client import Worker, __version__

    job = server.enqueue(payload="hello")
    worker = Worker(server.url, concurrency=1, wait_seconds=0.5)
    done = threading.Event()

    @worker.handler("q")
    def handler(ctx: Any) -> str:
        done.set()
        return "ok"

    runner = threading.Thread(target=worker.run, daemon=True)  # not the main thread: no signal handlers
    runner.start()
    try:
        wait_until(lambda: server.job(job["id"])["status"] == "completed", what="the job to complete")
    finally:
        worker.stop()
        runner.join(60)
    flush(server)
    w = workers(server.client)[worker.name]
    assert worker.name == f"{socket.gethostname()}-{os.getpid()}"  # the same for every claim of the process
    assert (w["sdk"], w["version"]) == ("jobq-client-python", __version__)
    assert w["host"] == re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname())
    assert w["completed_last_hour"] == 1 and w["queues"] == ["q"]
