"""`Prefer: return=minimal` (RFC 7240) on enqueue, batch enqueue, complete and fail: ids and states only,
with Preference-Applied; without it (or with return=representation) the whole job, as always."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from app.main import published_document
from tests.support import LiveServer, problem

MINIMAL = {"Prefer": "return=minimal"}


@pytest.fixture(params=[True, False], ids=["fast-path", "fastapi"])
def either(request: pytest.FixtureRequest, server_factory) -> LiveServer:  # type: ignore[no-untyped-def]
    """The service on each HTTP path: both read the preference in the same endpoint."""
    return server_factory(fast_path=request.param)  # type: ignore[no-any-return]


def minimal_schema(operation_id: str, code: str) -> Draft202012Validator:
    """The minimal answer's schema as the published document names it (x-jobq-minimal)."""
    doc = published_document()
    ops = {op["operationId"]: op for ops in doc["paths"].values() for op in ops.values()}
    ref = ops[operation_id]["responses"][code]["x-jobq-minimal"]
    return Draft202012Validator({**ref, "components": doc["components"]})


def applied(r: httpx.Response) -> str | None:
    return r.headers.get("preference-applied")


def test_enqueue_answers_id_and_status(either: LiveServer) -> None:
    r = either.client.post("/queues/q/jobs", json={"payload": {"big": "x" * 1000}}, headers=MINIMAL)
    assert r.status_code == 201
    assert applied(r) == "return=minimal"
    body = r.json()
    assert body == {"id": body["id"], "status": "pending", "created": True, "enqueued": "created"}
    minimal_schema("enqueueJob", "201").validate(body)
    job = either.job(body["id"])  # the job itself is whole
    assert job["payload"] == {"big": "x" * 1000} and job["status"] == "pending"


def test_without_the_preference_the_answer_is_the_job(either: LiveServer) -> None:
    for headers in ({}, {"Prefer": "return=representation"}):
        r = either.client.post("/queues/q/jobs", json={"payload": 7}, headers=headers)
        assert r.status_code == 201 and applied(r) is None
        assert r.json()["payload"] == 7 and r.json() == either.job(r.json()["id"])


def test_an_idempotency_hit_says_so(either: LiveServer) -> None:
    first = either.client.post("/queues/q/jobs", json={"payload": 1, "idempotency_key": "k"}, headers=MINIMAL)
    assert first.status_code == 201 and first.json()["created"] is True
    again = either.client.post("/queues/q/jobs", json={"payload": 2, "idempotency_key": "k"}, headers=MINIMAL)
    assert again.status_code == 200 and applied(again) == "return=minimal"
    assert again.json() == {"id": first.json()["id"], "status": "pending", "created": False, "enqueued": "existing"}
    minimal_schema("enqueueJob", "200").validate(again.json())
    full = either.client.post("/queues/q/jobs", json={"payload": 3, "idempotency_key": "k"})
    assert full.status_code == 200 and full.json()["payload"] == 1 and applied(full) is None


def test_a_job_that_waits_for_another_says_so(either: LiveServer) -> None:
    parent = either.enqueue(payload=1)
    r = either.client.post("/queues/q/jobs", json={"payload": 2, "depends_on": [parent["id"]]}, headers=MINIMAL)
    assert r.status_code == 201 and applied(r) == "return=minimal"
    assert r.json() == {"id": r.json()["id"], "status": "waiting", "created": True, "enqueued": "created"}
    batch = [{"payload": 3, "ref": "a"}, {"payload": 4, "depends_on": ["a"]}]
    r = either.client.post("/queues/q/jobs/batch", json={"jobs": batch}, headers=MINIMAL)
    assert [(j["status"], j["created"]) for j in r.json()["jobs"]] == [("pending", True), ("waiting", True)]


def test_batch_enqueue_answers_ids_and_states_in_order(either: LiveServer) -> None:
    either.enqueue(payload=0, idempotency_key="taken")
    jobs = [{"payload": 1}, {"payload": 2, "idempotency_key": "taken"}, {"payload": 3, "idempotency_key": "n"},
            {"payload": 4, "idempotency_key": "n"}, {"payload": 5, "run_at": "2099-01-01T00:00:00Z"}]  # fmt: skip
    r = either.client.post("/queues/q/jobs/batch", json={"jobs": jobs}, headers=MINIMAL)
    assert r.status_code == 201 and applied(r) == "return=minimal"
    answer = r.json()["jobs"]
    minimal_schema("enqueueJobs", "201").validate(r.json())
    assert [a["created"] for a in answer] == [True, False, True, False, True]
    assert {tuple(a) for a in answer} == {("id", "status", "created", "enqueued")}
    assert answer[2]["id"] == answer[3]["id"]
    assert [either.job(a["id"])["payload"] for a in answer] == [1, 0, 3, 3, 5]
    assert [a["status"] for a in answer] == ["pending"] * 5
    full = either.client.post("/queues/q/jobs/batch", json={"jobs": jobs})
    assert full.status_code == 201 and applied(full) is None
    assert [j["payload"] for j in full.json()["jobs"]] == [1, 0, 3, 3, 5]


def test_complete_answers_id_and_status(either: LiveServer) -> None:
    either.enqueue(payload={"p": 1})
    claim = either.claim_one()
    done = {"claim_token": claim["claim_token"], "result": {"ok": True}}
    r = either.client.post(f"/jobs/{claim['id']}/complete", json=done, headers=MINIMAL)
    assert r.status_code == 200 and applied(r) == "return=minimal"
    assert r.json() == {"id": claim["id"], "status": "completed"}
    minimal_schema("completeJob", "200").validate(r.json())
    job = either.job(claim["id"])
    assert job["result"] == {"ok": True} and job["payload"] == {"p": 1}
    # A retry is answered alike, minimal or not; the first result is kept.
    again = either.client.post(f"/jobs/{claim['id']}/complete", json={**done, "result": 2}, headers=MINIMAL)
    assert again.status_code == 200 and again.json() == r.json()
    full = either.client.post(f"/jobs/{claim['id']}/complete", json=done)
    assert full.status_code == 200 and full.json()["result"] == {"ok": True} and applied(full) is None
    # Errors are the same problems.
    stale = either.client.post(f"/jobs/{claim['id']}/complete", json={"claim_token": "stale"}, headers=MINIMAL)
    problem(stale, 409, "claim-lost")
    assert applied(stale) is None
    problem(
        either.client.post("/jobs/424242/complete", json={"claim_token": "x"}, headers=MINIMAL), 404, "job-not-found"
    )


def test_fail_answers_id_and_status(either: LiveServer) -> None:
    either.enqueue(payload=1, max_attempts=2)
    claim = either.claim_one()
    body = {"claim_token": claim["claim_token"], "error": "boom", "retry_in_seconds": 0}
    r = either.client.post(f"/jobs/{claim['id']}/fail", json=body, headers=MINIMAL)
    assert r.status_code == 200 and applied(r) == "return=minimal"
    assert r.json() == {"id": claim["id"], "status": "pending"}
    minimal_schema("failJob", "200").validate(r.json())
    claim = either.claim_one()
    body = {"claim_token": claim["claim_token"], "error": "boom", "retry": False}
    r = either.client.post(f"/jobs/{claim['id']}/fail", json=body, headers=MINIMAL)
    assert r.json() == {"id": claim["id"], "status": "failed"}
    assert either.job(claim["id"])["last_error"] == "boom"


@pytest.mark.parametrize(
    ("prefer", "minimal"),
    [
        (["return=minimal"], True),
        (["RETURN = Minimal"], True),
        (['return="minimal"'], True),
        (["respond-async, return=minimal; foo=bar"], True),
        (["wait=5", "return=minimal"], True),
        # The first instance of a preference counts, over every Prefer field.
        (["return=representation, return=minimal"], False),
        (["return=representation", "return=minimal"], False),
        (["return=minimal", "return=representation"], True),
        # Values and preferences it does not know: ignored, never an error.
        (["return=bogus"], False),
        (["return"], False),
        (["returnminimal"], False),
        (["handling=strict"], False),
        ([";;;,,=="], False),
        (["minimal"], False),
    ],
)
def test_what_counts_as_asking(shared_server: LiveServer, prefer: list[str], minimal: bool) -> None:
    headers = [("Prefer", p) for p in prefer]
    r = shared_server.client.post("/queues/prefer/jobs", json={"payload": 1}, headers=headers)
    assert r.status_code == 201
    assert ("payload" not in r.json()) is minimal
    assert applied(r) == ("return=minimal" if minimal else None)


def test_answers_that_are_already_minimal_ignore_it(either: LiveServer) -> None:
    """Heartbeat, batch complete and a claim's `completed` carry ids and states already: the same answer
    with or without the preference, and no Preference-Applied."""
    for _ in range(3):
        either.enqueue(payload=1)
    a, b, c = either.claim(limit=3)
    answers: list[Any] = []
    for headers in ({}, MINIMAL):
        beat = either.client.post(f"/jobs/{a['id']}/heartbeat", json={"claim_token": a["claim_token"]}, headers=headers)
        assert beat.status_code == 200 and applied(beat) is None and set(beat.json()) == {
            "id", "lease_expires_at", "cancel_requested"}  # fmt: skip
        answers.append(beat.json()["cancel_requested"])
    r = either.client.post("/jobs/complete", json={"jobs": [{"id": b["id"], "claim_token": b["claim_token"]}]},
                           headers=MINIMAL)  # fmt: skip
    assert r.status_code == 200 and applied(r) is None
    assert r.json() == {"results": [{"id": b["id"], "outcome": "completed", "status": "completed"}]}
    complete = [{"id": c["id"], "claim_token": c["claim_token"]}]
    r = either.client.post("/queues/q/claim", json={"worker": "w", "complete": complete}, headers=MINIMAL)
    assert r.status_code == 200 and applied(r) is None
    assert r.json()["completed"] == [{"id": c["id"], "outcome": "completed", "status": "completed"}]
    assert answers == [False, False]


def test_the_contract_names_the_preference() -> None:
    doc = published_document()
    ops = {op["operationId"]: op for ops in doc["paths"].values() for op in ops.values()}
    for op_id, codes in {"enqueueJob": ("201", "200"), "enqueueJobs": ("201",), "completeJob": ("200",),
                         "failJob": ("200",)}.items():  # fmt: skip
        assert [p["name"] for p in ops[op_id]["parameters"] if p["in"] == "header"] == ["Prefer"], op_id
        for code in codes:
            assert "Preference-Applied" in ops[op_id]["responses"][code]["headers"], (op_id, code)
            schema = ops[op_id]["responses"][code]["x-jobq-minimal"]["$ref"].rsplit("/", 1)[1]
            for example in doc["components"]["schemas"][schema]["examples"]:
                minimal_schema(op_id, code).validate(example)


def test_minimal_answers_say_what_a_unique_or_debounced_enqueue_did(either: LiveServer) -> None:
    """A unique key already held answers the holder, a debounced enqueue replaces the pending job of its key:
    the minimal answer says which (`enqueued`), as the Jobq-Enqueued header does."""
    unique = {"payload": 1, "unique": {"key": "u"}}
    made = either.client.post("/queues/q/jobs", json=unique, headers=MINIMAL)
    held = either.client.post("/queues/q/jobs", json=unique, headers=MINIMAL)
    assert (made.status_code, made.json()["enqueued"], made.headers["jobq-enqueued"]) == (201, "created", "created")
    assert (held.status_code, held.json()["enqueued"], held.headers["jobq-enqueued"]) == (200, "existing", "existing")
    assert held.json() == {"id": made.json()["id"], "status": "pending", "created": False, "enqueued": "existing"}
    debounced = {"payload": "a", "debounce": {"key": "d", "seconds": 60}}
    first = either.client.post("/queues/q/jobs", json=debounced, headers=MINIMAL)
    second = either.client.post("/queues/q/jobs", json={**debounced, "payload": "b"}, headers=MINIMAL)
    assert first.json()["enqueued"] == "created"
    assert second.status_code == 200 and second.json()["enqueued"] == "replaced"
    assert second.json()["id"] == first.json()["id"] and either.job(first.json()["id"])["payload"] == "b"
    minimal_schema("enqueueJob", "200").validate(second.json())
    batch = either.client.post("/queues/q/jobs/batch", json={"jobs": [unique, {"payload": 2}]}, headers=MINIMAL)
    assert [j["enqueued"] for j in batch.json()["jobs"]] == ["existing", "created"]
