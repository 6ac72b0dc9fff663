"""Every limit at its edge: at the limit passes, one past it fails (4xx, nothing written), on both paths.

Limits tested elsewhere at their edge: payload size and JSON depth (test_enqueue.py), result size and
batch complete size (test_lifecycle.py), batch enqueue size (test_batch_limits), queue name length
(test_queue_name_at_the_limit_is_accepted, test_bad_queue_names_are_422), long-poll cap
(test_waiter_cap_answers_429)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from app.db import tokens
from tests.support import LiveServer, problem

JSON = {"content-type": "application/json"}


def count_jobs(db: psycopg.Connection) -> int:
    row = db.execute("SELECT count(*) FROM jobq.jobs").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture(params=[True, False], ids=["fast-path", "fastapi"])
def fast_path(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def body_of_size(size: int) -> bytes:
    """An enqueue body of exactly `size` bytes."""
    head, tail = b'{"payload": "', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def test_request_body_at_the_limit_passes_one_past_fails(
    server_factory, db: psycopg.Connection, fast_path: bool
) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_request_bytes=2048, max_payload_bytes=2048, fast_path=fast_path)

    def chunked(body: bytes) -> Iterator[bytes]:
        for i in range(0, len(body), 100):
            yield body[i : i + 100]

    for send in (lambda b: b, chunked):
        r = server.client.post("/queues/q/jobs", content=send(body_of_size(2048)), headers=JSON)
        assert r.status_code == 201, r.text
        r = server.client.post("/queues/q/jobs", content=send(body_of_size(2049)), headers=JSON)
        problem(r, 413, "payload-too-large")
    assert count_jobs(db) == 2


def test_claim_limit(server_factory, fast_path: bool) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_claim_limit=5, fast_path=fast_path)
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(10)]})
    assert len(server.claim(limit=5)) == 5
    problem(server.client.post("/queues/q/claim", json={"worker": "w", "limit": 6}), 422, "validation-error")
    assert len(server.claim(limit=5)) == 5


def test_lease_and_wait_limits(server_factory, fast_path: bool) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(lease_max_seconds=600, lease_default_seconds=30, wait_max_seconds=2,
                                        fast_path=fast_path)  # fmt: skip
    server.enqueue(payload=1)
    server.enqueue(payload=2)
    for field, limit in (("lease_seconds", 600), ("wait_seconds", 2)):
        r = server.client.post("/queues/q/claim", json={"worker": "w", field: limit + 1})
        problem(r, 422, "validation-error")
        c = server.claim_one(**{field: limit})  # a job is ready: the claim answers at once
        if field == "lease_seconds":
            r = server.client.post(f"/jobs/{c['id']}/heartbeat", json={"claim_token": c["claim_token"], field: limit})
            assert r.status_code == 200
            r = server.client.post(f"/jobs/{c['id']}/heartbeat", json={"claim_token": c["claim_token"], field: 601})
            problem(r, 422, "validation-error")


def test_delay_limit(server_factory, db: psycopg.Connection, fast_path: bool) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_delay_seconds=100, fast_path=fast_path)
    assert server.enqueue(payload=1, delay_seconds=100)
    problem(
        server.client.post("/queues/q/jobs", json={"payload": 1, "delay_seconds": 100.001}), 422, "validation-error"
    )
    job = server.enqueue(payload=2)
    c = server.claim_one()
    assert c["id"] == job["id"]
    r = server.client.post(f"/jobs/{c['id']}/fail", json={"claim_token": c["claim_token"], "error": "e",
                                                          "retry_in_seconds": 101})  # fmt: skip
    problem(r, 422, "validation-error")
    r = server.client.post(f"/jobs/{c['id']}/fail", json={"claim_token": c["claim_token"], "error": "e",
                                                          "retry_in_seconds": 100})  # fmt: skip
    assert r.status_code == 200
    assert count_jobs(db) == 2


@pytest.mark.parametrize("char", ["k", "ż", "\U0001f680"], ids=["ascii", "2-byte", "4-byte"])
def test_idempotency_key_length(server_factory, db: psycopg.Connection, fast_path: bool, char: str) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_idempotency_key_length=10, fast_path=fast_path)
    assert server.enqueue(payload=1, idempotency_key=char * 10)["idempotency_key"] == char * 10
    problem(server.client.post("/queues/q/jobs", json={"payload": 1, "idempotency_key": char * 11}),
            422, "validation-error")  # fmt: skip
    batch = {"jobs": [{"payload": 1, "idempotency_key": char * 11}]}
    problem(server.client.post("/queues/q/jobs/batch", json=batch), 422, "validation-error")
    assert count_jobs(db) == 1


def test_the_largest_idempotency_key_fits_the_index(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """The setting's ceiling (512 characters) of 4-byte characters, on the longest queue name."""
    server: LiveServer = server_factory(max_idempotency_key_length=512)
    queue = "q" * 128
    key = "\U0001f680" * 512
    assert server.enqueue(queue=queue, payload=1, idempotency_key=key)["idempotency_key"] == key
    assert server.client.post(f"/queues/{queue}/jobs", json={"payload": 2, "idempotency_key": key}).status_code == 200
    assert count_jobs(db) == 1


def test_worker_length(server_factory, db: psycopg.Connection, fast_path: bool) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_worker_length=8, fast_path=fast_path)
    job = server.enqueue(payload=1)
    problem(server.client.post("/queues/q/claim", json={"worker": "w" * 9}), 422, "validation-error")
    assert server.job(job["id"])["status"] == "pending"
    assert server.claim_one(worker="w" * 8)["id"] == job["id"]
    assert server.job(job["id"])["worker"] == "w" * 8


def test_claim_token_length(server: LiveServer) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    # 43 random characters and a queue name of up to 128 in base64url (app/db/tokens.py): 214 at most.
    longest = "x" * tokens.MAX_CHARS
    problem(server.client.post(f"/jobs/{c['id']}/heartbeat", json={"claim_token": longest}), 409, "claim-lost")
    problem(
        server.client.post(f"/jobs/{c['id']}/heartbeat", json={"claim_token": longest + "x"}), 422, "validation-error"
    )


def test_error_text_is_stored_whole_at_the_limit_and_cut_past_it(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_error_bytes=100)

    def fail_with(text: str) -> str:
        server.enqueue(payload=1)
        c = server.claim_one()
        r = server.client.post(f"/jobs/{c['id']}/fail", json={"claim_token": c["claim_token"], "error": text})
        assert r.status_code == 200, r.text
        stored: str = r.json()["last_error"]
        return stored

    exact = "é" * 50  # 100 bytes of UTF-8
    assert fail_with(exact) == exact
    cut = fail_with(exact + "x")
    assert cut.endswith(" [truncated]") and len(cut.encode()) <= 100
    # Control characters are removed before measuring: 100 bytes of text plus a NUL and an escape fit.
    assert fail_with("\x00" + exact + "\x1b") == exact


def test_error_text_in_a_request(server: LiveServer) -> None:
    from app.models.fields import ERROR_MAX_CHARS

    server.enqueue(payload=1)
    c = server.claim_one()
    body: dict[str, Any] = {"claim_token": c["claim_token"], "error": "e" * (ERROR_MAX_CHARS + 1)}
    problem(server.client.post(f"/jobs/{c['id']}/fail", json=body), 422, "validation-error")
    body["error"] = "e" * ERROR_MAX_CHARS
    assert server.client.post(f"/jobs/{c['id']}/fail", json=body).status_code == 200


def test_result_depth_limit(server_factory, fast_path: bool) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_json_depth=4, fast_path=fast_path)
    server.enqueue(payload=1)
    c = server.claim_one()
    at_limit = {"claim_token": c["claim_token"], "result": {"a": [[{}]]}}  # 4 levels of containers
    too_deep = {"claim_token": c["claim_token"], "result": {"a": [[{"b": [1]}]]}}  # 5
    problem(server.client.post(f"/jobs/{c['id']}/complete", json=too_deep), 422, "validation-error")
    assert server.job(c["id"])["status"] == "running"
    assert server.client.post(f"/jobs/{c['id']}/complete", json=at_limit).status_code == 200


def test_the_deepest_setting_fits_a_batch(server_factory, db: psycopg.Connection, fast_path: bool) -> None:  # type: ignore[no-untyped-def]
    """JOBQ_MAX_JSON_DEPTH's ceiling still leaves room for the batch envelope under the parser's limit."""
    server: LiveServer = server_factory(max_json_depth=128, fast_path=fast_path)

    def nest(n: int) -> object:
        value: object = 1
        for _ in range(n):
            value = [value]
        return value

    r = server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": nest(128)}]})
    assert r.status_code == 201, r.text
    r = server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": nest(129)}]})
    problem(r, 422, "validation-error")
    assert count_jobs(db) == 1


def test_job_ids_are_int64(server: LiveServer, fast_path: bool) -> None:
    top = 2**63 - 1
    problem(server.client.get(f"/jobs/{top}"), 404, "job-not-found")
    problem(server.client.get(f"/jobs/{top + 1}"), 422, "validation-error")
    problem(server.client.post(f"/jobs/{top + 1}/complete", json={"claim_token": "x"}), 422, "validation-error")
    r = server.client.post("/jobs/complete", json={"jobs": [{"id": top, "claim_token": "x"}]})
    assert r.json()["results"] == [{"id": top, "outcome": "not_found", "status": None}]
    problem(server.client.post("/jobs/complete", json={"jobs": [{"id": top + 1, "claim_token": "x"}]}),
            422, "validation-error")  # fmt: skip


def test_times_are_rfc3339_strings(server: LiveServer, db: psycopg.Connection) -> None:
    bad = (0, 1700000000, 1.5, True, "2030-01-01T00:00:00", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00")
    for run_at in bad:
        problem(server.client.post("/queues/q/jobs", json={"payload": 1, "run_at": run_at}), 422, "validation-error")
    assert server.enqueue(payload=1, run_at="2030-01-01T00:00:00+02:00")["run_at"] == "2029-12-31T22:00:00+00:00"
    # RFC 3339 allows offsets up to 23:59; PostgreSQL stores only up to 15:59: the instant is what counts.
    assert (
        server.enqueue(payload=1, run_at="1981-04-21T03:12:28.1+20:09")["run_at"] == "1981-04-20T07:03:28.100000+00:00"
    )
    assert server.enqueue(payload=1, run_at="0001-01-01T00:00:00Z")["run_at"] == "0001-01-01T00:00:00+00:00"
    assert count_jobs(db) == 3


SERVER_OWNED = ["id", "queue", "status", "attempts", "claim_token", "lease_expires_at", "claimed_at", "finished_at",
                "created_at", "worker", "last_error", "result", "lease_seconds", "locked_by"]  # fmt: skip


@pytest.mark.parametrize("field", SERVER_OWNED)
def test_server_owned_fields_are_refused_not_stored(
    shared_server: LiveServer, shared_db: psycopg.Connection, field: str
) -> None:
    """Mass assignment: a client cannot set what the server owns, in a single or a batch enqueue."""
    body = problem(
        shared_server.client.post("/queues/q/jobs", json={"payload": 1, field: None}), 422, "validation-error"
    )
    assert body["errors"] == [
        {"loc": ["body", field], "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}
    ]
    batch = {"jobs": [{"payload": 1}, {"payload": 2, field: "x"}]}
    problem(shared_server.client.post("/queues/q/jobs/batch", json=batch), 422, "validation-error")
    assert count_jobs(shared_db) == 0


def test_operator_text_follows_the_same_rules(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """A cancel reason is stored as last_error: control characters removed, cut to JOBQ_MAX_ERROR_BYTES.
    A redrive filter with NUL matches nothing (no stored error can hold one) instead of failing."""
    server: LiveServer = server_factory(max_error_bytes=100)
    job = server.enqueue(payload=1)
    r = server.client.post(f"/jobs/{job['id']}/cancel", json={"reason": "by\x00 ops\x1b " + "é" * 100})
    assert r.status_code == 200
    stored = r.json()["last_error"]
    assert stored.startswith("by ops ") and stored.endswith(" [truncated]") and len(stored.encode()) <= 100
    r = server.client.post("/queues/q/redrive", json={"error_contains": "a\x00b", "limit": 5.0})
    assert r.json() == {"queue": "q", "dry_run": False, "jobs": 0}


def test_an_optional_body_that_is_sent_must_be_an_object(server: LiveServer) -> None:
    job = server.enqueue(payload=1)
    for path in (f"/jobs/{job['id']}/cancel", "/queues/q/redrive"):
        problem(server.client.post(path, content=b"null", headers=JSON), 422, "validation-error")
        problem(server.client.post(path, content=b"[]", headers=JSON), 422, "validation-error")
    assert server.client.post("/queues/q/redrive").status_code == 200  # left out: the defaults
    assert server.client.post(f"/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
