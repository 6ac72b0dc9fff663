"""Waiting for a job's result: GET /jobs/{id}?wait_seconds=N answers when the job finishes, whichever
statement finished it and on whichever replica, or at the deadline with the job as it is."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from tests.support import LiveServer, leave_while_waiting, problem, record_finishes, record_messages, wait_until


class Waiting:
    """GET /jobs/{id}?wait_seconds=... on its own connection and thread."""

    def __init__(self, server: LiveServer, job_id: int, wait_seconds: float) -> None:
        self.wait_seconds = wait_seconds
        self.answer: httpx.Response | None = None
        self.elapsed = 0.0

        def run() -> None:
            with httpx.Client(base_url=server.url, timeout=120) as c:
                start = time.monotonic()
                self.answer = c.get(f"/jobs/{job_id}", params={"wait_seconds": wait_seconds})
                self.elapsed = time.monotonic() - start

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def result(self) -> dict[str, Any]:
        self.thread.join(120)
        assert self.answer is not None and self.answer.status_code == 200, self.answer
        return self.answer.json()  # type: ignore[no-any-return]


def parked(server: LiveServer, n: int = 1) -> None:
    wait_until(lambda: server.services.results.parked == n, what=f"{n} request(s) waiting")


def pair(server_factory: Callable[..., LiveServer]) -> tuple[LiveServer, LiveServer]:
    """Two replicas on one database; the fallback poll at 60 s, so only a wake-up can answer in time."""
    a = server_factory(poll_interval_seconds=60)
    b = server_factory(poll_interval_seconds=60)
    wait_until(
        lambda: a.services.wakeups.connected.is_set() and b.services.wakeups.connected.is_set(), what="listening"
    )
    return a, b


def test_a_wait_answers_when_the_job_completes(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(poll_interval_seconds=60)
    job = server.enqueue(payload="add", max_attempts=3)
    waiting = Waiting(server, job["id"], 20)
    parked(server)
    finished = record_finishes(server)
    claim = server.claim_one()
    assert waiting.thread.is_alive()  # a claim is not an end
    server.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": claim["claim_token"], "result": 42})
    done = waiting.result()
    assert (done["status"], done["result"], done["payload"], done["attempts"]) == ("completed", 42, "add", 1)
    assert waiting.elapsed < 20  # answered by the complete, not by the deadline
    assert finished == [[job["id"]]]  # the complete's own wake-up
    assert server.services.results.parked == 0 and server.services.dispatcher.cap.taken == 0


def test_a_wait_on_one_replica_answers_a_complete_on_another(server_factory) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(server_factory)
    job = b.enqueue(payload="cross")
    waiting = Waiting(a, job["id"], 20)
    parked(a)
    wait_until(lambda: job["id"] in b.services.wakeups._remote_jobs, what="b learning that a waits for the job")
    received = record_messages(a)
    claim = b.claim_one()
    b.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": claim["claim_token"], "result": {"ok": 1}})
    done = waiting.result()
    assert (done["id"], done["status"], done["result"]) == (job["id"], "completed", {"ok": 1})
    assert waiting.elapsed < 20  # answered by the wake-up: the fallback poll is 60 s away
    # A waiting request is also looked at whenever its presence is renewed (every 2 s): such a look can answer
    # it a moment before the NOTIFY arrives. The answer alone does not show the wake-up; its message does.
    wait_until(lambda: woken_over_notify(received, job["id"]), what="the wake-up over NOTIFY")


def woken_over_notify(received: list[str], job_id: int) -> bool:
    """A wake-up for this job came over NOTIFY (not only a presence renewal)."""
    return any(m.split(" ")[1:2] == ["w"] and f"#{job_id}" in m.split(" ")[2:] for m in received)


def _batch_complete(b: LiveServer, claim: dict[str, Any]) -> None:
    r = b.client.post("/jobs/complete", json={"jobs": [{"id": claim["id"], "claim_token": claim["claim_token"]}]})
    assert r.json()["results"][0]["outcome"] == "completed"


def _complete_on_claim(b: LiveServer, claim: dict[str, Any]) -> None:
    r = b.client.post(
        "/queues/q/claim", json={"worker": "w", "complete": [{"id": claim["id"], "claim_token": claim["claim_token"]}]}
    )
    assert r.json()["completed"][0]["outcome"] == "completed"


def _fail_for_good(b: LiveServer, claim: dict[str, Any]) -> None:
    r = b.client.post(
        f"/jobs/{claim['id']}/fail", json={"claim_token": claim["claim_token"], "error": "no", "retry": False}
    )
    assert r.json()["status"] == "failed"


def _cancel(b: LiveServer, claim: dict[str, Any]) -> None:
    assert b.client.post(f"/jobs/{claim['id']}/cancel").json()["status"] == "cancelled"


def _bulk_cancel(b: LiveServer, claim: dict[str, Any]) -> None:
    r = b.client.post("/jobs/bulk", json={"action": "cancel", "ids": [claim["id"]]})
    assert r.json()["jobs"] == [{"id": claim["id"], "outcome": "done", "status": "cancelled"}]


def _lease_lapses_on_the_last_attempt(b: LiveServer, claim: dict[str, Any]) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    assert b.run(lambda: b.services.maintenance["rescuer"].run_once(later)).failed == 1


@pytest.mark.parametrize(
    ("finish", "status"),
    [
        (_batch_complete, "completed"),
        (_complete_on_claim, "completed"),
        (_fail_for_good, "failed"),
        (_cancel, "cancelled"),
        (_bulk_cancel, "cancelled"),
        (_lease_lapses_on_the_last_attempt, "failed"),
    ],
)
def test_every_way_a_job_finishes_wakes_its_waiters_elsewhere(server_factory, finish, status: str) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(server_factory)
    job = b.enqueue(payload=1, max_attempts=1)
    claim = b.claim_one()
    waiting = Waiting(a, job["id"], 20)
    parked(a)
    wait_until(lambda: job["id"] in b.services.wakeups._remote_jobs, what="b learning that a waits for the job")
    received = record_messages(a)
    finish(b, claim)
    done = waiting.result()
    assert (done["id"], done["status"]) == (job["id"], status)
    assert waiting.elapsed < 20
    # As above: a presence renewal's look can answer a moment before the NOTIFY is received.
    wait_until(lambda: woken_over_notify(received, job["id"]), what="the wake-up over NOTIFY")


def test_a_fail_that_will_be_retried_does_not_end_the_wait(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(poll_interval_seconds=0.05)
    job = server.enqueue(payload=1, max_attempts=2)
    waiting = Waiting(server, job["id"], 20)
    parked(server)
    claim = server.claim_one()
    server.client.post(f"/jobs/{job['id']}/fail", json={"claim_token": claim["claim_token"], "error": "flaky",
                                                        "retry_in_seconds": 0})  # fmt: skip
    claim = server.claim_one()
    assert waiting.thread.is_alive()
    server.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": claim["claim_token"], "result": "2nd"})
    done = waiting.result()
    assert (done["status"], done["attempts"], done["result"]) == ("completed", 2, "2nd")


def test_at_the_deadline_the_job_as_it_is(server: LiveServer) -> None:
    job = server.enqueue(payload=1)
    start = time.monotonic()
    r = server.client.get(f"/jobs/{job['id']}", params={"wait_seconds": 0.5})
    assert time.monotonic() - start >= 0.5  # never early
    assert (r.status_code, r.json()["status"]) == (200, "pending")
    assert server.services.results.parked == 0


def test_a_finished_job_answers_at_once(server: LiveServer) -> None:
    job = server.enqueue(payload=1)
    claim = server.claim_one()
    server.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": claim["claim_token"], "result": "r"})
    r = server.client.get(f"/jobs/{job['id']}", params={"wait_seconds": 30}, timeout=5)
    assert (r.status_code, r.json()["result"]) == (200, "r")


def test_a_finish_whose_wake_up_was_lost_is_found_by_the_fallback_poll(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(poll_interval_seconds=0.1)
    job = server.enqueue(payload=1)
    waiting = Waiting(server, job["id"], 20)
    parked(server)
    # Finished behind jobq's back: no statement of jobq, so no wake-up at all.
    db.execute("UPDATE jobq.jobs SET status = 'cancelled', finished_at = now() WHERE id = %s", (job["id"],))
    assert waiting.result()["status"] == "cancelled"


@pytest.mark.parametrize("wait", ["31", "-1", "nan", "inf", "soon"])
def test_a_bad_wait_is_422(server: LiveServer, wait: str) -> None:
    job = server.enqueue(payload=1)
    body = problem(server.client.get(f"/jobs/{job['id']}", params={"wait_seconds": wait}), 422, "validation-error")
    assert body["errors"][0]["loc"] == ["query", "wait_seconds"]


def test_an_unknown_job_is_404_without_waiting(server: LiveServer) -> None:
    problem(server.client.get("/jobs/999999", params={"wait_seconds": 30}, timeout=5), 404, "job-not-found")
    assert server.services.results.parked == 0


def test_waiting_requests_hold_no_connections(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(pool_max_size=4, poll_interval_seconds=60)
    r = server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(50)]})
    ids = [j["id"] for j in r.json()["jobs"]]
    answers: list[dict[str, Any]] = []

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=httpx.Limits(max_connections=60)) as c:

            async def wait(job_id: int) -> None:
                answers.append((await c.get(f"/jobs/{job_id}", params={"wait_seconds": 25})).json())

            waits = [asyncio.create_task(wait(i)) for i in ids]
            while server.services.results.parked < 50:
                await asyncio.sleep(0.01)

            # 50 requests wait on a pool of at most 4 connections: they cannot be holding any.
            def idle() -> bool:
                stats = server.services.db.pool.get_stats()
                busy = db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'jobq' AND state <> 'idle'"
                ).fetchone()
                return stats["pool_size"] == stats["pool_available"] and busy == (0,)

            deadline = time.monotonic() + 20
            while not idle():
                assert time.monotonic() < deadline, "the pool never went idle while requests waited"
                await asyncio.sleep(0.02)
            claims = (await c.post("/queues/q/claim", json={"worker": "w", "limit": 50})).json()["jobs"]
            done = [{"id": j["id"], "claim_token": j["claim_token"], "result": j["payload"]} for j in claims]
            assert (await c.post("/jobs/complete", json={"jobs": done})).status_code == 200
            await asyncio.gather(*waits)

    asyncio.run(main())
    assert sorted((a["id"], a["status"], a["result"]) for a in answers) == [
        (i, "completed", n) for n, i in enumerate(ids)
    ]


def test_waits_and_claims_share_the_waiter_cap(server_factory) -> None:  # type: ignore[no-untyped-def]
    # One client here: its share (by default half the cap) set to the whole cap, to reach the cap itself.
    server: LiveServer = server_factory(max_waiters=3, max_waiters_per_client=3, poll_interval_seconds=60)
    job = server.enqueue(queue="other", payload=1)

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            # They wait long enough that none can give up before the refused ones arrive on a slow machine;
            # a complete and a job end them below.
            held = [
                asyncio.create_task(c.get(f"/jobs/{job['id']}", params={"wait_seconds": 20})),
                asyncio.create_task(c.get(f"/jobs/{job['id']}", params={"wait_seconds": 20})),
                asyncio.create_task(c.post("/queues/q/claim", json={"worker": "w", "wait_seconds": 20})),
            ]
            while server.services.dispatcher.cap.taken < 3:
                await asyncio.sleep(0.01)
            r = await c.get(f"/jobs/{job['id']}", params={"wait_seconds": 2})
            problem(r, 429, "too-many-waiters")
            assert r.headers["retry-after"] == "1"
            problem(await c.post("/queues/q/claim", json={"worker": "w", "wait_seconds": 2}), 429, "too-many-waiters")
            assert (await c.get(f"/jobs/{job['id']}")).status_code == 200  # not waiting: served
            [claim] = (await c.post("/queues/other/claim", json={"worker": "w"})).json()["jobs"]
            done = await c.post(f"/jobs/{job['id']}/complete", json={"claim_token": claim["claim_token"]})
            assert done.status_code == 200, done.text
            assert (await c.post("/queues/q/jobs", json={"payload": 2})).status_code == 201
            first, second, claimed = await asyncio.gather(*held)
            assert (first.json()["status"], second.json()["status"], len(claimed.json()["jobs"])) == (
                "completed", "completed", 1,
            )  # fmt: skip

    asyncio.run(main())
    assert server.services.dispatcher.cap.taken == 0


def test_past_the_waiter_cap_unknown_and_finished_jobs_answer_as_usual(server_factory) -> None:  # type: ignore[no-untyped-def]
    """Only a wait that would have to wait needs a waiting place: with none left, an unknown job is still
    404 at once and a finished job still answers at once; only an unfinished one gets 429."""
    server: LiveServer = server_factory(max_waiters=1, poll_interval_seconds=60)
    pending = server.enqueue(queue="other", payload=1)
    done = server.enqueue(payload=2)
    claim = server.claim_one()
    server.client.post(f"/jobs/{done['id']}/complete", json={"claim_token": claim["claim_token"], "result": 3})
    holder = Waiting(server, pending["id"], 20)
    parked(server)
    problem(server.client.get("/jobs/999999", params={"wait_seconds": 5}), 404, "job-not-found")
    r = server.client.get(f"/jobs/{done['id']}", params={"wait_seconds": 5})
    assert r.status_code == 200 and (r.json()["status"], r.json()["result"]) == ("completed", 3)
    problem(server.client.get(f"/jobs/{pending['id']}", params={"wait_seconds": 5}), 429, "too-many-waiters")
    claim = server.claim_one(queue="other")
    server.client.post(f"/jobs/{pending['id']}/complete", json={"claim_token": claim["claim_token"]})
    assert holder.result()["status"] == "completed"
    assert server.services.dispatcher.cap.taken == 0


def test_a_wait_whose_client_left_goes_away(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(poll_interval_seconds=60)
    job = server.enqueue(payload=1)
    leave_while_waiting(server, "GET", f"/jobs/{job['id']}?wait_seconds=25", None,
                        lambda: server.services.results.parked == 1, "the wait to park")  # fmt: skip
    wait_until(lambda: server.services.results.parked == 0, what="the departed waiter being dropped")
    assert server.services.dispatcher.cap.taken == 0


def test_no_wake_up_is_sent_when_nobody_waits_elsewhere(server_factory) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(server_factory)
    wait_until(lambda: a.services.wakeups.idle() and b.services.wakeups.idle(), what="hellos going out")
    sent = a.services.wakeups.sent
    for i in range(10):
        job = a.enqueue(payload=i)
        claim = a.claim_one()
        a.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": claim["claim_token"]})
    wait_until(lambda: a.services.wakeups.idle(), what="a's sender settling")
    assert a.services.wakeups.sent == sent
