"""Operators: queue statistics, listings, admin actions, retention."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import random
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from app.db import admin as store_admin
from app.db import operations as store_ops
from app.db import writes as store_writes
from tests import citus
from tests.support import LiveServer, problem, wait_until

FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def post(server: LiveServer, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return server.client.post(path, json=body if body is not None else {})


def flush(server: LiveServer) -> None:
    """Push this process's per-minute counts to the database now (normally once a second)."""
    server.run(lambda: server.services.metrics.flush(store_ops.stats_writer(server.services.db)))


def stats(server: LiveServer, queue: str = "q", **params: Any) -> dict[str, Any]:
    r = server.client.get(f"/queues/{queue}/stats", params=params)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def true_counts(db: psycopg.Connection, queue: str = "q") -> dict[str, int]:
    rows = db.execute("SELECT status, count(*) FROM jobq.jobs WHERE queue_name = %s GROUP BY status", (queue,))
    return dict(rows.fetchall())


def assert_counts_true(server: LiveServer, db: psycopg.Connection) -> None:
    """The stats' counts (kept counters for finished jobs) equal a count of the table itself."""
    truth = true_counts(db)
    counts = stats(server)["counts"]
    for status in ("completed", "failed", "cancelled", "running"):
        assert counts[status] == truth.get(status, 0), (status, counts, truth)


def complete(server: LiveServer, claim: dict[str, Any], **body: Any) -> httpx.Response:
    return post(server, f"/jobs/{claim['id']}/complete", {"claim_token": claim["claim_token"], **body})


def fail(server: LiveServer, claim: dict[str, Any], **body: Any) -> httpx.Response:
    return post(server, f"/jobs/{claim['id']}/fail", {"claim_token": claim["claim_token"], "error": "boom", **body})


# --- statistics -------------------------------------------------------------------------------------------


def test_stats_of_a_busy_queue(server: LiveServer, db: psycopg.Connection) -> None:
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(10)]})
    server.enqueue(payload="later", delay_seconds=3600)
    server.enqueue(payload="last", max_attempts=1)  # claimed below: on its last attempt while running
    db.execute("UPDATE jobq.jobs SET run_at = now() - interval '90 seconds' WHERE payload = '0'")
    claims = server.claim(limit=6)
    for c in claims[:3]:
        assert complete(server, c).status_code == 200
    assert fail(server, claims[3], retry=False).status_code == 200  # terminal
    assert fail(server, claims[4]).status_code == 200  # retried later
    assert post(server, f"/jobs/{claims[5]['id']}/cancel").status_code == 200
    flush(server)

    s = stats(server)
    counts = s["counts"]
    truth = true_counts(db)
    assert counts["completed"] == truth["completed"] == 3
    assert counts["failed"] == truth["failed"] == 1
    assert counts["cancelled"] == truth["cancelled"] == 1
    assert counts["running"] == truth.get("running", 0)
    assert counts["pending"] == truth["pending"] == counts["ready"] + counts["scheduled"]
    assert counts["scheduled"] == 2  # the delayed job and the one backing off after its failure
    assert s["oldest_ready_age_seconds"] is not None and s["oldest_ready_age_seconds"] >= 0
    assert s["paused"] is False
    w = s["window"]
    assert (w["enqueued"], w["claimed"], w["completed"], w["failures"], w["retries"], w["cancelled"]) == (
        12, 6, 3, 1, 1, 1,
    )  # fmt: skip
    assert w["completions_per_minute"] == pytest.approx(3 / 5)
    assert w["duration"]["count"] == 3
    assert 0 <= w["duration"]["p50_ms"] <= w["duration"]["p95_ms"] <= w["duration"]["max_ms"]


def test_oldest_ready_age_follows_the_database_clock(server: LiveServer, db: psycopg.Connection) -> None:
    job = server.enqueue(payload=1)
    db.execute("UPDATE jobq.jobs SET run_at = now() - interval '1 hour' WHERE id = %s", (job["id"],))
    age = stats(server)["oldest_ready_age_seconds"]
    assert 3600 <= age < 3700


def test_jobs_close_to_max_attempts(server: LiveServer, db: psycopg.Connection) -> None:
    a = server.enqueue(payload="a", max_attempts=3)
    server.enqueue(payload="b", max_attempts=3)
    db.execute("UPDATE jobq.jobs SET attempts = 2 WHERE id = %s", (a["id"],))  # pending, one attempt left
    s = stats(server)
    assert (s["jobs_one_attempt_left"], s["jobs_on_last_attempt"]) == (1, 0)
    c = server.claim_one()  # the job with attempts 2 (older) goes first and is now on its last attempt
    assert c["id"] == a["id"] and c["attempts"] == 3
    s = stats(server)
    assert (s["jobs_one_attempt_left"], s["jobs_on_last_attempt"]) == (0, 1)


def test_lease_expiries_and_empty_claims_are_counted(server: LiveServer) -> None:
    server.enqueue(payload=1)
    server.claim_one(lease_seconds=1)
    server.run(lambda: server.services.maintenance["rescuer"].run_once(now=FUTURE))
    assert post(server, "/queues/q/pause").json() == {"queue": "q", "paused": True}
    assert server.claim() == []  # a ready job exists, but the queue is paused
    flush(server)
    w = stats(server)["window"]
    assert w["lease_expired"] == 1
    assert w["empty_claims_with_ready_jobs"] == 1


def test_stats_agree_across_replicas(server_factory) -> None:  # type: ignore[no-untyped-def]
    a: LiveServer = server_factory()
    b: LiveServer = server_factory()
    for i in range(6):
        (a if i % 2 else b).enqueue(payload=i)
    for server in (a, b, a):
        c = server.claim_one()
        assert complete(server, c).status_code == 200
    for server in (b, a, b):  # releases are counted by whichever replica took them, and add up
        c = server.claim_one()
        assert post(server, f"/jobs/{c['id']}/release", {"claim_token": c["claim_token"]}).status_code == 200
    flush(a)
    flush(b)
    # Both read PostgreSQL's own statistics ("database": dead rows, oldest xmin) as they are at the time, and
    # backends report their updates to those views up to seconds late: two reads a moment apart can see two
    # values (dead rows 98, then 121). Read the pair again until that part agrees; the rest must be equal.
    read: list[dict[str, Any]] = []

    def same_database_figures() -> bool:
        read[:] = [stats(a), stats(b)]
        return bool(read[0]["database"] == read[1]["database"])

    wait_until(same_database_figures, what="both replicas reading the same database statistics")
    sa, sb = read
    for s in (sa, sb):
        s.pop("as_of")
    # the oldest ready job ages between the two calls; everything else must be identical
    assert sa.pop("oldest_ready_age_seconds") == pytest.approx(sb.pop("oldest_ready_age_seconds"), abs=5)
    assert sa == sb
    w = sa["window"]
    assert (w["enqueued"], w["claimed"], w["completed"], w["released"], w["retries"]) == (6, 6, 3, 3, 0)


def test_a_flush_cancelled_while_writing_still_lands_its_counts(database_url: str, db: psycopg.Connection) -> None:
    """The service stopping cancels its statistics flush, which may be half-way: counts taken out of the
    process, the INSERT not committed. Those counts must land (or come back for the last flush), once."""
    from app.db.pool import Database
    from app.observability.metrics import Metrics
    from tests.conftest import make_settings

    async def scenario() -> None:
        database = Database(make_settings(database_url), database_url)
        await database.open(10)
        metrics = Metrics()
        metrics.count("enqueued", "q", 5)
        locker = await psycopg.AsyncConnection.connect(database_url)  # a transaction that holds the table
        await locker.execute("LOCK TABLE jobq.queue_stats IN ACCESS EXCLUSIVE MODE")
        flushing = asyncio.ensure_future(metrics.flush(store_ops.stats_writer(database)))
        while not db.execute(
            "SELECT count(*) FROM pg_locks WHERE relation = 'jobq.queue_stats'::regclass AND NOT granted"
        ).fetchone()[0]:  # type: ignore[index]
            await asyncio.sleep(0.01)  # the flush's INSERT now waits for the lock
        flushing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flushing
        metrics.count("enqueued", "q", 2)  # counted after the cancelled flush took its counts
        await locker.commit()
        # The last flush, at stop: after the cancelled one's statement.
        await metrics.flush(store_ops.stats_writer(database))
        await locker.close()
        await database.close()

    asyncio.run(scenario())
    assert db.execute("SELECT sum(enqueued) FROM jobq.queue_stats WHERE queue_name = 'q'").fetchone() == (7,)


def test_stats_window_parameter(server: LiveServer) -> None:
    assert stats(server, window_seconds=60)["window"]["seconds"] == 60
    problem(server.client.get("/queues/q/stats", params={"window_seconds": 59}), 422, "validation-error")
    problem(server.client.get("/queues/q/stats", params={"window_seconds": 3601}), 422, "validation-error")
    problem(server.client.get("/queues/bad name/stats"), 422, "validation-error")


def test_list_queues(server: LiveServer, db: psycopg.Connection) -> None:
    server.enqueue(queue="a", payload=1)
    server.enqueue(queue="b", payload=1, delay_seconds=60)
    c = server.claim_one(queue="a")
    assert complete(server, c).status_code == 200
    post(server, "/queues/c/pause")
    queues = {q["queue"]: q for q in server.client.get("/queues").json()["queues"]}
    assert set(queues) == {"a", "b", "c"}
    assert queues["a"]["counts"]["completed"] == 1
    assert queues["b"]["counts"]["scheduled"] == 1 and queues["b"]["oldest_ready_age_seconds"] is None
    assert queues["c"]["paused"] is True


def queue_pages(client: Any, **params: Any) -> list[list[str]]:
    out, cursor = [], None
    while True:
        r = client.get("/queues", params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        out.append([q["queue"] for q in r.json()["queues"]])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return out


def test_the_queue_list_pages(server_factory: Any, db: psycopg.Connection) -> None:
    """GET /queues was one answer of every queue (548 KB at 3,000): it pages by name (`limit`, `cursor`,
    `next_cursor`) as the job listing does, a key limited to some queues gets full pages of its own, and a
    call without `limit` gets up to 1,000 queues at once (every queue of most services, as before)."""
    from tests.test_security import ENV_KEY, as_key, create_key

    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY)
    root = as_key(server, ENV_KEY)
    names = [f"{prefix}-{i}" for prefix in ("a", "b") for i in range(5)]
    for n, name in enumerate(names):  # every kind of queue: pending, waiting, running, finished, configured
        job = root.post(f"/queues/{name}/jobs", json={"payload": n}).json()
        if n % 5 == 1:
            root.post(f"/queues/{name}/jobs", json={"payload": n, "depends_on": [job["id"]]})
            root.post(f"/jobs/{job['id']}/cancel")
        elif n % 5 == 2:
            root.post(f"/queues/{name}/claim", json={"worker": "w"})
        elif n % 5 == 3:
            claimed = root.post(f"/queues/{name}/claim", json={"worker": "w"}).json()["jobs"][0]
            root.post(f"/jobs/{claimed['id']}/complete", json={"claim_token": claimed["claim_token"]})
    assert root.patch("/queues/c-configured/config", json={"max_attempts": 3}).status_code == 200
    everything = sorted([*names, "c-configured"])
    assert queue_pages(root, limit=3) == [everything[i : i + 3] for i in range(0, 11, 3)]
    assert queue_pages(root) == [everything]
    team = as_key(server, create_key(db, "team", ["admin"], ["b-*"]))
    assert queue_pages(team, limit=2) == [["b-0", "b-1"], ["b-2", "b-3"], ["b-4"]]
    first = root.get("/queues", params={"limit": 4}).json()
    assert first["queues"][3]["queue"] == "a-3" and first["queues"][3]["counts"]["completed"] == 1
    assert first["queues"][2]["counts"]["running"] == 1 and first["queues"][1]["counts"]["waiting"] == 0
    for bad in ({"limit": 0}, {"limit": 1001}, {"cursor": "nope"}, {"cursor": first["next_cursor"] + "x"}):
        problem(root.get("/queues", params=bad), 422, "validation-error")
    # Where the walks are refused (Citus), a page is QUEUES_PAGE_FANOUT's: the same rows as the walks', checked
    # here where both run (plain PostgreSQL), in one transaction so that both read the same now().
    for params in (
        {"after": "", "allowed": None, "n": 4, "over": 10_001, "over_new": 10_001, "trust": 120.0},
        {"after": "a-3", "allowed": None, "n": 20, "over": 10_001, "over_new": 10_001, "trust": 120.0},
        {"after": "a-9", "allowed": "^b-", "n": 3, "over": 10_001, "over_new": 10_001, "trust": 120.0},
    ):
        with db.transaction():
            try:
                with db.transaction():
                    walked = db.execute(store_ops.QUEUES_PAGE, params).fetchall()
            except psycopg.errors.FeatureNotSupported:
                continue
            assert db.execute(store_ops.QUEUES_PAGE_FANOUT, params).fetchall() == walked, params


# --- listing -------------------------------------------------------------------------------------------------


def pages(server: LiveServer, queue: str = "q", **params: Any) -> list[list[dict[str, Any]]]:
    out, cursor = [], None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        r = server.client.get(f"/queues/{queue}/jobs", params=query)
        assert r.status_code == 200, r.text
        body = r.json()
        out.append(body["jobs"])
        cursor = body["next_cursor"]
        if cursor is None:
            return out


def test_listing_follows_a_cursor_and_ignores_concurrent_inserts(server: LiveServer) -> None:
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i, "priority": i % 3} for i in range(23)]})
    expected = [j["id"] for j in server.client.get("/queues/q/jobs?status=pending&limit=500").json()["jobs"]]
    seen: list[int] = []
    cursor = None
    while True:
        r = server.client.get(
            "/queues/q/jobs", params={"status": "pending", "limit": 5, **({"cursor": cursor} if cursor else {})}
        )
        body = r.json()
        seen += [j["id"] for j in body["jobs"]]
        server.enqueue(payload="inserted meanwhile", priority=1)  # lands between pages in claim order
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen))
    assert [i for i in seen if i in set(expected)] == expected  # nothing skipped or repeated


def test_listing_orders(server: LiveServer, db: psycopg.Connection) -> None:
    ids = [server.enqueue(payload=i, priority=p)["id"] for i, p in enumerate([0, 5, 0, 5])]
    pending = [j["id"] for page in pages(server, status="pending", limit=3) for j in page]
    assert pending == [ids[1], ids[3], ids[0], ids[2]]  # claim order: priority, then age
    c1, c2 = server.claim(limit=2)
    assert complete(server, c1).status_code == 200
    assert complete(server, c2).status_code == 200
    completed = [j["id"] for page in pages(server, status="completed", limit=1) for j in page]
    assert completed == [c2["id"], c1["id"]]  # newest first
    every = [j["id"] for page in pages(server, limit=2) for j in page]
    assert every == sorted(ids, reverse=True)
    running = server.claim_one()
    assert [j["id"] for page in pages(server, status="running") for j in page] == [running["id"]]
    assert all("claim_token" not in j for page in pages(server) for j in page)


def test_listing_rejects_bad_cursors_and_params(server: LiveServer) -> None:
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(3)]})
    cursor = server.client.get("/queues/q/jobs", params={"status": "pending", "limit": 1}).json()["next_cursor"]
    assert cursor
    for params in (
        {"cursor": "not-a-cursor"},
        {"cursor": cursor, "status": "completed"},  # a cursor of another listing
        {"status": "sleeping"},
        {"limit": 0},
        {"limit": 501},
    ):
        problem(server.client.get("/queues/q/jobs", params=params), 422, "validation-error")


def test_listing_rejects_crafted_cursors(server: LiveServer) -> None:
    """A cursor is client input: keys of the wrong type are a 422, never a 500 from the database layer."""
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(3)]})

    def crafted(status: str | None, keys: list[Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps({"s": status, "k": keys}).encode()).decode().rstrip("=")

    stamp = "2020-01-01T00:00:00+00:00"
    for status, keys in (
        ("pending", [{"a": 1}, stamp, 1]),
        ("pending", [[1], stamp, 1]),
        ("pending", [0, {"a": 1}, 1]),
        ("pending", [0, stamp, [1]]),
        ("pending", [0, "not a time", 1]),
        ("pending", [2**80, stamp, 1]),
        ("running", [stamp, {"x": 1}]),
        ("completed", [[stamp], 1]),
        (None, [{"x": 1}]),
        (None, ["abc"]),
        (None, [True]),
    ):
        params = {"cursor": crafted(status, keys), **({"status": status} if status else {})}
        problem(server.client.get("/queues/q/jobs", params=params), 422, "validation-error")


# --- admin actions --------------------------------------------------------------------------------------------


def test_cancel_a_pending_job(server: LiveServer) -> None:
    job = server.enqueue(payload=1)
    r = post(server, f"/jobs/{job['id']}/cancel", {"reason": "not needed any more"})
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["last_error"]) == ("cancelled", "not needed any more")
    assert server.claim() == []
    problem(post(server, f"/jobs/{job['id']}/cancel"), 409, "invalid-state")
    problem(post(server, "/jobs/999999/cancel"), 404, "job-not-found")


def test_cancel_a_running_job_cooperatively(server: LiveServer) -> None:
    job = server.enqueue(payload=1)
    c = server.claim_one()
    assert post(server, f"/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    beat = post(server, f"/jobs/{job['id']}/heartbeat", {"claim_token": c["claim_token"]})
    assert beat.status_code == 200
    assert beat.json() == {"id": job["id"], "lease_expires_at": None, "cancel_requested": True}
    problem(complete(server, c), 409, "job-cancelled")
    problem(fail(server, c), 409, "job-cancelled")
    r = post(server, "/jobs/complete", {"jobs": [{"id": job["id"], "claim_token": c["claim_token"]}]})
    assert r.json()["results"] == [{"id": job["id"], "outcome": "cancelled", "status": "cancelled"}]
    # another token learns nothing about the cancel: its claim is simply lost
    problem(post(server, f"/jobs/{job['id']}/heartbeat", {"claim_token": "other"}), 409, "claim-lost")
    assert server.job(job["id"])["status"] == "cancelled"


def test_heartbeat_of_a_live_claim_says_not_cancelled(server: LiveServer) -> None:
    server.enqueue(payload=1)
    c = server.claim_one()
    body = post(server, f"/jobs/{c['id']}/heartbeat", {"claim_token": c["claim_token"]}).json()
    assert body["cancel_requested"] is False and body["lease_expires_at"] is not None


def lock_waiters(db: psycopg.Connection, marker: str) -> int:
    """Statements of this database waiting for a row lock whose text contains `marker`. On Citus a statement waits
    on the worker node holding its shard, under the shard's query text (CTE names kept): citus_stat_activity shows
    the backends of every node."""
    citus = db.execute("SELECT to_regclass('pg_catalog.citus_stat_activity') IS NOT NULL").fetchone()
    view = "citus_stat_activity" if citus and citus[0] else "pg_stat_activity"
    row = db.execute(
        f"SELECT count(*) FROM {view} WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND strpos(query, %s) > 0",
        (marker,),
    ).fetchone()
    return int(row[0]) if row else 0


def test_a_heartbeat_held_up_by_a_cancel_learns_of_the_cancel(
    server: LiveServer, db: psycopg.Connection, database_url: str
) -> None:
    """A heartbeat that waits on the row while a cancel commits answers cancel_requested, as it would a
    moment later: not claim-lost, which tells the worker it lost the job to someone else."""
    job = server.enqueue(payload=1)
    c = server.claim_one()
    answers: list[httpx.Response] = []
    with psycopg.connect(database_url) as tx:  # the operator's cancel, held open
        row = tx.execute(
            store_admin.JOB_CANCEL, {"id": job["id"], "queue": "q", "reason": None, "allowed": None}
        ).fetchone()
        assert row is not None and row[1] is True  # (ord, written, job...)
        beat = threading.Thread(
            target=lambda: answers.append(
                post(server, f"/jobs/{job['id']}/heartbeat", {"claim_token": c["claim_token"]})
            )
        )
        beat.start()
        wait_until(lambda: lock_waiters(db, "renewed") == 1, what="the heartbeat to wait on the row")
        tx.commit()
        beat.join()
    assert answers[0].status_code == 200, answers[0].text
    assert answers[0].json() == {"id": job["id"], "lease_expires_at": None, "cancel_requested": True}


def test_a_cancel_held_up_by_a_complete_names_the_state_it_found(
    server: LiveServer, db: psycopg.Connection, database_url: str
) -> None:
    """A cancel that waits on the row while a complete commits is refused for the job's real state."""
    job = server.enqueue(payload=1)
    c = server.claim_one()
    answers: list[httpx.Response] = []
    items = orjson.dumps([{"ord": 0, "id": job["id"], "token": c["claim_token"]}]).decode()
    with psycopg.connect(database_url) as tx:  # the worker's complete, held open
        tx.execute(store_writes.JOB_COMPLETE_MANY, {"queue": "q", "items": items, "full": True})
        cancel = threading.Thread(target=lambda: answers.append(post(server, f"/jobs/{job['id']}/cancel")))
        cancel.start()
        wait_until(lambda: lock_waiters(db, "target") == 1, what="the cancel to wait on the row")
        tx.commit()
        cancel.join()
    body = problem(answers[0], 409, "invalid-state")
    assert "completed" in body["detail"], body


def test_a_retry_held_up_by_a_redrive_names_the_state_it_found(
    server: LiveServer, db: psycopg.Connection, database_url: str
) -> None:
    job = server.enqueue(payload=1)
    fail(server, server.claim_one(), retry=False)
    answers: list[httpx.Response] = []
    with psycopg.connect(database_url) as tx:  # an operator's redrive, held open
        tx.execute(store_admin.REDRIVE_BATCH, {"queue": "q", "contains": None, "batch": 10})
        retry = threading.Thread(target=lambda: answers.append(post(server, f"/jobs/{job['id']}/retry")))
        retry.start()
        wait_until(lambda: lock_waiters(db, "retried") == 1, what="the retry to wait on the row")
        tx.commit()
        retry.join()
    body = problem(answers[0], 409, "invalid-state")
    assert "pending" in body["detail"], body


def test_cancel_races_complete_cleanly(server: LiveServer, db: psycopg.Connection) -> None:
    """Cancel and complete at the same moment: exactly one wins, the other gets a clear 409."""
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(30)]})
    claims = server.claim(limit=30)
    outcomes: list[tuple[int, int]] = []

    def race(c: dict[str, Any]) -> None:
        with httpx.Client(base_url=server.url) as a, httpx.Client(base_url=server.url) as b:
            results: dict[str, int] = {}
            t = threading.Thread(
                target=lambda: results.update(cancel=a.post(f"/jobs/{c['id']}/cancel", json={}).status_code)
            )
            t.start()
            results["complete"] = b.post(
                f"/jobs/{c['id']}/complete", json={"claim_token": c["claim_token"]}
            ).status_code
            t.join()
            outcomes.append((results["cancel"], results["complete"]))

    threads = [threading.Thread(target=race, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(o in ((200, 409), (409, 200)) for o in outcomes), outcomes
    truth = true_counts(db)
    assert truth.get("completed", 0) + truth.get("cancelled", 0) == 30
    s = stats(server)["counts"]
    assert (s["completed"], s["cancelled"]) == (truth.get("completed", 0), truth.get("cancelled", 0))


def test_retry_a_failed_cancelled_or_completed_job(server: LiveServer) -> None:
    job = server.enqueue(payload=1, max_attempts=1)
    c = server.claim_one()
    assert fail(server, c).json()["status"] == "failed"
    r = post(server, f"/jobs/{job['id']}/retry")
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["attempts"]) == ("pending", 0)
    again = server.claim_one()
    assert again["id"] == job["id"] and again["attempts"] == 1
    problem(post(server, f"/jobs/{job['id']}/retry"), 409, "invalid-state")  # running now
    other = server.enqueue(payload=2)
    post(server, f"/jobs/{other['id']}/cancel")
    assert post(server, f"/jobs/{other['id']}/retry").json()["status"] == "pending"
    problem(post(server, "/jobs/999999/retry"), 404, "job-not-found")
    waiting = server.enqueue(payload=3, depends_on=[again["id"]])
    problem(post(server, f"/jobs/{waiting['id']}/retry"), 409, "invalid-state")  # waiting


def test_a_completed_job_is_replayed_with_its_payload_and_history(server: LiveServer, db: psycopg.Connection) -> None:
    job = server.enqueue(payload={"report": 7}, idempotency_key="report-7", group="acme")
    first = server.claim_one(worker="first-worker")
    assert complete(server, first, result={"rows": 10}).status_code == 200
    before = server.job(job["id"])
    r = post(server, f"/jobs/{job['id']}/retry")
    assert r.status_code == 200
    replayed = r.json()
    # The same job, due now, a fresh set of attempts; its previous run's result is gone, what it left is kept.
    assert (replayed["id"], replayed["status"], replayed["attempts"], replayed["result"]) == (
        job["id"],
        "pending",
        0,
        None,
    )
    for kept in ("payload", "created_at", "idempotency_key", "group", "worker", "claimed_at", "max_attempts"):
        assert replayed[kept] == before[kept], kept
    assert replayed["finished_at"] is None
    assert stats(server)["counts"]["completed"] == 0  # the finished-job counters moved with it
    assert_counts_true(server, db)
    # Its idempotency key still names it: a repeat enqueue finds this job, not a new one.
    assert (
        server.client.post("/queues/q/jobs", json={"payload": 1, "idempotency_key": "report-7"}).json()["id"]
        == job["id"]
    )
    second = server.claim_one(worker="second-worker")
    assert (second["id"], second["payload"], second["attempts"]) == (job["id"], {"report": 7}, 1)
    assert complete(server, second, result={"rows": 11}).json()["result"] == {"rows": 11}
    problem(complete(server, first), 409, "claim-lost")  # the first run's token holds nothing


def test_redrive_failed_jobs(server: LiveServer, db: psycopg.Connection) -> None:
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i, "max_attempts": 1} for i in range(7)]})
    for i, c in enumerate(server.claim(limit=7)):
        assert fail(server, c, error="SMTP 451 greylisted" if i % 2 else "bad address").status_code == 200
    r = post(server, "/queues/q/redrive", {"error_contains": "SMTP 451", "dry_run": True})
    assert r.json() == {"queue": "q", "dry_run": True, "jobs": 3}
    assert true_counts(db) == {"failed": 7}
    r = post(server, "/queues/q/redrive", {"error_contains": "SMTP 451"})
    assert r.json() == {"queue": "q", "dry_run": False, "jobs": 3}
    assert true_counts(db) == {"failed": 4, "pending": 3}
    assert post(server, "/queues/q/redrive", {"limit": 1}).json()["jobs"] == 1
    assert post(server, "/queues/q/redrive").json()["jobs"] == 3
    assert true_counts(db) == {"pending": 7}
    assert stats(server)["counts"]["failed"] == 0
    problem(post(server, "/queues/q/redrive", {"limit": 0}), 422, "validation-error")


def test_pause_and_resume(server: LiveServer) -> None:
    assert post(server, "/queues/q/pause").json() == {"queue": "q", "paused": True}
    job = server.enqueue(payload="accepted while paused")
    assert server.claim() == []
    assert stats(server)["paused"] is True
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.extend(server.claim(wait_seconds=20)))
    t.start()
    wait_until(lambda: server.services.dispatcher.parked == 1, what="a worker waiting on the paused queue")
    assert post(server, "/queues/q/resume").json() == {"queue": "q", "paused": False}
    t.join()
    assert [j["id"] for j in got] == [job["id"]]


# --- retention --------------------------------------------------------------------------------------------------


def test_retention_deletes_finished_jobs_by_age(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(
        retention_completed_seconds=3600, retention_failed_seconds=7200, retention_cancelled_seconds=0,
        sweep_batch_size=2,
    )  # fmt: skip
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i, "max_attempts": 1} for i in range(12)]})
    claims = server.claim(limit=9)
    for c in claims[:5]:
        complete(server, c)
    for c in claims[5:8]:
        fail(server, c)
    for c in claims[8:]:
        post(server, f"/jobs/{c['id']}/cancel")
    before = true_counts(db)
    assert before == {"completed": 5, "failed": 3, "cancelled": 1, "pending": 3}
    now = datetime.now(UTC)
    soon = server.run(lambda: server.services.maintenance["retention"].run_once(now=now + timedelta(minutes=30)))
    assert sum(soon.deleted.values()) == 0
    later = server.run(lambda: server.services.maintenance["retention"].run_once(now=now + timedelta(minutes=90)))
    assert later.deleted.get("completed") == 5
    assert true_counts(db) == {"failed": 3, "cancelled": 1, "pending": 3}
    server.run(lambda: server.services.maintenance["retention"].run_once(now=now + timedelta(hours=3)))
    assert true_counts(db) == {"cancelled": 1, "pending": 3}  # cancelled: retention 0 = kept
    counts = stats(server)["counts"]
    assert (counts["completed"], counts["failed"], counts["cancelled"]) == (0, 0, 1)


def test_finished_counts_never_drift(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """Whatever mix of transitions happens, the kept counters equal a real count."""
    server: LiveServer = server_factory(retention_completed_seconds=60, sweep_batch_size=3)
    rng = random.Random(7)
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i, "max_attempts": 2} for i in range(80)]})
    for _ in range(6):
        for c in server.claim(limit=15):
            action = rng.choice(["complete", "fail", "fail_final", "cancel", "abandon"])
            if action == "complete":
                complete(server, c)
            elif action == "fail":
                fail(server, c, retry_in_seconds=0)
            elif action == "fail_final":
                fail(server, c, retry=False)
            elif action == "cancel":
                post(server, f"/jobs/{c['id']}/cancel")
        server.run(lambda: server.services.maintenance["rescuer"].run_once(now=FUTURE))
        post(server, "/queues/q/redrive", {"limit": rng.randint(1, 5)})
        for j in server.client.get("/queues/q/jobs", params={"status": "cancelled", "limit": 2}).json()["jobs"]:
            post(server, f"/jobs/{j['id']}/retry")
        if rng.random() < 0.5:
            server.run(lambda: server.services.maintenance["retention"].run_once(now=FUTURE))
        assert_counts_true(server, db)


def test_finished_counts_never_drift_with_releases_and_cancelled_claims(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """The transitions the mix above leaves out: release, a claim cancelled under its worker and then
    swept, the worker's complete/fail/release after that cancel, and retention of every status."""
    server: LiveServer = server_factory(
        retention_completed_seconds=60, retention_failed_seconds=60, retention_cancelled_seconds=60,
        sweep_batch_size=3,
    )  # fmt: skip
    rng = random.Random(3)
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i, "max_attempts": 2} for i in range(80)]})
    held: list[dict[str, Any]] = []
    for _ in range(8):
        held.extend(server.claim(limit=15))
        rng.shuffle(held)
        kept = []
        for c in held:
            action = rng.choice(["complete", "fail", "fail_final", "cancel", "release", "abandon", "cancel_held"])
            if action == "complete":
                complete(server, c)
            elif action == "fail":
                fail(server, c, retry_in_seconds=0)
            elif action == "fail_final":
                fail(server, c, retry=False)
            elif action == "release":
                post(server, f"/jobs/{c['id']}/release", {"claim_token": c["claim_token"]})
            else:
                if action != "abandon":
                    post(server, f"/jobs/{c['id']}/cancel")
                kept.append(c)
        server.run(lambda: server.services.maintenance["rescuer"].run_once(now=FUTURE))
        for c in kept[:5]:  # the worker goes on after the cancel or the sweep: all refused
            rng.choice([complete, fail])(server, c)
            post(server, f"/jobs/{c['id']}/release", {"claim_token": c["claim_token"]})
        held = kept[5:]
        post(server, "/queues/q/redrive", {"limit": rng.randint(1, 5)})
        for status in ("cancelled", "failed"):
            for j in server.client.get("/queues/q/jobs", params={"status": status, "limit": 2}).json()["jobs"]:
                post(server, f"/jobs/{j['id']}/retry")
        if rng.random() < 0.5:
            server.run(lambda: server.services.maintenance["retention"].run_once(now=FUTURE))
        assert_counts_true(server, db)


@pytest.mark.skipif(
    bool(os.environ.get(citus.URL_VARIABLE)),
    reason="on Citus the rows are in the worker nodes' shards, which their own autovacuum looks after; the "
    "coordinator's jobs table stays empty, and the service's vacuum finds nothing to do there",
)
def test_the_sweeper_vacuums_the_jobs_table(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    from app.maintenance.vacuum import VACUUM_LOCK_KEY

    # Only the test's passes vacuum: neither the service's own (every 10 s) nor autovacuum may take the dead
    # rows away or count a VACUUM of their own in between.
    server: LiveServer = server_factory(vacuum_dead_rows=100, vacuum_interval_seconds=0)
    db.execute("ALTER TABLE jobq.jobs SET (autovacuum_enabled = false)")
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(300)]})
    # The inserts alone would start a VACUUM too (test_the_sweeper_vacuums_after_a_bulk_load): this test is about
    # the dead rows, so the inserted ones are vacuumed first.
    db.execute("VACUUM jobq.jobs")
    wait_until(
        lambda: (db.execute("SELECT n_ins_since_vacuum FROM pg_stat_user_tables WHERE relname = 'jobs'").fetchone()
                 or (1,))[0] == 0,
        what="the statistics to show the VACUUM",
    )  # fmt: skip
    for c in server.claim(limit=100) + server.claim(limit=100) + server.claim(limit=100):
        complete(server, c)

    def vacuums() -> int:
        row = db.execute("SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'jobs'").fetchone()
        return int(row[0]) if row else 0

    def dead() -> int:
        row = db.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs'").fetchone()
        return int(row[0]) if row else 0

    wait_until(lambda: dead() >= 100, what="the statistics to show the dead rows")
    before = vacuums()
    db.execute("SELECT pg_advisory_lock(%s)", (VACUUM_LOCK_KEY,))  # another replica is vacuuming
    assert server.run(lambda: server.services.maintenance["vacuum"].run_once()) is False
    db.execute("SELECT pg_advisory_unlock(%s)", (VACUUM_LOCK_KEY,))
    assert server.run(lambda: server.services.maintenance["vacuum"].run_once()) is True
    wait_until(lambda: vacuums() == before + 1, what="the VACUUM to be recorded")


@pytest.mark.skipif(
    bool(os.environ.get(citus.URL_VARIABLE)),
    reason="on Citus the rows are in the worker nodes' shards, which their own autovacuum looks after",
)
def test_the_sweeper_vacuums_after_a_bulk_load(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """A bulk load leaves no dead row, but until a VACUUM has seen its pages every claim checks and hints the rows
    it meets one by one (BENCHMARKS.md: a queue spread among others' rows in a fresh heap claims 1.3-3.8x slower).
    Rows inserted since the last vacuum start one, as dead rows do."""
    server: LiveServer = server_factory(vacuum_dead_rows=100, vacuum_interval_seconds=0)
    db.execute("ALTER TABLE jobq.jobs SET (autovacuum_enabled = false)")
    db.execute("VACUUM jobq.jobs")  # what the migrations left is not this test's

    def table() -> dict[str, int]:
        row = db.execute(
            "SELECT vacuum_count, n_dead_tup, n_live_tup, n_ins_since_vacuum FROM pg_stat_user_tables "
            "WHERE relid = 'jobq.jobs'::regclass"
        ).fetchone()
        assert row is not None
        return dict(zip(("vacuums", "dead", "live", "inserted"), map(int, row), strict=True))

    wait_until(lambda: table()["inserted"] == 0, what="the statistics to show the VACUUM")
    assert server.run(lambda: server.services.maintenance["vacuum"].run_once()) is False  # nothing new
    for _ in range(2):
        r = server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(500)]})
        assert r.status_code == 201, r.text
    wait_until(lambda: table()["inserted"] >= 1000, what="the statistics to show the inserted rows")
    loaded = table()
    assert loaded["dead"] < 100, loaded  # the dead rows alone would not start a VACUUM
    assert server.run(lambda: server.services.maintenance["vacuum"].run_once()) is True
    wait_until(lambda: table()["vacuums"] == loaded["vacuums"] + 1, what="the VACUUM to be recorded")
    wait_until(lambda: table()["inserted"] == 0, what="the statistics to count inserts from the VACUUM on")
    assert server.run(lambda: server.services.maintenance["vacuum"].run_once()) is False
    assert stats(server)["counts"]["pending"] == 1000  # nothing lost on the way


def test_no_vacuum_below_the_threshold(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(vacuum_dead_rows=1_000_000)
    server.enqueue(payload=1)
    assert server.run(lambda: server.services.maintenance["vacuum"].run_once()) is False
