"""Job search (by id, idempotency key, error text, payload containment; bounded pages) and bulk actions
(cancel or retry many jobs, guarded like the single actions)."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import orjson
import psycopg

from app.db import search as store_search
from app.db import writes as store_writes
from tests.support import LiveServer, problem, wait_until
from tests.test_operations import assert_counts_true, complete, fail, lock_waiters, post, true_counts
from tests.test_security import as_key, create_key


def search(server: LiveServer, **body: Any) -> dict[str, Any]:
    r = server.client.post("/jobs/search", json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def ids(doc: dict[str, Any]) -> list[int]:
    return [j["id"] for j in doc["jobs"]]


def bulk(server: LiveServer, **body: Any) -> dict[str, Any]:
    r = server.client.post("/jobs/bulk", json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def failed_job(server: LiveServer, queue: str, payload: Any, error: str, **fields: Any) -> int:
    job = server.enqueue(queue, payload, max_attempts=1, priority=1000, **fields)  # claimed first
    claim = server.claim_one(queue)
    assert claim["id"] == job["id"]
    assert fail(server, claim, error=error).json()["status"] == "failed"
    return int(job["id"])


def all_pages(server: LiveServer, **body: Any) -> tuple[list[int], list[dict[str, Any]]]:
    """Every match, following next_cursor; and the pages."""
    found: list[int] = []
    pages = []
    cursor = None
    for _ in range(100):
        doc = search(server, **body, **({"cursor": cursor} if cursor else {}))
        pages.append(doc)
        found += ids(doc)
        cursor = doc["next_cursor"]
        if cursor is None:
            return found, pages
    raise AssertionError("the search never ended")


# --- search ----------------------------------------------------------------------------------------------------


def test_find_a_job_by_id_key_error_and_payload(server: LiveServer) -> None:
    ada = server.enqueue("emails", {"to": "ada", "order": {"id": 7, "lines": [1, 2]}}, idempotency_key="welcome-ada")
    server.enqueue("emails", {"to": "bob", "order": {"id": 8}}, idempotency_key="welcome-bob")
    same_key = server.enqueue("sms", {"to": "ada"}, idempotency_key="welcome-ada")  # keys are per queue
    dead = failed_job(server, "emails", {"to": "cy", "order": {"id": 9}}, "SMTP 550: no such recipient")
    other = failed_job(server, "sms", {"to": "cy"}, "SMTP 550: no such recipient")

    assert ids(search(server, id=ada["id"])) == [ada["id"]]
    assert search(server, id=ada["id"])["jobs"][0]["payload"] == ada["payload"]  # whole jobs
    assert ids(search(server, id=999_999)) == []
    assert ids(search(server, id=ada["id"], queue="sms")) == []  # every condition holds
    assert ids(search(server, idempotency_key="welcome-ada", queue="emails")) == [ada["id"]]
    assert ids(search(server, idempotency_key="welcome-ada")) == [same_key["id"], ada["id"]]  # newest first
    assert ids(search(server, error_contains="no such recipient")) == [other, dead]
    assert ids(search(server, error_contains="no such recipient", queue="emails", status="failed")) == [dead]
    assert ids(search(server, error_contains="NO SUCH")) == []  # case-sensitive, as redrive's
    # Containment: nested objects, arrays, on failed jobs (the index) and pending ones (a scan).
    assert ids(search(server, payload_contains={"order": {"id": 9}}, status="failed")) == [dead]
    assert ids(search(server, payload_contains={"to": "cy"}, status="failed")) == [other, dead]
    assert ids(search(server, payload_contains={"order": {"lines": [2]}})) == [ada["id"]]
    assert ids(search(server, payload_contains={"to": "ada"}, status="pending")) == [same_key["id"], ada["id"]]
    assert ids(search(server, payload_contains={"to": "ada"}, queue="emails", status="pending")) == [ada["id"]]
    assert ids(search(server, payload_contains={"to": "nobody"})) == []


def test_payload_search_on_failed_jobs_reads_the_gin_index(server: LiveServer, db: psycopg.Connection) -> None:
    """What keeps it fast on a big dead-letter set: the plan, not a timing."""
    db.execute(
        "INSERT INTO jobq.jobs (queue_name, payload, status, attempts, max_attempts, finished_at, last_error)"
        " SELECT 'q', jsonb_build_object('customer', i), 'failed', 1, 1, now(), 'boom' FROM generate_series(1, 5000) i"
    )
    db.execute("ANALYZE jobq.jobs")
    c = store_search.Criteria(statuses=("failed",), payload='{"customer": 42}')
    how = store_search.plan(c)
    params = dict.fromkeys(("queue", "id", "key", "error", "allowed", "k1"))
    params |= {"status": "failed", "statuses": ["failed"], "payload": c.payload, "after": False, "limit": 51,
               "budget": 10_000}  # fmt: skip
    with db.transaction():
        if db.execute("SELECT current_setting('citus.version', true) IS NOT NULL").fetchone() == (True,):
            db.execute("SET LOCAL citus.propagate_set_commands = 'local'")  # the SET below reaches the shards
            db.execute("SET LOCAL citus.explain_all_tasks = on")  # the shard holding queue q among them
        db.execute("SET LOCAL enable_bitmapscan = on")
        plan = "\n".join(r[0] for r in db.execute(f"EXPLAIN {how.statement}", params).fetchall())
    assert "jobs_payload_idx" in plan, plan
    assert len(search(server, payload_contains={"customer": 42}, status="failed")["jobs"]) == 1


def test_a_page_examines_a_bounded_number_of_jobs(server_factory) -> None:  # type: ignore[no-untyped-def]
    """A rare match deep in the table: each page examines at most JOBQ_SEARCH_SCAN_ROWS jobs and says where it
    stopped, and the search goes on from there."""
    server: LiveServer = server_factory(search_scan_rows=100)
    needle = server.enqueue("q", {"find": "me"})
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": {"n": i}} for i in range(250)]})

    found, pages = all_pages(server, payload_contains={"find": "me"})
    assert found == [needle["id"]]
    assert [(p["examined"], p["partial"], len(p["jobs"])) for p in pages] == [
        (100, True, 0),
        (100, True, 0),
        (51, False, 1),
    ]
    # The same bound in a queue's listing order (a queue and one status).
    found, pages = all_pages(server, payload_contains={"find": "me"}, queue="q", status="pending")
    assert found == [needle["id"]] and len(pages) == 3


def test_pages_follow_a_cursor_without_gaps_or_repeats(server: LiveServer) -> None:
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": {"k": i % 2}} for i in range(11)]})
    for body in ({"payload_contains": {"k": 1}}, {"queue": "q", "status": "pending", "payload_contains": {"k": 1}}):
        found, pages = all_pages(server, limit=2, **body)
        assert len(found) == len(set(found)) == 5, body
        assert [len(p["jobs"]) for p in pages] == [2, 2, 1]
        assert not any(p["partial"] for p in pages)


def test_search_within_a_time_limit(server_factory, database_url: str) -> None:  # type: ignore[no-untyped-def]
    """A search that cannot finish in JOBQ_SEARCH_TIMEOUT_MS is a clear 422, not a 503 or a hung request. Here it
    waits on a table lock held by another session."""
    server: LiveServer = server_factory(search_timeout_ms=200)
    server.enqueue("q", 1)
    with psycopg.connect(database_url) as tx:
        tx.execute("LOCK TABLE jobq.jobs IN ACCESS EXCLUSIVE MODE")
        body = problem(server.client.post("/jobs/search", json={"queue": "q"}), 422, "search-too-broad")
        tx.rollback()
    assert "200 ms" in body["detail"]
    assert len(search(server, queue="q")["jobs"]) == 1


def test_search_refuses_bad_input(server: LiveServer) -> None:
    bad = [
        {"limit": 0},
        {"limit": 101},
        {"status": "lost"},
        {"queue": "bad name"},
        {"id": 0},
        {"payload_contains": None},
        {"error_contains": ""},
        {"nonsense": 1},
        {"cursor": "not-a-cursor"},
        {"payload_contains": {"a": "\u0000"}},
    ]
    for body in bad:
        problem(server.client.post("/jobs/search", json=body), 422, "validation-error")
    assert server.client.post("/jobs/search", json={"limit": 100}).status_code == 200  # at the limit
    problem(server.client.post("/jobs/search", content=b"{", headers={"content-type": "application/json"}), 400,
            "malformed-request")  # fmt: skip
    # A cursor of another walk: a listing's cursor is not an id-order cursor.
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(3)]})
    cursor = search(server, queue="q", status="pending", limit=1)["next_cursor"]
    assert cursor
    problem(server.client.post("/jobs/search", json={"cursor": cursor, "limit": 1}), 422, "validation-error")


def test_search_with_a_key_limited_to_some_queues(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(auth="on")
    admin = as_key(server, create_key(db, "root", ["admin"]))
    team = as_key(server, create_key(db, "team", ["admin"], ["team-*"]))
    for queue in ("team-a", "other"):
        assert (
            admin.post(f"/queues/{queue}/jobs", json={"payload": {"x": 1}, "idempotency_key": "k"}).status_code == 201
        )
    assert len(admin.post("/jobs/search", json={"payload_contains": {"x": 1}}).json()["jobs"]) == 2
    for body in ({"payload_contains": {"x": 1}}, {"idempotency_key": "k"}):
        found = team.post("/jobs/search", json=body).json()["jobs"]
        assert [j["queue"] for j in found] == ["team-a"], body
    problem(team.post("/jobs/search", json={"queue": "other"}), 403, "forbidden")
    other = admin.post("/jobs/search", json={"queue": "other"}).json()["jobs"][0]["id"]
    assert team.post("/jobs/search", json={"id": other}).json()["jobs"] == []
    assert team.post("/jobs/bulk", json={"action": "cancel", "ids": [other]}).json()["not_found"] == 1
    problem(team.post("/jobs/bulk", json={"action": "cancel", "filter": {"queue": "other"}}), 403, "forbidden")
    assert admin.get(f"/jobs/{other}").json()["status"] == "pending"


def test_a_search_tells_nothing_of_jobs_in_queues_the_key_cannot_see(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """A key limited to some queues learns nothing from a search about other queues' jobs, not even from how
    many jobs it examined: a job there with this id, key or payload answers exactly as no such job would."""
    server: LiveServer = server_factory(auth="on")
    admin = as_key(server, create_key(db, "root", ["admin"]))
    team = as_key(server, create_key(db, "team", ["admin"], ["team-*"]))
    hidden = admin.post("/queues/other/jobs", json={"payload": {"ssn": "123"}, "idempotency_key": "k"}).json()
    assert admin.post(f"/jobs/{hidden['id']}/cancel").status_code == 200
    cancelled = {"status": "cancelled"}
    for there, missing in (
        ({"id": hidden["id"]}, {"id": hidden["id"] + 1000}),
        ({"idempotency_key": "k"}, {"idempotency_key": "nope"}),
        ({"payload_contains": {"ssn": "123"}, **cancelled}, {"payload_contains": {"ssn": "9"}, **cancelled}),
        ({"payload_contains": {"ssn": "123"}}, {"payload_contains": {"ssn": "9"}}),
    ):
        seen, unseen = team.post("/jobs/search", json=there), team.post("/jobs/search", json=missing)
        assert seen.status_code == unseen.status_code == 200
        assert seen.json() == unseen.json(), there
        assert admin.post("/jobs/search", json=there).json()["examined"] == 1, there


def test_a_search_that_runs_out_of_budget_in_other_queues_tells_nothing(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """The review's oracle: a payload held by more jobs of another tenant's queue than a page may examine made
    the page stop `partial: true` with a cursor into that queue (the search and the bulk dry run alike), while a
    payload no job holds answered `partial: false`. A key limited to some queues walks its own queues' jobs
    only: both answer alike, and no cursor points outside its queues."""
    server: LiveServer = server_factory(auth="on", search_scan_rows=100)
    admin = as_key(server, create_key(db, "root", ["admin"]))
    team = as_key(server, create_key(db, "team", ["admin"], ["team-*"]))
    mine = admin.post("/queues/team-a/jobs", json={"payload": {"ssn": "mine"}}).json()
    assert admin.post(f"/jobs/{mine['id']}/cancel").status_code == 200
    db.execute(
        "INSERT INTO jobq.jobs (queue_name, payload, status, finished_at) SELECT 'other', '{\"ssn\": \"123\"}', "
        "'cancelled', now() FROM generate_series(1, 150)"
    )  # more than one page examines, all newer than the team's job
    for walk in ({}, {"status": "cancelled"}):  # every job newest first; the payload index
        ask, nobody = {"payload_contains": {"ssn": "123"}, **walk}, {"payload_contains": {"ssn": "9"}, **walk}
        there, missing = team.post("/jobs/search", json=ask).json(), team.post("/jobs/search", json=nobody).json()
        assert there == missing, walk
        assert (there["partial"], there["next_cursor"], there["jobs"]) == (False, None, []), there
        dry = {"action": "retry", "dry_run": True}
        assert (
            team.post("/jobs/bulk", json={**dry, "filter": ask}).json()
            == team.post("/jobs/bulk", json={**dry, "filter": nobody}).json()
        )
    # A walk of every job examines the team's own only.
    page = team.post("/jobs/search", json={"error_contains": "nowhere"}).json()
    assert (page["examined"], page["partial"], page["next_cursor"]) == (1, False, None)
    found = team.post("/jobs/search", json={"payload_contains": {"ssn": "mine"}, "status": "cancelled"}).json()
    assert [j["id"] for j in found["jobs"]] == [mine["id"]]
    # An admin key that sees every queue still walks at most a page's budget, and says where to go on.
    page = admin.post("/jobs/search", json={"payload_contains": {"ssn": "9"}}).json()
    assert page["partial"] is True and page["next_cursor"] and page["examined"] == 100


# --- bulk actions ----------------------------------------------------------------------------------------------


def test_bulk_retry_by_ids(server: LiveServer, db: psycopg.Connection) -> None:
    dead = [failed_job(server, "q", i, "boom") for i in range(3)]
    cancelled = server.enqueue("q", "c")["id"]
    post(server, f"/jobs/{cancelled}/cancel")
    done = server.enqueue("q", "done")
    assert complete(server, server.claim_one("q")).status_code == 200
    busy = server.enqueue("q", "busy")
    assert server.claim_one("q")["id"] == busy["id"]
    request = {"action": "retry", "ids": [*dead, cancelled, done["id"], busy["id"], 999_999, dead[0]]}

    dry = bulk(server, **request, dry_run=True)
    assert [(o["id"], o["outcome"], o["status"]) for o in dry["jobs"]] == [
        *[(i, "done", "failed") for i in dead],
        (cancelled, "done", "cancelled"),
        (done["id"], "done", "completed"),  # named by id: replayed
        (busy["id"], "skipped", "running"),
        (999_999, "not_found", None),
    ]  # each id once, in the order given
    assert (dry["done"], dry["skipped"], dry["not_found"], dry["dry_run"]) == (5, 1, 1, True)
    assert true_counts(db)["failed"] == 3  # nothing moved

    real = bulk(server, **request)
    assert [o["status"] for o in real["jobs"]] == ["pending"] * 5 + ["running", None]
    assert (real["done"], real["skipped"], real["not_found"]) == (5, 1, 1)
    assert true_counts(db) == {"pending": 5, "running": 1}
    assert_counts_true(server, db)  # the finished-job counters moved with the jobs
    # Claimable again, attempts reset.
    assert {c["id"] for c in server.claim("q", limit=10)} == {*dead, cancelled, done["id"]}
    again = bulk(server, **request)  # nothing left to retry: every job skipped for its real state
    assert (again["done"], again["skipped"]) == (0, 6)


def test_bulk_retry_by_filter_replays_completed_jobs_only_when_asked(
    server: LiveServer, db: psycopg.Connection
) -> None:
    dead = failed_job(server, "q", "d", "boom")
    done = [server.enqueue("q", {"n": i})["id"] for i in range(3)]
    for claim in server.claim("q", limit=3):
        assert complete(server, claim, result={"ok": claim["id"]}).status_code == 200
    broad = bulk(server, action="retry", filter={"queue": "q"})
    assert [(o["id"], o["status"]) for o in broad["jobs"]] == [(dead, "pending")]  # failed and cancelled only
    replay = bulk(server, action="retry", filter={"queue": "q", "status": "completed"})
    assert sorted(o["id"] for o in replay["jobs"]) == sorted(done) and replay["done"] == 3
    assert true_counts(db) == {"pending": 4}
    assert_counts_true(server, db)
    again = {c["id"]: c for c in server.claim("q", limit=10)}
    assert set(again) == {dead, *done}
    assert [again[i]["payload"] for i in done] == [{"n": i} for i in range(3)]  # the same payload


def test_bulk_cancel_by_filter_with_a_dry_run_and_pages(server: LiveServer, db: psycopg.Connection) -> None:
    server.client.post(
        "/queues/q/jobs/batch",
        json={"jobs": [{"payload": {"batch": 7, "n": i}} for i in range(5)] + [{"payload": {"batch": 8}}]},
    )
    running = server.claim_one("q")  # batch 7, n 0: cancelled too, its worker learns it at its next heartbeat
    request = {"action": "cancel", "filter": {"queue": "q", "payload_contains": {"batch": 7}}, "reason": "withdrawn"}

    dry = bulk(server, **request, dry_run=True)
    assert dry["done"] == 5 and true_counts(db) == {"pending": 5, "running": 1}

    first = bulk(server, **request, limit=3)
    assert (first["done"], first["partial"]) == (3, False) and first["next_cursor"]
    rest = bulk(server, **request, limit=3, cursor=first["next_cursor"])
    assert (rest["done"], rest["next_cursor"]) == (2, None)
    assert {o["id"] for o in first["jobs"] + rest["jobs"]} == {j["id"] for j in server.client.post(
        "/jobs/search", json={"payload_contains": {"batch": 7}}).json()["jobs"]}  # fmt: skip
    assert true_counts(db) == {"cancelled": 5, "pending": 1}
    assert_counts_true(server, db)
    beat = post(server, f"/jobs/{running['id']}/heartbeat", {"claim_token": running["claim_token"]}).json()
    assert beat["cancel_requested"] is True
    assert server.job(running["id"])["last_error"] == "withdrawn"


def test_bulk_refuses_what_it_cannot_do(server: LiveServer) -> None:
    bad = [
        {"action": "cancel"},
        {"action": "cancel", "ids": [1], "filter": {"queue": "q"}},
        {"action": "cancel", "ids": []},
        {"action": "cancel", "ids": list(range(1, 1002))},
        {"action": "cancel", "filter": {}},
        {"action": "cancel", "ids": [1], "limit": 5},
        {"action": "retry", "ids": [1], "reason": "why"},
        {"action": "delete", "ids": [1]},
        {"action": "cancel", "filter": {"queue": "q"}, "limit": 1001},
        {"action": "retry", "filter": {"queue": "q", "status": "pending"}},
        {"action": "cancel", "filter": {"queue": "q", "status": "failed"}},
    ]
    for body in bad:
        problem(server.client.post("/jobs/bulk", json=body), 422, "validation-error")
    at_the_limit = bulk(server, action="cancel", ids=list(range(1, 1001)))
    assert at_the_limit["not_found"] == 1000
    assert bulk(server, action="retry", filter={"queue": "q"}, limit=1000)["done"] == 0


def test_a_bulk_cancel_held_up_by_a_complete_skips_that_job(
    server: LiveServer, db: psycopg.Connection, database_url: str
) -> None:
    """The guard is the single cancel's: a job completed while the bulk action waited on its row is skipped,
    and named completed; the others are cancelled."""
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(3)]})
    c = server.claim_one("q")
    others = [j["id"] for j in search(server, queue="q", status="pending")["jobs"]]
    answers: list[httpx.Response] = []
    items = orjson.dumps([{"ord": 0, "id": c["id"], "token": c["claim_token"]}]).decode()
    with psycopg.connect(database_url) as tx:  # the worker's complete, held open
        tx.execute(store_writes.JOB_COMPLETE_MANY, {"queue": "q", "items": items, "full": True})
        body = {"action": "cancel", "ids": [c["id"], *others]}
        action = threading.Thread(target=lambda: answers.append(server.client.post("/jobs/bulk", json=body)))
        action.start()
        wait_until(lambda: lock_waiters(db, "target") == 1, what="the bulk cancel to wait on the row")
        tx.commit()
        action.join()
    outcome = {o["id"]: (o["outcome"], o["status"]) for o in answers[0].json()["jobs"]}
    assert outcome == {c["id"]: ("skipped", "completed"), **{i: ("done", "cancelled") for i in others}}
    assert_counts_true(server, db)
