"""Hard timeouts: `timeout_seconds` on enqueue and on the queue's configuration; the sweeper fails a job that
ran longer than that since its claim, whatever its heartbeats (app/db/timeouts.py), and its worker learns it
from its next write (409 job-timed-out); the SDKs stop the handler."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.support import LiveServer, problem, wait_until
from tests.test_operations import assert_counts_true


def sweep(server: LiveServer, after: float) -> int:
    """Run the timeout sweep as if `after` seconds had gone by since the latest claim."""
    claimed = max(datetime.fromisoformat(j["claimed_at"]) for j in _running(server))
    return server.run(lambda: server.services.maintenance["timeouts"].run_once(claimed + timedelta(seconds=after)))


def _running(server: LiveServer) -> list[dict[str, Any]]:
    r = server.client.get("/queues/q/jobs", params={"status": "running"})
    return r.json()["jobs"]  # type: ignore[no-any-return]


def beat(server: LiveServer, claim: dict[str, Any]) -> Any:
    return server.client.post(f"/jobs/{claim['id']}/heartbeat", json={"claim_token": claim["claim_token"]})


def test_a_job_past_its_timeout_is_failed_whatever_its_heartbeats(server: LiveServer, db: psycopg.Connection) -> None:
    job = server.enqueue(payload=1, timeout_seconds=60, max_attempts=3)
    assert job["timeout_seconds"] == 60
    claim = server.claim_one(worker="slowpoke")
    assert beat(server, claim).status_code == 200
    assert sweep(server, 59) == 0  # not yet
    assert beat(server, claim).status_code == 200  # the lease renewed: no help against the timeout
    assert sweep(server, 61) == 1
    after = server.job(job["id"])
    assert (after["status"], after["last_error"], after["attempts"]) == ("pending", "timeout", 1)
    assert after["run_at"] > after["claimed_at"]  # retried after a backoff, as after any failure
    assert after["lease_expires_at"] is None
    # The worker learns it from its next heartbeat, and every write of that claim is refused the same way.
    problem(beat(server, claim), 409, "job-timed-out")
    body = {"claim_token": claim["claim_token"]}
    problem(server.client.post(f"/jobs/{job['id']}/complete", json=body), 409, "job-timed-out")
    problem(server.client.post(f"/jobs/{job['id']}/fail", json={**body, "error": "x"}), 409, "job-timed-out")
    problem(server.client.post(f"/jobs/{job['id']}/release", json=body), 409, "job-timed-out")
    r = server.client.post("/jobs/complete", json={"jobs": [{"id": job["id"], "claim_token": claim["claim_token"]}]})
    assert r.json()["results"] == [{"id": job["id"], "outcome": "timed_out", "status": "pending"}]
    assert server.job(job["id"])["status"] == "pending"  # none of them changed it
    # It counts as a failed attempt of its worker.
    server.run(server.services.maintenance["workers"].run_once)
    assert server.client.get("/workers/slowpoke").json()["failed_last_hour"] == 1
    # Claimed again (after its backoff), it is a new claim with its own time.
    db.execute("UPDATE jobq.jobs SET run_at = now() WHERE id = %s", (job["id"],))
    again = server.claim_one()
    assert again["id"] == job["id"] and again["attempts"] == 2
    assert beat(server, again).status_code == 200
    assert sweep(server, 30) == 0


def test_on_its_last_attempt_a_timed_out_job_fails_for_good(server: LiveServer, db: psycopg.Connection) -> None:
    job = server.enqueue(payload=1, timeout_seconds=5, max_attempts=1)
    claim = server.claim_one()
    assert sweep(server, 6) == 1
    after = server.job(job["id"])
    assert (after["status"], after["last_error"]) == ("failed", "timeout")
    assert after["finished_at"] is not None
    assert_counts_true(server, db)  # the finished-job counters moved with it
    problem(beat(server, claim), 409, "job-timed-out")
    text = server.client.get("/metrics").text
    assert 'jobq_sweeper_rows_total{action="timed_out"} 1.0' in text


def test_a_job_that_times_out_for_good_cancels_the_jobs_that_depend_on_it(
    server_factory: Callable[..., LiveServer],
) -> None:
    """A timeout on the last attempt finishes the job as a fail would: its dependants are cancelled, through
    the dependency release's outbox that the timeout sweep's statement writes (the reconciliation, which
    would find it without, is kept out of the way)."""
    server = server_factory(dependency_reconcile_seconds=3600)
    job = server.enqueue(payload=1, timeout_seconds=5, max_attempts=1)
    child = server.client.post("/queues/after/jobs", json={"payload": 2, "depends_on": [job["id"]]}).json()
    assert child["status"] == "waiting"
    server.claim_one()
    assert sweep(server, 6) == 1
    wait_until(lambda: server.job(child["id"])["status"] == "cancelled", timeout=60, what="the dependant cancelled")
    assert server.job(child["id"])["last_error"] == f"dependency {job['id']} failed"


def test_the_queue_timeout_applies_to_its_jobs_without_one(server: LiveServer) -> None:
    own_long = server.enqueue(payload="own", timeout_seconds=3600)
    plain = server.enqueue(payload="plain")
    other_queue = server.enqueue("elsewhere", payload="other")
    claims = server.claim(limit=2)
    server.claim("elsewhere")
    assert sweep(server, 120) == 0  # no timeout anywhere yet
    r = server.client.patch("/queues/q/config", json={"timeout_seconds": 60})
    assert r.status_code == 200 and r.json()["timeout_seconds"] == 60
    assert sweep(server, 120) == 1  # applies to running jobs at once; a job's own timeout wins
    assert server.job(plain["id"])["last_error"] == "timeout"
    assert server.job(own_long["id"])["status"] == "running"
    assert server.job(other_queue["id"])["status"] == "running"
    assert {c["id"] for c in claims} == {own_long["id"], plain["id"]}
    r = server.client.patch("/queues/q/config", json={"timeout_seconds": None})
    assert r.json()["timeout_seconds"] is None


def test_bad_timeouts_are_422_and_write_nothing(server: LiveServer, db: psycopg.Connection) -> None:
    for bad in (0, 604_801, "60", 1.5, True, -1):
        problem(
            server.client.post("/queues/q/jobs", json={"payload": 1, "timeout_seconds": bad}), 422, "validation-error"
        )
        batch = {"jobs": [{"payload": 1}, {"payload": 2, "timeout_seconds": bad}]}
        problem(server.client.post("/queues/q/jobs/batch", json=batch), 422, "validation-error")
        problem(server.client.patch("/queues/q/config", json={"timeout_seconds": bad}), 422, "validation-error")
    assert db.execute("SELECT count(*) FROM jobq.jobs").fetchone() == (0,)
    made = server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": 1, "timeout_seconds": 604_800}]})
    assert made.json()["jobs"][0]["timeout_seconds"] == 604_800


@pytest.fixture
def quick_server(server_factory) -> LiveServer:  # type: ignore[no-untyped-def]
    # The sweepers tick every 0.1 s, so a job past its 1-second timeout is failed within a moment.
    return server_factory(sweep_interval_seconds=0.1, backoff_base_seconds=30, access_log=False)  # type: ignore[no-any-return]


def test_the_python_sdk_stops_a_handler_whose_job_timed_out(quick_server: LiveServer) -> None:
    from jobq_client import Worker

    job = quick_server.enqueue(payload="sync", timeout_seconds=1, max_attempts=2)
    told: dict[str, Any] = {}
    started = threading.Event()
    worker = Worker(quick_server.url, lease_seconds=10, heartbeat_interval=0.2, wait_seconds=0.5, concurrency=1)

    @worker.handler("q")
    def handler(ctx: Any) -> str:
        started.set()
        while not ctx.sleep(0.05):  # cooperative: the handler sees `stopped` turn true
            pass
        told["reason"] = ctx.stop_reason
        return "must not be sent"

    runner = threading.Thread(target=worker.run, daemon=True)  # not the main thread: no signal handlers
    runner.start()
    try:
        wait_until(started.is_set, what="the handler to start")
        wait_until(lambda: "reason" in told, what="the handler to be told")
        assert told["reason"] == "timed out"
    finally:
        worker.stop()
        runner.join(60)
    after = quick_server.job(job["id"])
    assert (after["status"], after["last_error"], after["result"]) == ("pending", "timeout", None)
