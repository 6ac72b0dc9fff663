"""Heartbeat, complete, fail, batch complete, and the claim token rules that guard them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from app.db import tokens
from tests.support import LiveServer, problem, record_wakeups, settle_long_poll

FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def post(server: LiveServer, path: str, body: dict[str, Any]) -> Any:
    return server.client.post(path, json=body)


def row(db: psycopg.Connection, job_id: int) -> dict[str, Any]:
    cur = db.execute("SELECT * FROM jobq.jobs WHERE id = %s", (job_id,))
    names = [d.name for d in cur.description or []]
    found = cur.fetchone()
    assert found is not None
    return dict(zip(names, found, strict=True))


def sweep(server: LiveServer, now: datetime = FAR_FUTURE) -> Any:
    return server.run(lambda: server.services.maintenance["rescuer"].run_once(now=now))


# --- heartbeat ----------------------------------------------------------------------------------------------


def test_heartbeat_extends_the_lease(server: LiveServer, db: psycopg.Connection) -> None:
    server.enqueue(payload=1)
    c = server.claim_one(lease_seconds=60)
    r = post(server, f"/jobs/{c['id']}/heartbeat", {"claim_token": c["claim_token"], "lease_seconds": 600})
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == c["id"]
    assert datetime.fromisoformat(body["lease_expires_at"]) > datetime.fromisoformat(c["lease_expires_at"])
    assert row(db, c["id"])["lease_expires_at"] == datetime.fromisoformat(body["lease_expires_at"])


def test_bare_heartbeat_renews_by_the_claims_lease(server: LiveServer, db: psycopg.Connection) -> None:
    server.enqueue(payload=1)
    c = server.claim_one(lease_seconds=300)
    r = post(server, f"/jobs/{c['id']}/heartbeat", {"claim_token": c["claim_token"]})
    assert r.status_code == 200
    got = db.execute("SELECT lease_expires_at - now() FROM jobq.jobs WHERE id = %s", (c["id"],)).fetchone()
    assert got is not None and timedelta(seconds=290) < got[0] <= timedelta(seconds=300)


def test_heartbeat_errors(server: LiveServer) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    problem(post(server, f"/jobs/{c['id']}/heartbeat", {"claim_token": "wrong"}), 409, "claim-lost")
    problem(post(server, "/jobs/987654/heartbeat", {"claim_token": "x"}), 404, "job-not-found")
    bad = {"claim_token": c["claim_token"], "lease_seconds": 43201}
    problem(post(server, f"/jobs/{c['id']}/heartbeat", bad), 422, "validation-error")
    problem(post(server, f"/jobs/{c['id']}/heartbeat", {}), 422, "validation-error")
    problem(post(server, "/jobs/0/heartbeat", {"claim_token": "x"}), 422, "validation-error")
    problem(post(server, f"/jobs/{2**63}/heartbeat", {"claim_token": "x"}), 422, "validation-error")


def test_heartbeat_progress_is_kept_shown_replaced_and_cleared_by_the_next_claim(server: LiveServer) -> None:
    job = server.enqueue(payload=1)
    c = server.claim_one()
    assert server.client.get(f"/jobs/{job['id']}").json()["progress"] is None
    beat = {"claim_token": c["claim_token"], "progress": {"done": 40, "total": 100}}
    assert post(server, f"/jobs/{c['id']}/heartbeat", beat).status_code == 200
    assert server.client.get(f"/jobs/{job['id']}").json()["progress"] == {"done": 40, "total": 100}
    # A beat without progress leaves it; one with progress replaces it; null clears it.
    assert post(server, f"/jobs/{c['id']}/heartbeat", {"claim_token": c["claim_token"]}).status_code == 200
    assert server.client.get(f"/jobs/{job['id']}").json()["progress"] == {"done": 40, "total": 100}
    assert post(server, f"/jobs/{c['id']}/heartbeat", beat | {"progress": "uploading"}).status_code == 200
    assert server.client.get(f"/jobs/{job['id']}").json()["progress"] == "uploading"
    assert post(server, f"/jobs/{c['id']}/heartbeat", beat | {"progress": None}).status_code == 200
    assert server.client.get(f"/jobs/{job['id']}").json()["progress"] is None
    # It stays with the job through a fail (the last attempt's progress is worth seeing), and the next
    # claim starts without it.
    assert post(server, f"/jobs/{c['id']}/heartbeat", beat | {"progress": 7}).status_code == 200
    failed = post(server, f"/jobs/{c['id']}/fail", {"claim_token": c["claim_token"], "error": "x",
                                                     "retry_in_seconds": 0})  # fmt: skip
    assert failed.status_code == 200
    assert server.client.get(f"/jobs/{job['id']}").json()["progress"] == 7
    again = server.claim_one()
    assert again["id"] == job["id"]
    assert server.client.get(f"/jobs/{job['id']}").json()["progress"] is None


def test_progress_of_a_stale_claim_or_too_big_is_refused(server: LiveServer) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    stale = {"claim_token": "not-the-token", "progress": {"done": 1}}
    problem(post(server, f"/jobs/{c['id']}/heartbeat", stale), 409, "claim-lost")
    assert server.client.get(f"/jobs/{c['id']}").json()["progress"] is None
    big = {"claim_token": c["claim_token"], "progress": "x" * server.settings.max_progress_bytes}
    problem(post(server, f"/jobs/{c['id']}/heartbeat", big), 422, "validation-error")
    bad = {"claim_token": c["claim_token"], "progress": "\u0000"}
    problem(post(server, f"/jobs/{c['id']}/heartbeat", bad), 422, "validation-error")
    assert server.client.get(f"/jobs/{c['id']}").json()["progress"] is None


def test_heartbeats_of_one_claim_sharing_a_statement_keep_the_latest_progress(server: LiveServer) -> None:
    """Concurrent heartbeats of one job are coalesced into one statement: whatever their order, the latest
    progress reported stays (a beat without progress does not undo it) and every beat is renewed."""
    from app.db import writes as store_writes
    from app.db.writes import Heartbeat

    server.enqueue(payload=1)
    c = server.claim_one()

    def beats(*items: Heartbeat) -> list[str]:
        async def go() -> list[str]:
            async with server.services.db.connection() as conn:
                return [r.outcome for r in await store_writes.jobs_heartbeat(conn, list(items))]

        return server.run(go)

    plain = Heartbeat(c["id"], c["claim_token"], None)
    first = Heartbeat(c["id"], c["claim_token"], None, None, '{"done": 1}', set_progress=True)
    second = Heartbeat(c["id"], c["claim_token"], None, None, '{"done": 2}', set_progress=True)
    for batch, shown in [([first, plain], 1), ([plain, second], 2), ([second, first], 1), ([first, second, plain], 2)]:
        assert beats(*batch) == ["ok"] * len(batch)
        assert server.client.get(f"/jobs/{c['id']}").json()["progress"] == {"done": shown}, batch


# --- complete -----------------------------------------------------------------------------------------------


def test_complete_stores_the_result(server: LiveServer, db: psycopg.Connection) -> None:
    job = server.enqueue(payload={"n": 1})
    c = server.claim_one()
    r = post(server, f"/jobs/{c['id']}/complete", {"claim_token": c["claim_token"], "result": {"sent": True}})
    assert r.status_code == 200
    done = r.json()
    assert (done["id"], done["status"], done["result"], done["payload"]) == (job["id"], "completed",
                                                                              {"sent": True}, {"n": 1})  # fmt: skip
    assert done["finished_at"] is not None and done["lease_expires_at"] is None
    assert "claim_token" not in done
    stored = row(db, job["id"])
    assert (stored["status"], stored["result"]) == ("completed", {"sent": True})


def test_retried_complete_with_the_same_token_is_200(server: LiveServer, db: psycopg.Connection) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    first = post(server, f"/jobs/{c['id']}/complete", {"claim_token": c["claim_token"], "result": 1})
    again = post(server, f"/jobs/{c['id']}/complete", {"claim_token": c["claim_token"], "result": 2})
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json() == first.json()
    assert row(db, c["id"])["result"] == 1  # the first result is kept


def test_after_complete_the_token_can_do_nothing_else(server: LiveServer) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    assert post(server, f"/jobs/{c['id']}/complete", {"claim_token": c["claim_token"]}).status_code == 200
    problem(post(server, f"/jobs/{c['id']}/heartbeat", {"claim_token": c["claim_token"]}), 409, "claim-lost")
    problem(post(server, f"/jobs/{c['id']}/fail", {"claim_token": c["claim_token"], "error": "x"}),
            409, "claim-lost")  # fmt: skip


def test_complete_errors_change_nothing(server: LiveServer, db: psycopg.Connection) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    before = row(db, c["id"])
    problem(post(server, f"/jobs/{c['id']}/complete", {"claim_token": "not-the-token"}), 409, "claim-lost")
    problem(post(server, "/jobs/424242/complete", {"claim_token": "x"}), 404, "job-not-found")
    raw = b'{"claim_token": "%s", "result": NaN}' % c["claim_token"].encode()
    r = server.client.post(f"/jobs/{c['id']}/complete", content=raw, headers={"content-type": "application/json"})
    problem(r, 422, "validation-error")
    problem(post(server, f"/jobs/{c['id']}/complete", {"claim_token": c["claim_token"], "extra": 1}),
            422, "validation-error")  # fmt: skip
    assert row(db, c["id"]) == before


def test_result_size_limit(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_result_bytes=100)
    server.enqueue(payload=1)
    c = server.claim_one()
    too_big = {"claim_token": c["claim_token"], "result": "x" * 99}
    problem(post(server, f"/jobs/{c['id']}/complete", too_big), 422, "validation-error")
    assert row(db, c["id"])["status"] == "running"
    fits = {"claim_token": c["claim_token"], "result": "x" * 98}
    assert post(server, f"/jobs/{c['id']}/complete", fits).status_code == 200


# --- fail ---------------------------------------------------------------------------------------------------


def test_fail_schedules_a_retry_with_backoff(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(backoff_base_seconds=100, backoff_cap_seconds=1000)
    server.enqueue(payload=1)
    c = server.claim_one()
    r = post(server, f"/jobs/{c['id']}/fail", {"claim_token": c["claim_token"], "error": "smtp 451"})
    assert r.status_code == 200
    job = r.json()
    assert (job["status"], job["attempts"], job["last_error"]) == ("pending", 1, "smtp 451")
    delay = db.execute("SELECT run_at - now() FROM jobq.jobs WHERE id = %s", (c["id"],)).fetchone()[0]  # type: ignore[index]
    assert timedelta(seconds=49) <= delay <= timedelta(seconds=100)  # equal jitter: 50-100% of 100 s
    assert server.claim() == []  # not due yet


def test_backoff_grows_and_is_capped(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(backoff_base_seconds=10, backoff_cap_seconds=35)
    job = server.enqueue(payload=1, max_attempts=10)
    delays = []
    for _ in range(4):
        db.execute("UPDATE jobq.jobs SET run_at = now() WHERE id = %s", (job["id"],))
        c = server.claim_one()
        assert post(server, f"/jobs/{c['id']}/fail", {"claim_token": c["claim_token"], "error": "e"}).status_code == 200
        delays.append(db.execute("SELECT extract(epoch FROM run_at - now()) FROM jobq.jobs WHERE id = %s",
                                 (job["id"],)).fetchone()[0])  # type: ignore[index]  # fmt: skip
    # attempt n waits between half and all of min(35, 10 * 2^(n-1))
    for n, d in enumerate(delays, start=1):
        full = min(35, 10 * 2 ** (n - 1))
        assert full / 2 - 1 <= float(d) <= full


def test_fail_with_retry_in_seconds(server: LiveServer, db: psycopg.Connection) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    body = {"claim_token": c["claim_token"], "error": "rate limited", "retry_in_seconds": 7200}
    assert post(server, f"/jobs/{c['id']}/fail", body).status_code == 200
    delay = db.execute("SELECT run_at - now() FROM jobq.jobs WHERE id = %s", (c["id"],)).fetchone()[0]  # type: ignore[index]
    assert timedelta(seconds=7190) < delay <= timedelta(seconds=7200)


def test_fail_without_retry_is_terminal(server: LiveServer) -> None:
    server.enqueue(payload=1, max_attempts=5)
    c = server.claim_one()
    r = post(
        server,
        f"/jobs/{c['id']}/fail",
        {"claim_token": c["claim_token"], "error": "bad input", "retry": False},
    )
    job = r.json()
    assert (job["status"], job["attempts"], job["last_error"]) == ("failed", 1, "bad input")
    assert job["finished_at"] is not None
    assert server.claim() == []


def test_exhausted_attempts_end_in_failed(server: LiveServer, db: psycopg.Connection) -> None:
    job = server.enqueue(payload=1, max_attempts=2)
    for attempt in (1, 2):
        db.execute("UPDATE jobq.jobs SET run_at = now() WHERE id = %s", (job["id"],))
        c = server.claim_one()
        assert c["attempts"] == attempt
        r = post(server, f"/jobs/{c['id']}/fail", {"claim_token": c["claim_token"], "error": f"try {attempt}"})
        assert r.json()["status"] == ("pending" if attempt == 1 else "failed")
    final = server.job(job["id"])
    assert (final["status"], final["attempts"], final["last_error"]) == ("failed", 2, "try 2")


def test_retried_fail_with_the_same_token_is_200_and_changes_nothing(
    server: LiveServer, db: psycopg.Connection
) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    first = post(server, f"/jobs/{c['id']}/fail", {"claim_token": c["claim_token"], "error": "one"})
    stored = row(db, c["id"])
    again = post(server, f"/jobs/{c['id']}/fail", {"claim_token": c["claim_token"], "error": "two"})
    assert (first.status_code, again.status_code) == (200, 200)
    assert row(db, c["id"]) == stored


def test_error_text_is_sanitised_and_truncated(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_error_bytes=100)
    server.enqueue(payload=1)
    c = server.claim_one()
    text = "line1\nline2\ttab\x00nul\x1b[31mansi\x7f" + "é" * 200
    assert post(server, f"/jobs/{c['id']}/fail", {"claim_token": c["claim_token"], "error": text}).status_code == 200
    stored = row(db, c["id"])["last_error"]
    assert stored.startswith("line1\nline2\ttabnul[31mansi")
    assert stored.endswith(" [truncated]")
    assert len(stored.encode()) <= 100


def test_fail_errors(server: LiveServer) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    problem(post(server, f"/jobs/{c['id']}/fail", {"claim_token": c["claim_token"]}), 422, "validation-error")
    problem(post(server, f"/jobs/{c['id']}/fail", {"claim_token": c["claim_token"], "error": "e", "retry": "no"}),
            422, "validation-error")  # fmt: skip
    problem(post(server, f"/jobs/{c['id']}/fail", {"claim_token": c["claim_token"], "error": "e",
                                                    "retry_in_seconds": -1}), 422, "validation-error")  # fmt: skip
    problem(post(server, f"/jobs/{c['id']}/fail", {"claim_token": "nope", "error": "e"}), 409, "claim-lost")
    problem(post(server, "/jobs/31337/fail", {"claim_token": "nope", "error": "e"}), 404, "job-not-found")
    assert server.job(c["id"])["status"] == "running"


# --- stale claims, the sweeper ------------------------------------------------------------------------------


def test_a_stale_token_gets_409_and_changes_nothing(server: LiveServer, db: psycopg.Connection) -> None:
    """Worker A's lease lapses, the sweeper returns the job, worker B claims it: A can do nothing."""
    job = server.enqueue(payload=1)
    a = server.claim_one(worker="a", lease_seconds=1)
    assert sweep(server).rescued == 1
    b = server.claim_one(worker="b")
    assert b["id"] == job["id"] and b["attempts"] == 2 and b["claim_token"] != a["claim_token"]
    before = row(db, job["id"])
    stale = a["claim_token"]
    problem(post(server, f"/jobs/{job['id']}/heartbeat", {"claim_token": stale}), 409, "claim-lost")
    problem(post(server, f"/jobs/{job['id']}/complete", {"claim_token": stale, "result": "a"}), 409, "claim-lost")
    problem(post(server, f"/jobs/{job['id']}/fail", {"claim_token": stale, "error": "a"}), 409, "claim-lost")
    assert row(db, job["id"]) == before
    assert post(server, f"/jobs/{job['id']}/complete", {"claim_token": b["claim_token"]}).status_code == 200


def test_lapsed_but_unswept_claim_may_still_finish(server: LiveServer) -> None:
    """A lease is a promise not to hand the job to someone else before it lapses; until another claim
    replaces it, the holder's late complete is still accepted."""
    server.enqueue(payload=1)
    c = server.claim_one(lease_seconds=1)
    assert post(server, f"/jobs/{c['id']}/complete", {"claim_token": c["claim_token"]}).status_code == 200


def test_a_worker_that_always_dies_ends_in_failed(server: LiveServer) -> None:
    job = server.enqueue(payload="poison", max_attempts=3)
    for attempt in (1, 2, 3):
        c = server.claim_one()
        assert (c["id"], c["attempts"]) == (job["id"], attempt)
        result = sweep(server)  # the worker never comes back
        assert (result.rescued, result.failed) == ((1, 0) if attempt < 3 else (0, 1))
    final = server.job(job["id"])
    assert (final["status"], final["attempts"]) == ("failed", 3)
    assert final["last_error"] == "lease expired on the last attempt"
    assert server.claim() == []


def test_sweeper_leaves_live_leases_alone(server: LiveServer) -> None:
    server.enqueue(payload=1)
    c = server.claim_one(lease_seconds=600)
    assert sweep(server, now=datetime.now(UTC)).rescued == 0
    assert server.job(c["id"])["status"] == "running"


def test_rescued_job_records_why(server: LiveServer) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    sweep(server)
    job = server.job(c["id"])
    assert (job["status"], job["attempts"], job["last_error"]) == ("pending", 1, "lease expired")
    assert job["lease_expires_at"] is None


def test_sweeper_works_in_batches(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(sweep_batch_size=7)
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(40)]})
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i, "max_attempts": 1} for i in range(9)]})
    assert len(server.claim(limit=49)) == 49
    result = sweep(server)
    assert (result.rescued, result.failed) == (40, 9)


def test_concurrent_sweeps_touch_each_row_once(server_factory) -> None:  # type: ignore[no-untyped-def]
    a: LiveServer = server_factory(sweep_batch_size=10)
    b: LiveServer = server_factory(sweep_batch_size=10)
    a.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(300)]})
    assert len(a.claim(limit=100)) + len(a.claim(limit=100)) + len(a.claim(limit=100)) == 300
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(sweep, [a, b]))
    assert sum(r.rescued for r in results) == 300


def test_sweeper_wakes_waiting_workers(server_factory) -> None:  # type: ignore[no-untyped-def]
    import threading

    server: LiveServer = server_factory(poll_interval_seconds=60)
    job = server.enqueue(payload=1)
    server.claim_one(lease_seconds=1)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.extend(server.claim(worker="second", wait_seconds=20)))
    t.start()
    from tests.support import wait_until

    wait_until(lambda: server.services.dispatcher.parked == 1)
    sweep(server)
    t.join()
    assert [j["id"] for j in got] == [job["id"]]


def test_background_sweeper_runs_by_itself(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(sweep_interval_seconds=0.1)
    server.enqueue(payload=1)
    c = server.claim_one(lease_seconds=1)
    jobs = server.claim(wait_seconds=20)  # the lease lapses, the sweeper returns it, this claim gets it
    assert [j["id"] for j in jobs] == [c["id"]]
    assert jobs[0]["attempts"] == 2


# --- batch complete -----------------------------------------------------------------------------------------


def test_batch_complete_reports_each_item(server: LiveServer, db: psycopg.Connection) -> None:
    for i in range(3):
        server.enqueue(payload=i)
    a, b, c = server.claim(limit=3)
    assert post(server, f"/jobs/{c['id']}/complete", {"claim_token": c["claim_token"]}).status_code == 200
    body = {
        "jobs": [
            {"id": a["id"], "claim_token": a["claim_token"], "result": {"ok": 1}},
            {"id": b["id"], "claim_token": "stale"},
            {"id": c["id"], "claim_token": c["claim_token"]},
            {"id": 99999, "claim_token": "x"},
        ]
    }
    r = post(server, "/jobs/complete", body)
    assert r.status_code == 200
    assert r.json()["results"] == [
        {"id": a["id"], "outcome": "completed", "status": "completed"},
        {"id": b["id"], "outcome": "claim_lost", "status": "running"},
        {"id": c["id"], "outcome": "completed", "status": "completed"},
        {"id": 99999, "outcome": "not_found", "status": None},
    ]
    assert row(db, a["id"])["result"] == {"ok": 1}
    assert row(db, b["id"])["status"] == "running"


def test_an_id_twice_in_a_batch_complete(server: LiveServer, db: psycopg.Connection) -> None:
    """Each item gets its own outcome; of two items with the claim's token, the first one's result is
    kept, exactly as when the second is a retry sent later."""
    server.enqueue(payload=1)
    c = server.claim_one()
    items = [
        {"id": c["id"], "claim_token": "wrong"},
        {"id": c["id"], "claim_token": c["claim_token"], "result": "first"},
        {"id": c["id"], "claim_token": c["claim_token"], "result": "second"},
    ]
    r = post(server, "/jobs/complete", {"jobs": items})
    assert [x["outcome"] for x in r.json()["results"]] == ["claim_lost", "completed", "completed"]
    assert row(db, c["id"])["result"] == "first"


def test_batch_complete_limits(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_batch_complete=2)
    items = [{"id": i, "claim_token": "t"} for i in range(1, 4)]
    problem(post(server, "/jobs/complete", {"jobs": items}), 422, "validation-error")
    problem(post(server, "/jobs/complete", {"jobs": []}), 422, "validation-error")
    assert post(server, "/jobs/complete", {"jobs": items[:2]}).status_code == 200


# --- reads --------------------------------------------------------------------------------------------------


def test_get_job(server: LiveServer) -> None:
    job = server.enqueue(payload={"a": 1}, idempotency_key="k1")
    got = server.job(job["id"])
    assert got == job
    server.claim_one()
    got = server.job(job["id"])
    assert got["status"] == "running" and "claim_token" not in got
    problem(server.client.get("/jobs/555555"), 404, "job-not-found")
    problem(server.client.get("/jobs/nope"), 404, "not-found")  # no route: ids are digits
    problem(server.client.get("/jobs/0"), 422, "validation-error")


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
def test_wrong_method_is_405(shared_server: LiveServer, method: str) -> None:
    problem(shared_server.client.request(method, "/queues/q/jobs"), 405, "method-not-allowed")


def test_a_retry_asked_for_now_wakes_a_waiting_long_poll(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(poll_interval_seconds=60)  # no fallback poll within the wait
    job = server.enqueue(payload=1)
    c = server.claim_one(worker="first")
    answer = server.claim_in_background(wait_seconds=20)
    settle_long_poll(server)
    woken = record_wakeups(server)
    r = server.client.post(
        f"/jobs/{c['id']}/fail", json={"claim_token": c["claim_token"], "error": "boom", "retry_in_seconds": 0}
    )
    assert r.status_code == 200 and r.json()["status"] == "pending"
    assert woken == [{"q"}]
    [c] = answer()
    assert (c["id"], c["attempts"]) == (job["id"], 2)
    # A retry with backoff is not claimable yet: no wake-up for it.
    woken.clear()
    r = server.client.post(f"/jobs/{c['id']}/fail", json={"claim_token": c["claim_token"], "error": "boom"})
    assert r.status_code == 200 and r.json()["status"] == "pending"
    assert woken == []


# --- claim tokens that name their queue (app/db/tokens.py) ------------------------------------------------------


def token_of(db: psycopg.Connection, claim: dict[str, Any], queue: str | None) -> str:
    """Give the claim's job the token a claim hands out when it names `queue` (None: a token from before 1.2.0,
    the random part alone), whatever the claim statement handed out; returns it."""
    token = claim["claim_token"][: tokens.RANDOM_CHARS] + ("" if queue is None else tokens.queue_suffix(queue))
    db.execute(
        "UPDATE jobq.jobs SET claim_token = %s WHERE queue_name = %s AND id = %s",
        (token, claim["queue"], claim["id"]),
    )
    return token


@pytest.mark.parametrize("named", [True, False], ids=["naming its queue", "without a queue"])
def test_writes_are_served_with_a_token_that_names_its_queue_or_none(
    server: LiveServer, db: psycopg.Connection, named: bool
) -> None:
    for i in range(3):
        server.enqueue("mail", payload=i)
    a, b, c = server.claim("mail", limit=3)
    ta, tb, tc = (token_of(db, x, "mail" if named else None) for x in (a, b, c))
    assert (len(ta) > 43) is named
    beat = post(server, f"/jobs/{a['id']}/heartbeat", {"claim_token": ta, "lease_seconds": 600, "progress": 1})
    assert beat.status_code == 200, beat.text
    assert row(db, a["id"])["lease_expires_at"] == datetime.fromisoformat(beat.json()["lease_expires_at"])
    assert post(server, f"/jobs/{a['id']}/complete", {"claim_token": ta, "result": 1}).json()["status"] == "completed"
    failed = post(server, f"/jobs/{b['id']}/fail", {"claim_token": tb, "error": "x", "retry": False})
    assert failed.json()["status"] == "failed"
    released = post(server, f"/jobs/{c['id']}/release", {"claim_token": tc})
    assert released.json()["status"] == "pending"
    assert row(db, c["id"])["attempts"] == 0


def test_a_token_edited_to_name_another_queue_is_a_wrong_token(server: LiveServer, db: psycopg.Connection) -> None:
    """The queue part only routes the statement: a token whose queue part names another queue (one that exists,
    or not) matches no job there, and is answered as any wrong token (409), the job left as it was."""
    server.enqueue("mail", payload=1)
    server.enqueue("other", payload=2)
    c = server.claim_one("mail")
    token_of(db, c, "mail")
    before = row(db, c["id"])
    edited = ""
    for queue in ("other", "nowhere"):
        edited = before["claim_token"][: tokens.RANDOM_CHARS] + tokens.queue_suffix(queue)
        assert tokens.queue_of(edited) == queue
        problem(post(server, f"/jobs/{c['id']}/heartbeat", {"claim_token": edited}), 409, "claim-lost")
        problem(post(server, f"/jobs/{c['id']}/complete", {"claim_token": edited}), 409, "claim-lost")
        problem(post(server, f"/jobs/{c['id']}/fail", {"claim_token": edited, "error": "x"}), 409, "claim-lost")
        problem(post(server, f"/jobs/{c['id']}/release", {"claim_token": edited}), 409, "claim-lost")
        batch = post(server, "/jobs/complete", {"jobs": [{"id": c["id"], "claim_token": edited}]})
        assert batch.json()["results"] == [{"id": c["id"], "outcome": "claim_lost", "status": "running"}]
    assert row(db, c["id"]) == before
    # A job of another queue named by a token's queue part: still a job that is not there.
    problem(post(server, "/jobs/987654/complete", {"claim_token": edited}), 404, "job-not-found")


def test_a_batch_complete_across_queues_answers_in_order(server: LiveServer, db: psycopg.Connection) -> None:
    """Items whose tokens name several queues (and one that names none) run one statement per queue; the
    answers keep the items' order."""
    for queue in ("a", "b"):
        for i in range(2):
            server.enqueue(queue, payload=i)
    a1, a2 = server.claim("a", limit=2)
    b1, b2 = server.claim("b", limit=2)
    held = [token_of(db, a1, "a"), token_of(db, b1, "b"), token_of(db, a2, None), token_of(db, b2, "b")]
    ids = [a1["id"], b1["id"], a2["id"], b2["id"]]
    items = [{"id": i, "claim_token": t} for i, t in zip(ids, held, strict=True)]
    items.insert(2, {"id": b2["id"], "claim_token": "stale"})
    r = post(server, "/jobs/complete", {"jobs": items})
    assert r.status_code == 200, r.text
    assert r.json()["results"] == [
        {"id": ids[0], "outcome": "completed", "status": "completed"},
        {"id": ids[1], "outcome": "completed", "status": "completed"},
        {"id": ids[3], "outcome": "claim_lost", "status": "running"},
        {"id": ids[2], "outcome": "completed", "status": "completed"},
        {"id": ids[3], "outcome": "completed", "status": "completed"},
    ]


def test_a_token_naming_the_longest_queue_name_is_accepted(server: LiveServer, db: psycopg.Connection) -> None:
    queue = "q" * 128
    server.enqueue(queue, payload=1)
    c = server.claim_one(queue)
    token = token_of(db, c, queue)
    assert len(token) == 214
    assert post(server, f"/jobs/{c['id']}/heartbeat", {"claim_token": token}).status_code == 200
    assert post(server, f"/jobs/{c['id']}/complete", {"claim_token": token}).status_code == 200
    # The longest name a token can hold: key 63 of that queue spread over 64 keys (app/db/spread.py).
    assert server.client.patch(f"/queues/{queue}/config", json={"spread": 64}).status_code == 200
    db.execute("INSERT INTO jobq.jobs (queue_name, payload) VALUES (%s, '1')", (queue + "#63",))
    c = server.claim_one(queue)
    assert len(c["claim_token"]) == tokens.MAX_CHARS == 218 and c["queue"] == queue
    assert tokens.queue_of(c["claim_token"]) == queue + "#63"
    assert post(server, f"/jobs/{c['id']}/heartbeat", {"claim_token": c["claim_token"]}).status_code == 200
    too_long = {"claim_token": c["claim_token"] + "x"}
    problem(post(server, f"/jobs/{c['id']}/heartbeat", too_long), 422, "validation-error")
    assert post(server, f"/jobs/{c['id']}/complete", {"claim_token": c["claim_token"]}).status_code == 200
