"""GET /jobs/{id}/explain: the rules of the claim that hold a job right now. For every rule: set it up,
explain, claim, and check that they agree (a job explained as held is not claimed; once the cause is gone,
it is explained as runnable and the claim takes it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from tests.support import LiveServer, problem
from tests.test_security import ENV_KEY, as_key, create_key

LATER = (datetime.now(UTC) + timedelta(days=1)).isoformat()


def explain(server: LiveServer, job_id: int) -> dict[str, Any]:
    r = server.client.get(f"/jobs/{job_id}/explain")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def kinds(server: LiveServer, job_id: int) -> list[str]:
    return [r["kind"] for r in explain(server, job_id)["reasons"]]


def configure(server: LiveServer, queue: str = "q", **config: Any) -> None:
    assert server.client.patch(f"/queues/{queue}/config", json=config).status_code == 200


def agree(server: LiveServer, job_id: int, queue: str = "q") -> bool:
    """Explain, then claim everything the queue gives: the job is claimed exactly when explained runnable.
    Returns whether it was runnable."""
    doc = explain(server, job_id)
    assert doc["runnable"] == (doc["reasons"] == [])
    taken = {c["id"] for c in server.claim(queue, limit=100)}
    assert (job_id in taken) == doc["runnable"], (doc, taken)
    return bool(doc["runnable"])


def test_a_ready_job_is_runnable_and_the_claim_takes_it(server: LiveServer) -> None:
    job = server.enqueue()
    assert explain(server, job["id"]) == {
        "id": job["id"], "queue": "q", "status": "pending", "runnable": True, "reasons": []
    }  # fmt: skip
    assert agree(server, job["id"])
    # Running, then finished: said as such.
    [reason] = explain(server, job["id"])["reasons"]
    assert (reason["kind"], reason["worker"]) == ("running", "w") and reason["lease_expires_at"]
    claim = server.client.get("/queues/q/jobs", params={"status": "running"}).json()["jobs"][0]
    assert claim["id"] == job["id"]


def test_paused(server: LiveServer) -> None:
    job = server.enqueue()
    server.client.post("/queues/q/pause")
    assert kinds(server, job["id"]) == ["paused"]
    assert not agree(server, job["id"])
    server.client.post("/queues/q/resume")
    assert agree(server, job["id"])


def test_scheduled_for_later(server: LiveServer, db: psycopg.Connection) -> None:
    job = server.enqueue(run_at=LATER)
    [reason] = explain(server, job["id"])["reasons"]
    assert reason["kind"] == "scheduled"
    assert datetime.fromisoformat(reason["run_at"]) == datetime.fromisoformat(LATER)
    assert not agree(server, job["id"])
    db.execute("UPDATE jobq.jobs SET run_at = now() WHERE id = %s", (job["id"],))  # time passes
    assert agree(server, job["id"])


def test_backoff(server: LiveServer, db: psycopg.Connection) -> None:
    job = server.enqueue()
    claim = server.claim_one()
    body = {"claim_token": claim["claim_token"], "error": "SMTP 451", "retry_in_seconds": 3600}
    assert server.client.post(f"/jobs/{job['id']}/fail", json=body).status_code == 200
    [reason] = explain(server, job["id"])["reasons"]
    assert (reason["kind"], reason["attempts"], reason["last_error"]) == ("backoff", 1, "SMTP 451")
    assert not agree(server, job["id"])
    db.execute("UPDATE jobq.jobs SET run_at = now() WHERE id = %s", (job["id"],))
    assert agree(server, job["id"])


def test_concurrency(server: LiveServer) -> None:
    configure(server, concurrency=2)
    first, second = server.enqueue(), server.enqueue()
    held = server.claim(limit=2)
    assert {c["id"] for c in held} == {first["id"], second["id"]}
    job = server.enqueue()
    [reason] = explain(server, job["id"])["reasons"]
    assert reason == {"kind": "concurrency", "limit": 2, "held_by": [first["id"], second["id"]]}
    assert not agree(server, job["id"])
    body = {"claim_token": held[0]["claim_token"]}
    assert server.client.post(f"/jobs/{held[0]['id']}/complete", json=body).status_code == 200
    assert agree(server, job["id"])


def test_rate(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server, rate={"limit": 2, "per_seconds": 3600})
    for _ in range(2):
        server.enqueue()
    assert len(server.claim(limit=2)) == 2
    job = server.enqueue()
    [reason] = explain(server, job["id"])["reasons"]
    assert (reason["kind"], reason["limit"], reason["per_seconds"]) == ("rate", 2, 3600)
    assert datetime.fromisoformat(reason["until"]) > datetime.now(UTC) + timedelta(minutes=50)
    assert not agree(server, job["id"])
    db.execute(
        "UPDATE jobq.queue_claims SET claimed_at = now() - interval '2 hours' WHERE queue_name = 'q'"
    )  # the window moves on
    assert agree(server, job["id"])


def test_group_concurrency(server: LiveServer) -> None:
    configure(server, group_concurrency=1)
    busy = server.enqueue(group="acme")
    other_group = server.enqueue(group="other")
    held = {c["id"]: c for c in server.claim(limit=2)}
    assert set(held) == {busy["id"], other_group["id"]}
    job = server.enqueue(group="acme")
    free = server.enqueue(group="globex")
    [reason] = explain(server, job["id"])["reasons"]
    assert reason == {"kind": "group_concurrency", "group": "acme", "limit": 1, "held_by": [busy["id"]]}
    assert kinds(server, free["id"]) == []
    assert not agree(server, job["id"])  # globex's job was claimed, acme's was not
    body = {"claim_token": held[busy["id"]]["claim_token"]}
    assert server.client.post(f"/jobs/{busy['id']}/complete", json=body).status_code == 200
    assert agree(server, job["id"])


def test_group_rate(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server, group_rate={"limit": 1, "per_seconds": 3600})
    server.enqueue(group="acme")
    assert len(server.claim()) == 1
    job = server.enqueue(group="acme")
    [reason] = explain(server, job["id"])["reasons"]
    assert (reason["kind"], reason["group"], reason["limit"], reason["per_seconds"]) == ("group_rate", "acme", 1, 3600)
    assert reason["until"] is not None
    assert not agree(server, job["id"])
    db.execute("UPDATE jobq.queue_claims SET claimed_at = now() - interval '2 hours' WHERE queue_name = 'q'")
    assert agree(server, job["id"])


def test_ordered_head(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server, ordered=True)
    head = server.enqueue(group="ledger", run_at=LATER)  # first in its group, not due: holds the group
    job = server.enqueue(group="ledger")
    [reason] = explain(server, job["id"])["reasons"]
    assert reason == {"kind": "ordered", "group": "ledger", "behind": head["id"]}
    assert kinds(server, head["id"]) == ["scheduled"]
    assert not agree(server, job["id"])
    db.execute("UPDATE jobq.jobs SET run_at = now() WHERE id = %s", (head["id"],))
    assert agree(server, head["id"])
    # The head runs: it is the next job's turn, but one job of an ordered group runs at a time.
    assert kinds(server, job["id"]) == ["group_concurrency"]
    assert not agree(server, job["id"])
    running = server.client.get("/queues/q/jobs", params={"status": "running"}).json()["jobs"]
    assert [j["id"] for j in running] == [head["id"]]


def test_waiting_for_dependencies(server: LiveServer) -> None:
    parent, done = server.enqueue("parents"), server.enqueue("parents")
    finished = server.claim_one("parents")
    assert finished["id"] == parent["id"]
    job = server.enqueue(depends_on=[parent["id"], done["id"]])
    assert explain(server, job["id"])["reasons"] == [
        {"kind": "dependencies", "waiting_for": [parent["id"], done["id"]]}
    ]
    assert not agree(server, job["id"])
    body = {"claim_token": finished["claim_token"]}
    assert server.client.post(f"/jobs/{parent['id']}/complete", json=body).status_code == 200
    assert explain(server, job["id"])["reasons"] == [{"kind": "dependencies", "waiting_for": [done["id"]]}]
    last = server.claim_one("parents")
    assert server.client.post(f"/jobs/{last['id']}/complete", json={"claim_token": last["claim_token"]}).is_success
    assert agree(server, job["id"])


def test_several_rules_at_once_and_finished_jobs(server: LiveServer) -> None:
    configure(server, concurrency=1)
    server.enqueue()
    server.claim_one()
    job = server.enqueue(run_at=LATER)
    server.client.post("/queues/q/pause")
    assert kinds(server, job["id"]) == ["paused", "scheduled", "concurrency"]
    assert not agree(server, job["id"])
    server.client.post(f"/jobs/{job['id']}/cancel", json={})
    assert explain(server, job["id"])["reasons"] == [{"kind": "finished", "status": "cancelled"}]


def test_explain_respects_scopes_and_queues(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(auth="on", api_key=ENV_KEY)
    with as_key(server, ENV_KEY) as admin:
        mine = admin.post("/queues/team-a.x/jobs", json={"payload": 1}).json()
        theirs = admin.post("/queues/team-b.x/jobs", json={"payload": 1}).json()
        with as_key(server, create_key(db, "team-a-ops", ["admin"], ["team-a.*"])) as ops:
            assert ops.get(f"/jobs/{mine['id']}/explain").json()["runnable"] is True
            a = problem(ops.get(f"/jobs/{theirs['id']}/explain"), 404, "job-not-found")
            b = problem(ops.get("/jobs/987654321/explain"), 404, "job-not-found")
            assert {**a, "instance": None} == {**b, "instance": None}
        with as_key(server, create_key(db, "worker", ["consume", "produce"])) as worker:
            problem(worker.get(f"/jobs/{mine['id']}/explain"), 403, "forbidden")
    problem(server.client.get("/jobs/0/explain"), 401, "unauthorized")


def test_bad_explain_requests(server: LiveServer) -> None:
    problem(server.client.get("/jobs/0/explain"), 422, "validation-error")
    problem(server.client.get("/jobs/abc/explain"), 404, "not-found")
    problem(server.client.get("/jobs/987654321/explain"), 404, "job-not-found")
