"""POST /jobs/{id}/release: a worker hands a claimed job back untried, without spending an attempt."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import psycopg

from tests.support import LiveServer, problem, record_wakeups, settle_long_poll
from tests.test_lifecycle import row, sweep
from tests.test_observability import metric
from tests.test_operations import flush, stats


def release(server: LiveServer, claim: dict[str, Any], **body: Any) -> httpx.Response:
    return server.client.post(f"/jobs/{claim['id']}/release", json={"claim_token": claim["claim_token"], **body})


def test_release_gives_the_attempt_back(server: LiveServer, db: psycopg.Connection) -> None:
    """A job on its only attempt, handed back by a worker that stops, still runs and completes."""
    job = server.enqueue(payload=1, max_attempts=1)
    first = server.claim_one(worker="stopping")
    assert first["attempts"] == 1
    r = release(server, first)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["id"], body["status"], body["attempts"], body["max_attempts"]) == (job["id"], "pending", 0, 1)
    assert (body["claimed_at"], body["lease_expires_at"], body["finished_at"], body["last_error"]) == (None,) * 4
    stored = row(db, job["id"])
    assert (stored["status"], stored["attempts"], stored["claim_token"]) == ("pending", 0, None)

    second = server.claim_one(worker="next")
    assert (second["id"], second["attempts"]) == (job["id"], 1)
    assert second["claim_token"] != first["claim_token"]
    done = server.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": second["claim_token"]}).json()
    assert (done["status"], done["attempts"]) == ("completed", 1)


def test_release_keeps_last_error(server: LiveServer) -> None:
    server.enqueue(payload=1, max_attempts=3)
    c = server.claim_one()
    fail = {"claim_token": c["claim_token"], "error": "SMTP 451", "retry_in_seconds": 0}
    assert server.client.post(f"/jobs/{c['id']}/fail", json=fail).status_code == 200
    again = server.claim_one()
    assert again["attempts"] == 2
    body = release(server, again).json()
    assert (body["status"], body["attempts"], body["last_error"]) == ("pending", 1, "SMTP 451")


def test_release_is_due_at_once_by_default(server: LiveServer, db: psycopg.Connection) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    assert release(server, c).status_code == 200
    due = db.execute("SELECT run_at <= now() FROM jobq.jobs WHERE id = %s", (c["id"],)).fetchone()
    assert due == (True,)
    assert server.claim_one()["id"] == c["id"]


def test_release_with_a_delay_puts_run_at_later_by_the_database_clock(
    server: LiveServer, db: psycopg.Connection
) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    assert release(server, c, delay_seconds=7200).status_code == 200
    delay = db.execute("SELECT run_at - now() FROM jobq.jobs WHERE id = %s", (c["id"],)).fetchone()[0]  # type: ignore[index]
    assert timedelta(seconds=7190) < delay <= timedelta(seconds=7200)
    assert server.claim() == []
    assert stats(server)["counts"]["scheduled"] == 1


def test_delay_seconds_bounds(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_delay_seconds=600)
    server.enqueue(payload=1)
    c = server.claim_one()
    for bad in (-1, -0.001, 600.001, 601, "5", True, None, [1]):
        body = problem(release(server, c, delay_seconds=bad), 422, "validation-error")
        assert body["errors"][0]["loc"] == ["body", "delay_seconds"], bad
    problem(release(server, c, delay_seconds=1, priority=2), 422, "validation-error")  # unknown field
    problem(server.client.post(f"/jobs/{c['id']}/release", json={}), 422, "validation-error")
    problem(server.client.post(f"/jobs/{c['id']}/release", json={"claim_token": ""}), 422, "validation-error")
    problem(
        server.client.post(f"/jobs/{c['id']}/release", content=b"{", headers={"content-type": "application/json"}),
        400,
        "malformed-request",
    )
    problem(server.client.post("/jobs/0/release", json={"claim_token": "x"}), 422, "validation-error")
    assert server.job(c["id"])["status"] == "running"  # nothing refused changed anything
    assert release(server, c, delay_seconds=600).json()["status"] == "pending"  # the bound itself is allowed
    server.enqueue(payload=2)
    assert release(server, server.claim_one(), delay_seconds=0.5).status_code == 200  # fractions, as on enqueue


def test_a_stale_token_cannot_release(server: LiveServer, db: psycopg.Connection) -> None:
    """A's lease lapses and is swept, B claims the job: A's release gets 409 and changes nothing."""
    job = server.enqueue(payload=1)
    a = server.claim_one(worker="a", lease_seconds=1)
    assert sweep(server).rescued == 1
    b = server.claim_one(worker="b")
    before = row(db, job["id"])
    problem(release(server, a), 409, "claim-lost")
    problem(release(server, {**b, "claim_token": "someone-elses"}), 409, "claim-lost")
    assert row(db, job["id"]) == before
    assert release(server, b).status_code == 200


def test_a_repeated_release_is_409_and_changes_nothing(server: LiveServer, db: psycopg.Connection) -> None:
    """Unlike complete and fail, release ends the claim and forgets its token: a repeat is a lost claim."""
    server.enqueue(payload=1)
    c = server.claim_one()
    assert release(server, c).status_code == 200
    after = row(db, c["id"])
    problem(release(server, c), 409, "claim-lost")
    assert row(db, c["id"]) == after


def test_a_finished_job_cannot_be_released(server: LiveServer) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    assert server.client.post(f"/jobs/{c['id']}/complete", json={"claim_token": c["claim_token"]}).status_code == 200
    problem(release(server, c), 409, "claim-lost")
    assert server.job(c["id"])["status"] == "completed"
    problem(release(server, {"id": 987654, "claim_token": "x"}), 404, "job-not-found")


def test_a_cancelled_job_stays_cancelled(server: LiveServer) -> None:
    """The cooperative cancel wins: the worker is told the job was cancelled, as complete and fail are,
    rather than put it back in line."""
    server.enqueue(payload=1)
    c = server.claim_one()
    assert server.client.post(f"/jobs/{c['id']}/cancel", json={}).json()["status"] == "cancelled"
    problem(release(server, c), 409, "job-cancelled")
    job = server.job(c["id"])
    assert (job["status"], job["attempts"]) == ("cancelled", 1)


def test_release_wakes_a_waiting_long_poll(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(poll_interval_seconds=60)  # no fallback poll within the wait
    job = server.enqueue(payload=1)
    c = server.claim_one(worker="leaving")
    answer = server.claim_in_background(wait_seconds=20)
    settle_long_poll(server)
    woken = record_wakeups(server)
    assert release(server, c).status_code == 200
    assert woken == [{"q"}]
    got = answer()
    assert [(j["id"], j["attempts"]) for j in got] == [(job["id"], 1)]


def test_release_is_counted_but_is_no_retry_or_failure(server: LiveServer) -> None:
    """A job every worker hands back never fails: the stats window shows the releases, and no retry or
    failure, so that the loop is visible."""
    server.enqueue(payload=1, max_attempts=1)
    for _ in range(3):
        assert release(server, server.claim_one()).status_code == 200
    flush(server)
    w = stats(server)["window"]
    assert (w["claimed"], w["released"], w["retries"], w["failures"], w["lease_expired"]) == (3, 3, 0, 0, 0)
    assert server.claim_one()["attempts"] == 1  # still on its only attempt: it never fails
    text = server.client.get("/metrics").text
    assert metric(text, "jobq_jobs_released_total", queue="q") == 3
    assert metric(text, "jobq_jobs_retried_total", queue="q") in (None, 0)
    assert metric(text, "jobq_jobs_failed_total", queue="q") in (None, 0)
