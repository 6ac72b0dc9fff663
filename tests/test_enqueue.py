"""Producers: enqueue one or a batch, scheduling, idempotency keys, and what bad input gets."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone

import httpx
import psycopg
import pytest

from tests.support import LiveServer, problem


def count_jobs(db: psycopg.Connection) -> int:
    row = db.execute("SELECT count(*) FROM jobq.jobs").fetchone()
    assert row is not None
    return int(row[0])


def db_now(db: psycopg.Connection) -> datetime:
    row = db.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_enqueue_returns_the_stored_job(server: LiveServer, db: psycopg.Connection) -> None:
    r = server.client.post("/queues/emails/jobs", json={"payload": {"to": "a@example.com", "n": [1, 2]}})
    assert r.status_code == 201
    job = r.json()
    assert job["queue"] == "emails"
    assert job["status"] == "pending"
    assert job["payload"] == {"to": "a@example.com", "n": [1, 2]}
    assert job["priority"] == 0
    assert job["attempts"] == 0
    assert job["max_attempts"] == 5
    assert "claim_token" not in job
    assert datetime.fromisoformat(job["run_at"]).tzinfo is not None
    stored = db.execute("SELECT queue_name, payload, status FROM jobq.jobs WHERE id = %s", (job["id"],)).fetchone()
    assert stored == ("emails", {"to": "a@example.com", "n": [1, 2]}, "pending")


def test_payload_values_survive_exactly(server: LiveServer) -> None:
    payload = {
        "big": 123456789012345678901234567890,
        "neg": -(2**70),
        "float": 0.1,
        "text": 'żółć ☃ \U0001f680 "quoted" \\ back',
        "nested": {"a": [None, True, False, {"b": []}]},
    }
    job = server.enqueue(payload=payload)
    assert server.job(job["id"])["payload"] == payload
    assert server.claim_one()["payload"] == payload


@pytest.mark.parametrize("payload", [None, 0, "text", [1, "a"], True])
def test_any_json_value_is_a_payload(server: LiveServer, payload: object) -> None:
    assert server.enqueue(payload=payload)["payload"] == payload


def test_delay_and_run_at_schedule_the_job(server: LiveServer, db: psycopg.Connection) -> None:
    before = db_now(db)
    delayed = server.enqueue(payload=1, delay_seconds=3600)
    assert datetime.fromisoformat(delayed["run_at"]) >= before + timedelta(seconds=3599)
    at = datetime(2099, 1, 2, 3, 4, 5, tzinfo=UTC)
    scheduled = server.enqueue(payload=2, run_at=at.isoformat())
    assert datetime.fromisoformat(scheduled["run_at"]) == at


def test_scheduled_jobs_are_not_claimed_before_they_are_due(server: LiveServer) -> None:
    server.enqueue(payload="later", delay_seconds=3600)
    server.enqueue(payload="later", run_at="2099-01-01T00:00:00Z")
    past = server.enqueue(payload="past", run_at="2001-01-01T00:00:00+02:00")
    claimed = server.claim(limit=10)
    assert [c["id"] for c in claimed] == [past["id"]]


def test_run_at_and_delay_together_are_refused(shared_server: LiveServer, shared_db: psycopg.Connection) -> None:
    r = shared_server.client.post(
        "/queues/q/jobs", json={"payload": 1, "delay_seconds": 5, "run_at": "2030-01-01T00:00:00Z"}
    )
    problem(r, 422, "validation-error")
    assert count_jobs(shared_db) == 0


def test_run_at_needs_an_offset(shared_server: LiveServer, shared_db: psycopg.Connection) -> None:
    problem(shared_server.client.post("/queues/q/jobs", json={"payload": 1, "run_at": "2030-01-01T00:00:00"}),
            422, "validation-error")  # fmt: skip
    assert count_jobs(shared_db) == 0


def test_idempotency_key_returns_the_existing_job(server: LiveServer, db: psycopg.Connection) -> None:
    first = server.client.post("/queues/q/jobs", json={"payload": 1, "idempotency_key": "order-7"})
    again = server.client.post("/queues/q/jobs", json={"payload": 2, "idempotency_key": "order-7"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    other_queue = server.client.post("/queues/other/jobs", json={"payload": 1, "idempotency_key": "order-7"})
    assert other_queue.status_code == 201
    assert count_jobs(db) == 2


def test_concurrent_duplicates_make_one_job(server: LiveServer, db: psycopg.Connection) -> None:
    results: list[httpx.Response] = []
    barrier = threading.Barrier(20)

    def post() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            barrier.wait()
            results.append(c.post("/queues/q/jobs", json={"payload": 1, "idempotency_key": "same"}))

    threads = [threading.Thread(target=post) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in results) == [200] * 19 + [201]
    assert len({r.json()["id"] for r in results}) == 1
    assert count_jobs(db) == 1


def test_batch_is_ordered_and_all_or_nothing(server: LiveServer, db: psycopg.Connection) -> None:
    jobs = [{"payload": {"n": i}, "priority": i % 3} for i in range(50)]
    r = server.client.post("/queues/q/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201
    out = r.json()["jobs"]
    assert [j["payload"]["n"] for j in out] == list(range(50))
    assert count_jobs(db) == 50

    bad = [{"payload": 1}, {"payload": 2}, {"payload": 3, "max_attempts": 0}]
    problem(server.client.post("/queues/q/jobs/batch", json={"jobs": bad}), 422, "validation-error")
    nan = b'{"jobs": [{"payload": 1}, {"payload": NaN}]}'
    problem(server.client.post("/queues/q/jobs/batch", content=nan, headers={"content-type": "application/json"}),
            422, "validation-error")  # fmt: skip
    assert count_jobs(db) == 50


def test_batch_with_a_known_key_returns_that_job_in_place(server: LiveServer) -> None:
    existing = server.enqueue(payload="old", idempotency_key="k")
    r = server.client.post(
        "/queues/q/jobs/batch", json={"jobs": [{"payload": "a"}, {"payload": "new", "idempotency_key": "k"}]}
    )
    assert r.status_code == 201
    out = r.json()["jobs"]
    assert out[1] == existing
    assert out[0]["payload"] == "a"


def test_batch_limits(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_batch_jobs=3)
    assert (
        server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(3)]}).status_code == 201
    )
    problem(server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(4)]}),
            422, "validation-error")  # fmt: skip
    problem(server.client.post("/queues/q/jobs/batch", json={"jobs": []}), 422, "validation-error")
    assert count_jobs(db) == 3


def test_a_key_twice_in_one_batch_names_one_job(server: LiveServer, db: psycopg.Connection) -> None:
    """As in two requests: the later occurrence gets the job of the first."""
    dup = {"jobs": [{"payload": 1, "idempotency_key": "x"}, {"payload": 2}, {"payload": 3, "idempotency_key": "x"}]}
    r = server.client.post("/queues/q/jobs/batch", json=dup)
    assert r.status_code == 201
    first, other, again = r.json()["jobs"]
    assert again == first and first["payload"] == 1 and other["payload"] == 2
    assert count_jobs(db) == 2


def test_batches_with_the_same_keys_in_opposite_orders_do_not_deadlock(
    server: LiveServer, db: psycopg.Connection
) -> None:
    """Two producers enqueue the same keys at once, in opposite orders. Each key names one job and
    both requests succeed: the inserts take the keys in one order, so neither statement waits on the
    other in a cycle (a deadlock, which PostgreSQL breaks by aborting one of them: a 503)."""
    deadlocks = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    before = db.execute(deadlocks).fetchone()
    codes: list[int] = []
    for round_ in range(20):
        keys = [f"r{round_}-{i:03}" for i in range(200)]
        barrier = threading.Barrier(2)

        def post(order: list[str], barrier: threading.Barrier = barrier) -> None:
            with httpx.Client(base_url=server.url, timeout=30) as c:
                barrier.wait()
                batch = {"jobs": [{"payload": k, "idempotency_key": k} for k in order]}
                codes.append(c.post("/queues/q/jobs/batch", json=batch).status_code)

        threads = [threading.Thread(target=post, args=(order,)) for order in (keys, keys[::-1])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert db.execute(deadlocks).fetchone() == before
    assert sorted(set(codes)) == [201], codes
    assert count_jobs(db) == 20 * 200


def test_a_batch_keeps_its_order_in_ids_whatever_its_keys(server: LiveServer) -> None:
    """Ids (the last tie-break of claim order) follow the batch's order, keyed jobs or not."""
    jobs = [{"payload": i, **({"idempotency_key": f"k{9 - i}"} if i % 3 else {})} for i in range(10)]
    out = server.client.post("/queues/q/jobs/batch", json={"jobs": jobs}).json()["jobs"]
    assert [j["payload"] for j in out] == list(range(10))
    assert [j["id"] for j in out] == sorted(j["id"] for j in out)
    assert [c["payload"] for c in server.claim(limit=10)] == list(range(10))


def test_a_batch_of_a_thousand_keeps_its_order_keys_and_all_its_jobs(
    server: LiveServer, db: psycopg.Connection
) -> None:
    """Past VALUES_MAX (and, on Citus, past a statement's CHUNK of rows: app/db/jobs.py _citus_insert): ids in the
    batch's order whatever its keys, a key twice names one job, a key already taken names the job holding it."""
    existing = server.enqueue(payload="old", idempotency_key="k0500")
    jobs = [{"payload": i, **({"idempotency_key": f"k{999 - i:04}"} if i % 3 else {})} for i in range(1000)]
    jobs[998] = {"payload": 998, "idempotency_key": jobs[1]["idempotency_key"]}  # the key of item 1 again
    jobs[499] = {"payload": 499, "idempotency_key": "k0500"}
    r = server.client.post("/queues/q/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201
    out = r.json()["jobs"]
    assert out[499] == existing and out[998] == out[1]
    made = [j for i, j in enumerate(out) if i not in (499, 998)]
    assert [j["payload"] for j in made] == [i for i in range(1000) if i not in (499, 998)]
    assert [j["id"] for j in made] == sorted(j["id"] for j in made) and made[0]["id"] > existing["id"]
    assert [j["idempotency_key"] for j in out] == [j.get("idempotency_key") for j in jobs]
    assert count_jobs(db) == 1 + 998


BAD_BODIES = [
    ({"payload": 1, "priority": "1"}, "string where an integer belongs"),
    ({"payload": 1, "priority": 1.5}, "fraction where an integer belongs"),
    ({"payload": 1, "priority": True}, "boolean where an integer belongs"),
    ({"payload": 1, "priority": 40000}, "priority out of range"),
    ({"payload": 1, "max_attempts": 0}, "max_attempts below 1"),
    ({"payload": 1, "max_attempts": 1001}, "max_attempts above 1000"),
    ({"payload": 1, "delay_seconds": -1}, "negative delay"),
    ({"payload": 1, "delay_seconds": "5"}, "string delay"),
    ({"payload": 1, "delay_seconds": 10**12}, "delay beyond the maximum"),
    ({"payload": 1, "idempotency_key": ""}, "empty key"),
    ({"payload": 1, "idempotency_key": "x" * 256}, "key too long"),
    ({"payload": 1, "idempotency_key": "a\nb"}, "control character in key"),
    ({"payload": 1, "status": "completed"}, "server-owned field"),
    ({"payload": 1, "id": 5}, "server-owned field"),
    ({"payload": 1, "attempts": 3}, "server-owned field"),
    ({"payload": 1, "claim_token": "x"}, "server-owned field"),
    ({"payload": "a\u0000b"}, "NUL in a string"),
    ({"payload": {"k\u0000": 1}}, "NUL in a key"),
    ({}, "no payload"),
    ([1, 2], "not an object"),
]


@pytest.mark.parametrize(("body", "why"), BAD_BODIES, ids=[w for _, w in BAD_BODIES])
def test_bad_enqueue_bodies_are_422_and_write_nothing(
    shared_server: LiveServer, shared_db: psycopg.Connection, body: object, why: str
) -> None:
    problem(shared_server.client.post("/queues/q/jobs", json=body), 422, "validation-error")
    assert count_jobs(shared_db) == 0


@pytest.mark.parametrize(
    "raw",
    [b'{"payload": 1', b"not json", b'{"payload": "\\ud800"}', b"\xff\xfe", b'{"payload": 1}}'],
    ids=["truncated", "not-json", "lone-surrogate", "bad-utf8", "trailing"],
)
def test_malformed_json_is_400(shared_server: LiveServer, shared_db: psycopg.Connection, raw: bytes) -> None:
    r = shared_server.client.post("/queues/q/jobs", content=raw, headers={"content-type": "application/json"})
    problem(r, 400, "malformed-request")
    assert count_jobs(shared_db) == 0


@pytest.mark.parametrize("raw", [b'{"payload": NaN}', b'{"payload": [Infinity]}', b'{"payload": 1e400}'])
def test_non_finite_numbers_are_refused(shared_server: LiveServer, shared_db: psycopg.Connection, raw: bytes) -> None:
    r = shared_server.client.post("/queues/q/jobs", content=raw, headers={"content-type": "application/json"})
    problem(r, 422, "validation-error")
    assert count_jobs(shared_db) == 0


def test_empty_body_is_422(shared_server: LiveServer) -> None:
    r = shared_server.client.post("/queues/q/jobs", content=b"", headers={"content-type": "application/json"})
    problem(r, 422, "validation-error")


@pytest.mark.parametrize("queue", ["a" * 129, "white%20space", "%C3%BC", "semi;colon", "star*"])
def test_bad_queue_names_are_422(shared_server: LiveServer, shared_db: psycopg.Connection, queue: str) -> None:
    problem(shared_server.client.post(f"/queues/{queue}/jobs", json={"payload": 1}), 422, "validation-error")
    assert count_jobs(shared_db) == 0


def test_a_slash_in_a_queue_name_is_no_route(shared_server: LiveServer, shared_db: psycopg.Connection) -> None:
    problem(shared_server.client.post("/queues/a%2Fb/jobs", json={"payload": 1}), 404, "not-found")
    assert count_jobs(shared_db) == 0


def test_queue_name_at_the_limit_is_accepted(server: LiveServer) -> None:
    name = "A-z_0.9:" + "x" * 120
    assert server.enqueue(queue=name, payload=1)["queue"] == name


def test_non_json_content_type_is_415(shared_server: LiveServer, shared_db: psycopg.Connection) -> None:
    r = shared_server.client.post("/queues/q/jobs", content=b'{"payload": 1}', headers={"content-type": "text/plain"})
    problem(r, 415, "unsupported-media-type")
    assert count_jobs(shared_db) == 0


def test_payload_size_limit(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_payload_bytes=1000)
    at_limit = "x" * 998  # JSON string: 998 characters + 2 quotes = 1000 bytes
    assert server.enqueue(payload=at_limit)["payload"] == at_limit
    problem(server.client.post("/queues/q/jobs", json={"payload": at_limit + "x"}), 422, "validation-error")
    assert count_jobs(db) == 1


def test_json_depth_limit(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_json_depth=5)

    def nest(n: int) -> object:
        value: object = 1
        for _ in range(n):
            value = [value]
        return value

    assert server.enqueue(payload=nest(5))["payload"] == nest(5)
    problem(server.client.post("/queues/q/jobs", json={"payload": nest(6)}), 422, "validation-error")
    assert count_jobs(db) == 1


def test_request_body_limit_with_and_without_content_length(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_request_bytes=2048, max_payload_bytes=1024)
    big = b'{"payload": "' + b"x" * 4096 + b'"}'
    r = server.client.post("/queues/q/jobs", content=big, headers={"content-type": "application/json"})
    problem(r, 413, "payload-too-large")

    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"payload": "'
        for _ in range(64):
            yield b"x" * 1024
        yield b'"}'

    r = server.client.post("/queues/q/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    problem(r, 413, "payload-too-large")
    assert count_jobs(db) == 0


def _varied_jobs(n: int, now: datetime) -> list[dict[str, object]]:
    """Plain jobs (no key) with every field an enqueue may set, and text that COPY's format must escape."""
    odd = ["back\\slash", "tab\there", "new\nline", "cr\rhere", 'quote"s', "ünïcødé ✓", "\\N", "", "a\\tb"]
    jobs: list[dict[str, object]] = []
    for i in range(n):
        job: dict[str, object] = {"payload": {"n": i, "s": odd[i % len(odd)], "nested": [{"x": 1.5}, None, True]}}
        if i % 5 == 1:
            job["priority"] = i % 7 - 3
        if i % 5 == 2:
            job["delay_seconds"] = 30.25
        if i % 5 == 3:
            job["run_at"] = (now + timedelta(hours=2, microseconds=i)).astimezone(timezone(timedelta(hours=2)))
            job["run_at"] = job["run_at"].isoformat()  # type: ignore[union-attr]
        if i % 4 == 1:
            job["max_attempts"] = 1 + i % 9
        if i % 3 == 1:
            job["group"] = ["g\\1", 'g"2', "g ✓"][i % 9 // 3]
        if i % 6 == 5:
            job["timeout_seconds"] = 60 + i
        jobs.append(job)
    jobs[0]["payload"] = "just a string with a \\ backslash"
    jobs[1]["payload"] = None
    return jobs


@pytest.mark.parametrize("minimal", [False, True], ids=["full answer", "minimal answer"])
def test_a_large_batch_without_keys_answers_each_job_as_stored(
    server: LiveServer, db: psycopg.Connection, minimal: bool
) -> None:
    """A batch of COPY_MIN or more jobs none of which has a key is written by COPY, its answer made from what was
    written (app/db/jobs.py _copy_insert): every job of the answer is the job as GET reads it back, in the batch's
    order, with the defaults, delays and run times the statement of smaller batches gives."""
    from app.db.jobs import COPY_MIN

    before = db_now(db)
    jobs = _varied_jobs(COPY_MIN + 7, before)
    headers = {"prefer": "return=minimal"} if minimal else {}
    r = server.client.post("/queues/copied/jobs/batch", json={"jobs": jobs}, headers=headers)
    assert r.status_code == 201, r.text
    out = r.json()["jobs"]
    assert len(out) == len(jobs) and count_jobs(db) == len(jobs)
    ids = [j["id"] for j in out]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    if minimal:
        assert all(j["status"] == "pending" and j["created"] and j["enqueued"] == "created" for j in out)
    else:
        assert r.json()["enqueued"] == ["created"] * len(jobs)
    stored = [server.client.get(f"/jobs/{i}").json() for i in ids]
    if not minimal:
        assert out == stored  # every field, the payload as a JSON value
    for job, got in zip(jobs, stored, strict=True):
        assert got["payload"] == job["payload"]
        assert got["priority"] == job.get("priority", 0)
        assert got["max_attempts"] == job.get("max_attempts", 5)
        assert got["group"] == job.get("group")
        assert got["timeout_seconds"] == job.get("timeout_seconds")
        created, run_at = datetime.fromisoformat(got["created_at"]), datetime.fromisoformat(got["run_at"])
        assert created >= before
        if "run_at" in job:
            assert run_at == datetime.fromisoformat(str(job["run_at"]))
        else:
            assert run_at - created == timedelta(seconds=float(job.get("delay_seconds", 0)))  # type: ignore[arg-type]
    # Claim order: priority, then run time, then id: the batch's order among equals.
    claimed = []
    while batch := server.client.post("/queues/copied/claim", json={"worker": "w", "limit": 100}).json()["jobs"]:
        claimed += batch
    due = sorted(
        (j for j in stored if datetime.fromisoformat(j["run_at"]) <= datetime.fromisoformat(stored[0]["created_at"])),
        key=lambda j: (-j["priority"], j["run_at"], j["id"]),
    )
    assert [j["id"] for j in claimed] == [j["id"] for j in due]
