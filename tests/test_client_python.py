"""The Python SDK (clients/python, `jobq_client`) against the live service: Client, AsyncClient and
Worker, including a worker process stopped by a real SIGTERM."""

from __future__ import annotations

import asyncio
import collections
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from json import loads as json_loads
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from jobq_client import (
    NO_RETRY,
    AsyncClient,
    Claim,
    ClaimLost,
    Client,
    Conflict,
    Debounce,
    Enqueued,
    Forbidden,
    JobCancelled,
    JobContext,
    JobNotFound,
    JobqError,
    JobState,
    NewJob,
    NotFound,
    PermanentFailure,
    RateLimited,
    RetryLater,
    RetryPolicy,
    ServerError,
    ServiceUnavailable,
    TransportError,
    Unauthorized,
    Unique,
    ValidationError,
    WaitTimeout,
    Worker,
    enqueue_batch_in_transaction,
    enqueue_in_transaction,
)
from jobq_client.errors import InvalidState, error_from_response

from app.main import published_document
from tests.conftest import make_settings
from tests.support import LiveServer, TcpProxy, wait_until, whole_lines

ROOT = Path(__file__).parent.parent
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
QUICK = RetryPolicy(attempts=50, backoff_base=0.05, backoff_max=0.2)


def statuses(db: psycopg.Connection, queue: str = "q") -> dict[str, int]:
    rows = db.execute("SELECT status, count(*) FROM jobq.jobs WHERE queue_name = %s GROUP BY status", (queue,))
    return dict(rows.fetchall())  # type: ignore[arg-type]


def has_route(path: str) -> bool:
    return path in published_document()["paths"]


@contextmanager
def running(worker: Worker) -> Iterator[None]:
    """The worker in a thread (no signal handlers there); stopped and joined on the way out."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, name="sdk-worker")
    thread.start()
    try:
        yield
    finally:
        worker.stop()
        thread.join(60)
        assert not thread.is_alive(), "the worker did not stop"
    assert not failures, failures


# --- Client -------------------------------------------------------------------------------------------------


def test_client_drives_the_whole_lifecycle(server: LiveServer) -> None:
    with Client(server.url) as jobq:
        first = jobq.enqueue("q", {"to": "ada"}, priority=5, idempotency_key="welcome-ada", max_attempts=3)
        assert (first.status, first.payload, first.priority, first.max_attempts) == ("pending", {"to": "ada"}, 5, 3)
        assert isinstance(first.created_at, datetime) and first.created_at.tzinfo is not None
        assert jobq.enqueue("q", {"to": "ada"}, idempotency_key="welcome-ada").id == first.id
        batch = jobq.enqueue_batch("q", [NewJob(payload=1), {"payload": 2, "delay_seconds": 3600}])
        assert [j.payload for j in batch] == [1, 2]
        assert batch[1].run_at > batch[0].run_at

        [claim] = jobq.claim("q", "w1", lease_seconds=60)  # priority 5 first
        assert isinstance(claim, Claim)
        assert (claim.id, claim.attempts, claim.last_attempt) == (first.id, 1, False)
        assert "claim_token" not in repr(claim)
        beat = jobq.heartbeat(claim.id, claim.claim_token, lease_seconds=600)
        assert beat.id == claim.id and beat.lease_expires_at > claim.lease_expires_at
        assert beat.cancel_requested is False
        done = jobq.complete(claim.id, claim.claim_token, {"message_id": "m1"})
        assert (done.status, done.result, done.worker) == ("completed", {"message_id": "m1"}, "w1")
        assert jobq.complete(claim.id, claim.claim_token, {"ignored": True}).result == {"message_id": "m1"}

        [second] = jobq.claim("q", "w1")
        failed = jobq.fail(second.id, second.claim_token, "SMTP 451", retry_in_seconds=3600)
        assert (failed.status, failed.last_error, failed.attempts) == ("pending", "SMTP 451", 1)
        assert jobq.get_job(second.id) == failed

        third = jobq.enqueue("q", "last")
        [claimed] = jobq.claim("q", "w1")
        assert claimed.id == third.id
        [outcome] = jobq.complete_many([(claimed.id, claimed.claim_token, "ok")])
        assert (outcome.id, outcome.outcome, outcome.status) == (third.id, "completed", "completed")
        dead = jobq.enqueue("q", "no retry")
        [c] = jobq.claim("q", "w1")
        assert jobq.fail(c.id, c.claim_token, "bad input", retry=False).status == "failed"
        assert dead.id == c.id


def test_release_hands_a_job_back_untried(server: LiveServer) -> None:
    with Client(server.url, retry=NO_RETRY) as jobq:
        job = jobq.enqueue("q", "x", max_attempts=1)
        [claim] = jobq.claim("q", "w1")
        back = jobq.release(claim.id, claim.claim_token)
        assert (back.id, back.status, back.attempts, back.last_error) == (job.id, "pending", 0, None)
        assert back.claimed_at is None and back.lease_expires_at is None
        with pytest.raises(ClaimLost):
            jobq.release(claim.id, claim.claim_token)  # the claim ended with the first release
        [again] = jobq.claim("q", "w2")
        later = jobq.release(again.id, again.claim_token, delay_seconds=3600)
        assert later.run_at > back.run_at and jobq.claim("q", "w2") == []
        other = jobq.enqueue("q", "y")
        [held] = jobq.claim("q", "w3")
        assert held.id == other.id
        with pytest.raises(ValidationError):
            jobq.release(held.id, held.claim_token, delay_seconds=-1)


def test_error_answers_are_typed_exceptions(server: LiveServer) -> None:
    with Client(server.url) as jobq:
        job = jobq.enqueue("q", 1)
        [claim] = jobq.claim("q", "w")
        with pytest.raises(ClaimLost) as lost:
            jobq.heartbeat(claim.id, "not-the-token")
        assert (lost.value.status, lost.value.slug, lost.value.type) == (
            409,
            "claim-lost",
            "urn:jobq:problem:claim-lost",
        )
        assert lost.value.detail and lost.value.title
        with pytest.raises(ClaimLost):
            jobq.complete(claim.id, "not-the-token")
        with pytest.raises(ClaimLost):
            jobq.fail(claim.id, "not-the-token", "x")
        with pytest.raises(JobNotFound) as missing:
            jobq.get_job(987654)
        assert isinstance(missing.value, NotFound) and missing.value.status == 404
        with pytest.raises(ValidationError) as invalid:
            jobq.claim("q", "w", lease_seconds=10**9)
        assert invalid.value.errors and invalid.value.errors[0]["loc"][-1] == "lease_seconds"
        with pytest.raises(ValidationError):
            jobq.enqueue("not a queue name", 1)
        with pytest.raises(ValueError, match="JSON"):
            jobq.enqueue("q", float("nan"))  # refused here, never sent
        assert jobq.get_job(job.id).status == "running"


@pytest.mark.parametrize(
    ("status", "slug", "expected"),
    [
        (401, "unauthorized", Unauthorized),
        (403, "forbidden", Forbidden),
        (404, "job-not-found", JobNotFound),
        (404, "not-found", NotFound),
        (409, "claim-lost", ClaimLost),
        (409, "invalid-state", InvalidState),
        (409, "job-cancelled", JobCancelled),
        (409, "a-conflict-from-a-newer-server", Conflict),
        (422, "validation-error", ValidationError),
        (429, "too-many-waiters", RateLimited),
        (429, "rate-limited", RateLimited),
        (500, "internal-error", ServerError),
        (503, "database-unavailable", ServiceUnavailable),
        (503, "shutting-down", ServiceUnavailable),
        (418, "something-new", JobqError),
    ],
)
def test_problem_types_map_to_exception_classes(status: int, slug: str, expected: type[JobqError]) -> None:
    doc = {"type": f"urn:jobq:problem:{slug}", "title": "T", "status": status, "detail": "D"}
    answer = httpx.Response(status, json=doc, headers={"content-type": "application/problem+json", "retry-after": "3"})
    error = error_from_response(answer)
    assert type(error) is expected
    assert (error.status, error.type, error.title, error.detail, error.retry_after) == (
        status,
        doc["type"],
        "T",
        "D",
        3,
    )
    assert error.problem == doc


def test_an_answer_that_is_not_a_problem_still_maps_by_status() -> None:
    error = error_from_response(httpx.Response(502, text="<html>Bad Gateway</html>"))
    assert type(error) is ServerError and error.status == 502 and "Bad Gateway" in error.detail


def test_minimal_answers_are_ids_and_states(server: LiveServer) -> None:
    """minimal=True sends `Prefer: return=minimal` and returns what the server answers then; the calls
    without it are unchanged."""
    exchanges: list[tuple[str, str | None, str | None]] = []

    def seen(response: httpx.Response) -> None:
        request = response.request
        exchanges.append((request.url.path, request.headers.get("prefer"), response.headers.get("preference-applied")))

    with httpx.Client(event_hooks={"response": [seen]}) as http, Client(server.url, http_client=http) as jobq:
        first = jobq.enqueue("q", {"to": "ada"}, idempotency_key="k", minimal=True)
        assert first == Enqueued(id=first.id, status="pending", created=True, enqueued="created")
        again = jobq.enqueue("q", "other", idempotency_key="k", minimal=True)
        assert again == Enqueued(first.id, "pending", False, "existing")
        batch = jobq.enqueue_batch("q", [NewJob(1), NewJob(2, idempotency_key="k")], minimal=True)
        assert [(b.status, b.created, b.enqueued) for b in batch] == [
            ("pending", True, "created"),
            ("pending", False, "existing"),
        ]
        assert batch[1].id == first.id
        [a, b] = jobq.claim("q", "w", limit=2)
        assert jobq.complete(a.id, a.claim_token, {"r": 1}, minimal=True) == JobState(a.id, "completed")
        assert jobq.get_job(a.id).result == {"r": 1}
        assert jobq.fail(b.id, b.claim_token, "e", retry=False, minimal=True) == JobState(b.id, "failed")
        assert jobq.enqueue("q", 3).payload == 3  # the default answer: the job
    minimal = [e for e in exchanges if e[1] is not None]
    assert len(minimal) == 5 and {e[1:] for e in minimal} == {("return=minimal", "return=minimal")}
    assert exchanges[-1] == ("/queues/q/jobs", None, None)


def test_async_minimal_answers(server: LiveServer) -> None:
    async def main() -> None:
        async with AsyncClient(server.url) as jobq:
            made = await jobq.enqueue("q", 1, minimal=True)
            [other] = await jobq.enqueue_batch("q", [NewJob(2)], minimal=True)
            assert (made.created, other.created) == (True, True)
            [a, b] = await jobq.claim("q", "aw", limit=2)
            assert await jobq.complete(a.id, a.claim_token, "r", minimal=True) == JobState(made.id, "completed")
            assert await jobq.fail(b.id, b.claim_token, "e", retry_in_seconds=0, minimal=True) == JobState(
                other.id, "pending"
            )

    asyncio.run(main())


def test_the_worker_completes_and_fails_with_minimal_answers(server: LiveServer, db: psycopg.Connection) -> None:
    """The Worker never reads the job a complete or fail answers: it asks for the minimal answer."""
    writes: list[tuple[str | None, str | None]] = []

    async def seen(response: httpx.Response) -> None:
        if response.request.url.path.endswith(("/complete", "/fail")):
            writes.append((response.request.headers.get("prefer"), response.headers.get("preference-applied")))

    with Client(server.url) as jobq:
        jobq.enqueue_batch("q", [NewJob("ok"), NewJob("fail", max_attempts=1)])

    async def main() -> None:
        async with httpx.AsyncClient(event_hooks={"response": [seen]}) as http:
            worker = Worker(AsyncClient(server.url, http_client=http), wait_seconds=0.2)

            @worker.handler("q")
            def handle(job: JobContext) -> str:
                if job.payload == "fail":
                    raise PermanentFailure("no")
                return "done"

            running = asyncio.create_task(worker.arun())
            for _ in range(1200):  # a minute at most
                if statuses(db) == {"completed": 1, "failed": 1}:
                    break
                await asyncio.sleep(0.05)
            worker.stop()
            await running

    asyncio.run(main())
    assert writes and set(writes) == {("return=minimal", "return=minimal")}


def test_async_client(server: LiveServer) -> None:
    async def main() -> None:
        async with AsyncClient(server.url) as jobq:
            [a, b] = await jobq.enqueue_batch("q", [NewJob(1, idempotency_key="a"), NewJob(2, idempotency_key="b")])
            claims = await jobq.claim("q", "aw", limit=2, wait_seconds=1)
            assert [c.id for c in claims] == [a.id, b.id]
            await jobq.heartbeat(claims[0].id, claims[0].claim_token)
            assert (await jobq.complete(claims[0].id, claims[0].claim_token, "r")).status == "completed"
            assert (await jobq.fail(claims[1].id, claims[1].claim_token, "e", retry=False)).status == "failed"
            assert (await jobq.get_job(a.id)).result == "r"
            c = await jobq.enqueue("q", 3)
            [claim] = await jobq.claim("q", "aw")
            released = await jobq.release(claim.id, claim.claim_token, delay_seconds=0)
            assert (released.id, released.status, released.attempts) == (c.id, "pending", 0)
            with pytest.raises(ClaimLost):
                await jobq.heartbeat(claims[0].id, claims[0].claim_token)

    asyncio.run(main())


def test_dependencies(server: LiveServer) -> None:
    with Client(server.url) as jobq:
        parent = jobq.enqueue("q", "p")
        child = jobq.enqueue("q", "c", depends_on=[parent.id], on_dependency_failure="run")
        assert (child.status, child.depends_on, child.on_dependency_failure) == ("waiting", (parent.id,), "run")
        assert child.pending_dependencies == 1 and not child.finished
        fetch, publish = jobq.enqueue_batch(
            "q", [NewJob("fetch", ref="fetch"), NewJob("publish", depends_on=["fetch", parent.id])]
        )
        assert publish.depends_on == (fetch.id, parent.id) and publish.pending_dependencies == 2
        [claim] = jobq.claim("q", "w")
        assert claim.id == parent.id
        jobq.complete(claim.id, claim.claim_token)
        assert jobq.get_job(child.id).status == "pending"
        assert jobq.get_job(publish.id).pending_dependencies == 1


def test_unique_jobs(server: LiveServer) -> None:
    with Client(server.url) as jobq:
        first = jobq.enqueue("q", {"doc": 1}, unique=Unique(key="reindex-1", for_seconds=3600))
        assert first.unique is not None and first.unique.key == "reindex-1" and first.unique.for_seconds == 3600
        assert first.unique.while_ == ("pending", "running", "completed")
        assert first.unique.window_start is not None and first.unique.window_end is not None
        assert first.enqueued == "created"
        again = jobq.enqueue("q", {"doc": 2}, unique={"key": "reindex-1", "for_seconds": 3600})
        assert (again.id, again.enqueued) == (first.id, "existing")
        a, b = jobq.enqueue_batch(
            "q", [NewJob(7, unique=Unique()), NewJob(7, unique=Unique(while_=["pending", "running"]))]
        )
        assert a.id == b.id  # the same payload: the same key, held by the first (pending)
        with pytest.raises(ValidationError):
            jobq.enqueue("q", 1, unique=Unique(while_=["pending"]))


def test_debounced_jobs(server: LiveServer) -> None:
    with Client(server.url) as jobq:
        first = jobq.enqueue("q", {"rev": 1}, debounce=Debounce("reindex-9", 600, max_wait_seconds=3600))
        assert first.debounce is not None and first.debounce.key == "reindex-9" and first.debounce.seconds == 600
        assert first.debounce.run_by is not None
        again = jobq.enqueue("q", {"rev": 2}, debounce={"key": "reindex-9", "seconds": 600})
        assert (again.id, again.payload, again.enqueued) == (first.id, {"rev": 2}, "replaced")
        [a, b] = jobq.enqueue_batch("q", [NewJob(1, debounce=Debounce("k", 60)), NewJob(2, debounce=Debounce("k", 60))])
        assert a.id == b.id and b.payload == 2 and (a.enqueued, b.enqueued) == ("created", "replaced")


def test_enqueue_in_the_callers_transaction(server: LiveServer, database_url: str) -> None:
    """enqueue_in_transaction: the SDK's call of jobq.enqueue through the application's own connection."""
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.commit()
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")
            job_id = enqueue_in_transaction(
                conn, "emails", {"order": 1}, priority=5, delay_seconds=0.0, max_attempts=3, group="t1",
                idempotency_key="order-1", timeout_seconds=60,
            )  # fmt: skip
            assert server.client.get(f"/jobs/{job_id}").status_code == 404  # not before the commit
        job = server.client.get(f"/jobs/{job_id}").json()
        assert (job["payload"], job["priority"], job["max_attempts"], job["group"]) == ({"order": 1}, 5, 3, "t1")
        assert job["timeout_seconds"] == 60
        assert enqueue_in_transaction(conn, "emails", {"order": 1}, idempotency_key="order-1") == job_id
        conn.commit()
        with pytest.raises(psycopg.errors.UniqueViolation), conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")  # the business write fails: no job either
            enqueue_in_transaction(conn, "emails", {"order": "dup"})
        held = enqueue_in_transaction(conn, "emails", 7, unique=Unique(key="u", for_seconds=60))
        assert enqueue_in_transaction(conn, "emails", 8, unique={"key": "u", "for_seconds": 60}) == held
        debounced = enqueue_in_transaction(conn, "emails", 1, debounce=Debounce("d", 600, max_wait_seconds=900))
        assert enqueue_in_transaction(conn, "emails", 2, debounce={"key": "d", "seconds": 600}) == debounced
        child = enqueue_in_transaction(conn, "emails", 3, depends_on=[job_id], on_dependency_failure="run")
        ids = enqueue_batch_in_transaction(conn, "emails", [NewJob(10, ref="a"), {"payload": 11, "depends_on": ["a"]}])
        conn.commit()
    assert server.client.get(f"/jobs/{debounced}").json()["payload"] == 2
    assert server.client.get(f"/jobs/{child}").json()["status"] == "waiting"
    assert [server.client.get(f"/jobs/{i}").json()["status"] for i in ids] == ["pending", "waiting"]
    assert server.client.get("/queues/emails/stats").json()["counts"]["pending"] == 4  # no trace of "dup"
    with psycopg.connect(database_url) as conn, pytest.raises(psycopg.errors.InvalidParameterValue, match="priority"):
        enqueue_in_transaction(conn, "emails", 1, priority=10**6)
    with pytest.raises(ValueError):
        enqueue_in_transaction(conn, "emails", 1, schema="jobq; DROP TABLE x")


def test_enqueue_and_wait_returns_the_job_a_worker_finished(server: LiveServer) -> None:
    worker = Worker(server.url, wait_seconds=1)

    @worker.handler("math")
    def double(job: JobContext) -> int:
        if job.payload == "boom":
            raise PermanentFailure("not a number")
        return int(job.payload) * 2

    with Client(server.url) as jobq, running(worker):
        done = jobq.enqueue_and_wait("math", 21, timeout=60)
        assert (done.status, done.result, done.finished) == ("completed", 42, True)
        failed = jobq.enqueue_and_wait("math", "boom", timeout=60, idempotency_key="boom-1")
        assert (failed.status, failed.last_error) == ("failed", "PermanentFailure: not a number")
        assert jobq.wait(failed.id) == failed  # finished already: answered at once

    waits: list[str] = []
    hooks = {"request": [lambda r: waits.append(str(r.url)) if r.method == "GET" else None]}
    with httpx.Client(event_hooks=hooks) as http, Client(server.url, http_client=http) as jobq:
        # Nobody works on this queue: the wait gives up after its timeout, several server waits later (a
        # timeout ten chunks long: at 0.7 s, requests slower than 0.35 s on a loaded machine made only two).
        jobq.wait_chunk = 0.2
        nobody = jobq.enqueue("idle", "x")
        with pytest.raises(WaitTimeout) as timed_out:
            jobq.wait(nobody.id, timeout=2)
        assert (timed_out.value.job.id, timed_out.value.job.status) == (nobody.id, "pending")
        assert isinstance(timed_out.value, TimeoutError)
        assert len(waits) >= 3 and f"/jobs/{nobody.id}?wait_seconds=0.2" in waits[0]
        with pytest.raises(JobNotFound):
            jobq.wait(10**12, timeout=5)


def test_async_enqueue_and_wait(server: LiveServer) -> None:
    async def main() -> None:
        async with AsyncClient(server.url) as jobq:
            waiting = asyncio.create_task(jobq.enqueue_and_wait("q", "ask", timeout=60))
            claim = None
            while claim is None:
                claim = next(iter(await jobq.claim("q", "aw", wait_seconds=1)), None)
            await jobq.complete(claim.id, claim.claim_token, {"answer": 42})
            done = await waiting
            assert (done.id, done.status, done.result) == (claim.id, "completed", {"answer": 42})
            jobq.wait_chunk = 0.1
            with pytest.raises(WaitTimeout):
                await jobq.wait((await jobq.enqueue("idle", 1)).id, timeout=0.3)

    asyncio.run(main())


def test_the_api_key_is_sent_as_a_bearer_token(server: LiveServer) -> None:
    seen: list[str | None] = []
    hooks = {"request": [lambda request: seen.append(request.headers.get("authorization"))]}
    with httpx.Client(event_hooks=hooks) as http, Client(server.url, api_key="k-123", http_client=http) as jobq:
        jobq.enqueue("q", 1)
        [c] = jobq.claim("q", "w")
        jobq.heartbeat(c.id, c.claim_token)
        jobq.complete(c.id, c.claim_token)
        jobq.get_job(c.id)
    assert seen == ["Bearer k-123"] * 5


@pytest.mark.skipif(
    not has_route("/queues/{queue}/stats"), reason="GET /queues/{queue}/stats is not on this server yet"
)
def test_stats(server: LiveServer) -> None:
    with Client(server.url) as jobq:
        jobq.enqueue("q", 1)
        stats = jobq.stats("q")
    assert isinstance(stats, dict) and stats


# --- retries ------------------------------------------------------------------------------------------------


def test_429_is_retried_after_retry_after(server_factory, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(max_waiters=1, poll_interval_seconds=60)
    caplog.set_level(logging.INFO, "jobq_client")
    first: list[Claim] = []
    with Client(server.url) as jobq:
        waiting = threading.Thread(target=lambda: first.extend(jobq.claim("q", "a", wait_seconds=30)))
        waiting.start()
        wait_until(lambda: server.services.dispatcher.parked == 1, what="the first long-poll parked")
        second: list[list[Claim]] = []
        retried = threading.Thread(target=lambda: second.append(jobq.claim("q", "b", wait_seconds=0.5)))
        retried.start()
        wait_until(lambda: "too-many-waiters" in caplog.text, what="a 429 retried")
        job = jobq.enqueue("q", "wakes the first")
        waiting.join(30)
        retried.join(30)
    assert [c.id for c in first] == [job.id]
    assert second == [[]]  # the retry got through once the cap freed up
    retry = next(r for r in caplog.records if "too-many-waiters" in r.getMessage())
    assert "in 1.00s" in retry.getMessage()  # the server's Retry-After: 1


@pytest.fixture
def outage(database_url: str) -> Iterator[tuple[LiveServer, TcpProxy]]:
    """The service behind a TCP relay to its database that the test can cut."""
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    proxy = TcpProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)).start()
    info.update(host="127.0.0.1", port=str(proxy.port))
    url = psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]
    server = LiveServer(make_settings(url, pool_timeout_seconds=0.5)).start()
    try:
        yield server, proxy
    finally:
        server.stop()
        proxy.stop()


def test_503_is_retried_where_safe(outage: tuple[LiveServer, TcpProxy], db: psycopg.Connection, caplog) -> None:  # type: ignore[no-untyped-def]
    server, proxy = outage
    caplog.set_level(logging.INFO, "jobq_client")
    with Client(server.url, retry=QUICK) as jobq:
        job = jobq.enqueue("q", "before")
        [claim] = jobq.claim("q", "w")
        proxy.cut()
        # Without an idempotency key a 503 may hide a committed INSERT: not retried, never doubled.
        with pytest.raises(ServiceUnavailable) as refused:
            jobq.enqueue("q", "no key")
        assert refused.value.retry_after is not None and refused.value.retry_after >= 1
        assert "retrying enqueueJob" not in caplog.text

        results: dict[str, Any] = {}

        def during_the_outage() -> None:
            results["enqueued"] = jobq.enqueue("q", "keyed", idempotency_key="k1")
            results["completed"] = jobq.complete(claim.id, claim.claim_token, "done")

        worker = threading.Thread(target=during_the_outage)
        worker.start()
        wait_until(lambda: "retrying enqueueJob" in caplog.text, what="the keyed enqueue being retried")
        proxy.restore()
        worker.join(60)
    assert results["completed"].status == "completed" and results["completed"].id == job.id
    assert results["enqueued"].idempotency_key == "k1"
    keyed = db.execute("SELECT count(*) FROM jobq.jobs WHERE idempotency_key = 'k1'").fetchone()
    assert keyed == (1,)


def test_an_in_doubt_enqueue_is_retried_with_the_same_key_only() -> None:
    """The connection cut after the request was sent: the INSERT may have committed (a failover between the
    commit and the answer). A keyed enqueue is sent again with the same key, which finds the job it made;
    one without a key is not sent again, since that could make a second job."""
    bodies: list[dict[str, Any]] = []
    cut = [1]

    def serve(listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(
                    next(
                        v
                        for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n"))
                        if k.lower() == b"content-length"
                    )
                )
                while len(body) < length:
                    body += conn.recv(65536)
                bodies.append(json_loads(body))
                if cut[0] > 0:
                    cut[0] -= 1
                    continue  # closed without an answer
                answer = (
                    b'{"id": 7, "queue": "q", "status": "pending", "idempotency_key": "order-17",'
                    b' "run_at": "2026-01-01T00:00:00Z", "created_at": "2026-01-01T00:00:00Z"}'
                )
                conn.sendall(
                    b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\nconnection: close\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
                )

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        thread = threading.Thread(target=serve, args=(listener,), daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with Client(url, retry=QUICK) as jobq:
            assert jobq.enqueue("q", 1, idempotency_key="order-17").id == 7
            assert [b["idempotency_key"] for b in bodies] == ["order-17", "order-17"]
            bodies.clear()
            cut[0] = 1
            with pytest.raises(TransportError, match="after 1 attempt"):
                jobq.enqueue("q", 1)
            assert len(bodies) == 1
        listener.close()


def test_no_answer_is_retried_then_raised() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again at once: nothing listens there
    with Client(f"http://127.0.0.1:{port}", retry=RetryPolicy(attempts=3, backoff_base=0.01)) as jobq:
        with pytest.raises(TransportError, match="after 3 attempt"):
            jobq.heartbeat(1, "t")
        # Connection refused: the enqueue never left, so even without a key it is retried.
        with pytest.raises(TransportError, match="after 3 attempt"):
            jobq.enqueue("q", 1)
    with Client(f"http://127.0.0.1:{port}", retry=NO_RETRY) as jobq, pytest.raises(TransportError, match="after 1"):
        jobq.get_job(1)


# --- Worker -------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_worker_processes_1000_jobs_each_once(server: LiveServer, db: psycopg.Connection, kind: str) -> None:
    with Client(server.url) as jobq:
        jobs = jobq.enqueue_batch("q", [NewJob(payload=n) for n in range(1000)])
    handled: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()
    now_running = [0]
    most_at_once = [0]

    def begin(job: JobContext) -> None:
        with lock:
            handled[job.id] += 1
            now_running[0] += 1
            most_at_once[0] = max(most_at_once[0], now_running[0])

    def end() -> None:
        with lock:
            now_running[0] -= 1

    worker = Worker(server.url, concurrency=10, wait_seconds=1)
    if kind == "sync":

        @worker.handler("q")
        def double(job: JobContext) -> dict[str, int]:
            begin(job)
            time.sleep(0.001)
            end()
            return {"double": job.payload * 2}

    else:

        @worker.handler("q")
        async def double_async(job: JobContext) -> dict[str, int]:
            begin(job)
            await asyncio.sleep(0.001)
            end()
            return {"double": job.payload * 2}

    with running(worker):
        wait_until(lambda: statuses(db).get("completed") == 1000, timeout=180, what="1,000 jobs completed")
    assert sorted(handled) == sorted(j.id for j in jobs)
    assert set(handled.values()) == {1}
    assert 1 <= most_at_once[0] <= 10
    rows = db.execute("SELECT status, attempts, result = jsonb_build_object('double', payload::int * 2) FROM jobq.jobs")
    assert set(rows.fetchall()) == {("completed", 1, True)}
    # One request per job: results rode on the next claims; only jobs that finished while a claim was on its
    # way (the queue running dry at the end, mostly) were completed by a request of their own.
    requests = requests_by_route(server)
    alone = requests.get("/jobs/{job_id}/complete", 0)
    print(f"claims {requests['/queues/{queue}/claim']}, completes alone {alone}")
    assert requests["/queues/{queue}/claim"] + alone < 1.3 * 1000
    assert alone < 300


def requests_by_route(server: LiveServer) -> dict[str, int]:
    """POST requests answered 200 so far, by route template, from the service's own metrics."""
    counts: dict[str, int] = {}
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith("jobq_http_request_duration_seconds_count{") and 'method="POST"' in line:
            labels, value = line.rsplit(" ", 1)
            if 'status="200"' in labels:
                route = labels.split('route="', 1)[1].split('"', 1)[0]
                counts[route] = counts.get(route, 0) + int(float(value))
    return counts


def test_a_raising_handler_is_retried_then_failed(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(backoff_base_seconds=0.01, backoff_cap_seconds=0.05, poll_interval_seconds=0.05)
    calls: list[int] = []
    worker = Worker(server.url, concurrency=2, wait_seconds=1)

    @worker.handler("q")
    def boom(job: JobContext) -> None:
        calls.append(job.attempts)
        raise ValueError(f"boom on attempt {job.attempts}")

    with Client(server.url) as jobq:
        job = jobq.enqueue("q", "doomed", max_attempts=3)
        with running(worker):
            wait_until(lambda: jobq.get_job(job.id).status == "failed", what="the job failing for good")
        final = jobq.get_job(job.id)
    assert calls == [1, 2, 3]
    assert (final.attempts, final.last_error) == (3, "ValueError: boom on attempt 3")


def test_a_handler_chooses_retry_delay_or_no_retry(server: LiveServer, db: psycopg.Connection) -> None:
    worker = Worker(server.url, wait_seconds=1)

    @worker.handler("q")
    async def decide(job: JobContext) -> None:
        if job.payload == "later":
            raise RetryLater("upstream busy", retry_in=3600)
        raise PermanentFailure("bad input")

    with Client(server.url) as jobq:
        later = jobq.enqueue("q", "later")
        never = jobq.enqueue("q", "never", max_attempts=5)
        with running(worker):
            wait_until(lambda: jobq.get_job(never.id).status == "failed", what="the permanent failure")
            wait_until(lambda: jobq.get_job(later.id).last_error is not None, what="the retry request")
    row = db.execute(
        "SELECT status, last_error, run_at > now() + interval '59 minutes' FROM jobq.jobs WHERE id = %s", (later.id,)
    )
    assert row.fetchone() == ("pending", "RetryLater: upstream busy", True)
    assert db.execute("SELECT attempts, last_error FROM jobq.jobs WHERE id = %s", (never.id,)).fetchone() == (
        1,
        "PermanentFailure: bad input",
    )


def test_heartbeats_keep_a_handler_slower_than_its_lease(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    # The sweeper runs every 0.1 s, so a lease left to lapse would be taken back at once.
    server: LiveServer = server_factory(sweep_interval_seconds=0.1)
    release = threading.Event()
    calls: list[int] = []
    # A lease of 6 s, renewed every 2 s: a starved machine may miss a heartbeat or two and still hold it.
    worker = Worker(server.url, concurrency=2, lease_seconds=6, wait_seconds=1)

    @worker.handler("q")
    def slow(job: JobContext) -> str:
        calls.append(job.id)
        release.wait(60)
        return "made it"

    with Client(server.url) as jobq:
        job = jobq.enqueue("q", "slow")
        with running(worker):
            # Held past two 6 s leases, renewed by heartbeats only.
            wait_until(
                lambda: (
                    db.execute(
                        "SELECT lease_expires_at > claimed_at + interval '13 seconds' FROM jobq.jobs WHERE id = %s",
                        (job.id,),
                    ).fetchone()
                    == (True,)
                ),
                timeout=60,
                what="the lease renewed past two lease lengths",
            )
            release.set()
            wait_until(lambda: jobq.get_job(job.id).status == "completed", what="completion")
        final = jobq.get_job(job.id)
    assert (final.attempts, final.result, calls) == (1, "made it", [job.id])


def test_a_handler_reports_progress_that_the_job_shows_while_it_runs(server: LiveServer) -> None:
    # The lease (600 s) would put the next heartbeat 200 s away: the progress is sent early, on its own.
    release = threading.Event()
    worker = Worker(server.url, concurrency=1, lease_seconds=600, wait_seconds=1)

    @worker.handler("q")
    def counting(job: JobContext) -> str:
        for done in range(1, 4):
            job.progress({"done": done, "total": 3})  # only the latest value needs to reach the server
        release.wait(60)
        return "counted"

    with Client(server.url) as jobq:
        job = jobq.enqueue("q", "count")
        with running(worker):
            wait_until(lambda: jobq.get_job(job.id).progress == {"done": 3, "total": 3}, what="the progress shown")
            assert jobq.get_job(job.id).status == "running"
            release.set()
            wait_until(lambda: jobq.get_job(job.id).status == "completed", what="completion")
        assert jobq.get_job(job.id).result == "counted"


def test_heartbeat_call_sends_progress_and_null_clears_it(server: LiveServer) -> None:
    with Client(server.url) as jobq:
        job = jobq.enqueue("q", "x")
        [claim] = jobq.claim("q", "w")
        jobq.heartbeat(claim.id, claim.claim_token, progress="half way")
        assert jobq.get_job(job.id).progress == "half way"
        jobq.heartbeat(claim.id, claim.claim_token)  # left out: unchanged
        assert jobq.get_job(job.id).progress == "half way"
        jobq.heartbeat(claim.id, claim.claim_token, progress=None)
        assert jobq.get_job(job.id).progress is None


def test_a_lost_claim_stops_the_handler_and_nothing_is_sent(server: LiveServer, db: psycopg.Connection, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, "jobq_client")
    started, stopped = threading.Event(), threading.Event()
    worker = Worker(server.url, concurrency=1, lease_seconds=30, heartbeat_interval=0.2, wait_seconds=1)

    @worker.handler("q")
    async def patient(job: JobContext) -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "never"

    job = server.enqueue(payload="contested")
    with running(worker):
        assert started.wait(30)
        # The lease is taken away (as if it had lapsed) and another worker claims the job: in one statement, as
        # the rescue and that claim would leave it. (Rescued through the API, the job was pending for a moment,
        # and this worker's own next claim, its slot freed by the refused heartbeat, could take it back first:
        # the thief then found nothing, one run in four on a loaded machine.)
        db.execute(
            "UPDATE jobq.jobs SET claim_token = %s || substr(claim_token, 44), locked_by = 'thief'"
            " WHERE queue_name = 'q' AND id = %s",
            ("t" * 43, job["id"]),
        )
        assert stopped.wait(30), "the handler was not stopped"
        wait_until(lambda: "heartbeat refused" in caplog.text, what="the worker noticing")
    row = db.execute(
        "SELECT status, locked_by, left(claim_token, 43) FROM jobq.jobs WHERE id = %s", (job["id"],)
    ).fetchone()
    assert row == ("running", "thief", "t" * 43)


@pytest.mark.skipif(
    not has_route("/jobs/{job_id}/cancel"), reason="POST /jobs/{job_id}/cancel is not on this server yet"
)
def test_a_cancelled_job_stops_its_handler(server: LiveServer, db: psycopg.Connection) -> None:
    started, stopped = threading.Event(), threading.Event()
    worker = Worker(server.url, concurrency=1, heartbeat_interval=0.2, wait_seconds=1)

    @worker.handler("q")
    async def patient(job: JobContext) -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "never"

    job = server.enqueue(payload="to cancel")
    with running(worker):
        assert started.wait(30)
        assert server.client.post(f"/jobs/{job['id']}/cancel").status_code == 200
        assert stopped.wait(30), "the handler was not stopped"
    assert server.job(job["id"])["status"] != "completed"


@pytest.mark.skipif(
    not has_route("/jobs/{job_id}/cancel"), reason="POST /jobs/{job_id}/cancel is not on this server yet"
)
@pytest.mark.parametrize("handler_kind", ["sync", "async"])
def test_a_cancelled_jobs_handler_sees_stopped_and_its_sleep_wakes(server: LiveServer, handler_kind: str) -> None:
    """A sync handler cannot be interrupted: it looks at `stopped` or sleeps with `sleep()`, which returns True as
    soon as the job is stopped. An async handler is cancelled at once, and may read `stopped` on its way out (and
    call `sleep()`, though it blocks its loop: the event behind it is made on first use there, after the stop)."""
    started, seen = threading.Event(), []
    worker = Worker(server.url, concurrency=1, heartbeat_interval=0.2, wait_seconds=1)

    def loop_until_stopped(job: JobContext) -> None:
        started.set()
        woken = job.sleep(3600)  # returns True when the stop comes, not an hour later
        seen.append((job.stopped, job.stop_reason, woken))

    if handler_kind == "sync":
        worker.register("q", loop_until_stopped)
    else:

        @worker.handler("q")
        async def polite(job: JobContext) -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen.append((job.stopped, job.stop_reason, job.sleep(0)))  # the event made now, set already
                raise

    job = server.enqueue(payload="to cancel")
    with running(worker):
        assert started.wait(30)
        assert server.client.post(f"/jobs/{job['id']}/cancel").status_code == 200
        wait_until(lambda: seen, what="the handler to see the stop")
    assert seen == [(True, "cancel requested", True)]
    assert server.job(job["id"])["status"] != "completed"  # whatever the handler returned after the stop


def test_one_worker_serves_several_queues(server: LiveServer) -> None:
    worker = Worker(server.url, concurrency=2, wait_seconds=1)
    worker.register("emails", lambda job: f"sent {job.payload}")

    @worker.handler("reports", concurrency=1)
    async def report(job: JobContext) -> str:
        return f"built {job.payload}"

    with Client(server.url) as jobq:
        mail = jobq.enqueue("emails", "ada")
        daily = jobq.enqueue("reports", "daily")
        other = jobq.enqueue("elsewhere", "untouched")
        with running(worker):
            wait_until(lambda: jobq.get_job(daily.id).status == jobq.get_job(mail.id).status == "completed")
        assert (jobq.get_job(mail.id).result, jobq.get_job(daily.id).result) == ("sent ada", "built daily")
        assert jobq.get_job(other.id).status == "pending"


def test_a_claim_the_server_refuses_stops_the_worker(server: LiveServer) -> None:
    worker = Worker(server.url, lease_seconds=10**6)  # more than JOBQ_LEASE_MAX_SECONDS: 422
    worker.register("q", lambda job: None)
    with pytest.raises(ValidationError):
        worker.run()


# --- a worker process and real signals ----------------------------------------------------------------------


def lines(log: Path) -> list[str]:
    return whole_lines(log)


def spawn_worker(server: LiveServer, log: Path, *args: str) -> subprocess.Popen[bytes]:
    script = ROOT / "tests" / "sdk_worker_main.py"
    return subprocess.Popen(
        [sys.executable, str(script), server.url, "q", str(log), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out.decode(errors="replace")


@pytest.mark.slow
def test_sigterm_mid_batch_loses_nothing(server: LiveServer, db: psycopg.Connection, tmp_path: Path) -> None:
    with Client(server.url) as jobq:
        ids = {j.id for j in jobq.enqueue_batch("q", [NewJob(payload=n) for n in range(60)])}
    log = tmp_path / "first.log"
    proc = spawn_worker(server, log, "--work", "0.3", "--concurrency", "4")
    try:

        def mid_batch() -> bool:
            seen = lines(log)
            begun = sum(x.startswith("start") for x in seen)
            return sum(x.startswith("done") for x in seen) >= 8 and begun > sum(x.startswith("done") for x in seen)

        wait_until(mid_batch, timeout=60, what="jobs done and jobs in flight")
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, out
    first = lines(log)
    assert first[-1] == "exit", out
    begun = {int(x.split()[1]) for x in first if x.startswith("start")}
    done = {int(x.split()[1]) for x in first if x.startswith("done")}
    assert begun == done, "a job in flight at SIGTERM was not finished"
    by_status = dict(db.execute("SELECT status, array_agg(id) FROM jobq.jobs GROUP BY status").fetchall())
    assert set(by_status["completed"]) == done
    assert by_status.get("pending"), "the worker went on claiming after SIGTERM"
    # A claim answered just as the worker hung up stays running until its lease lapses (nothing ran it);
    # the sweeper then hands it out again. Sweep now, as if the leases had lapsed.
    assert not set(by_status.get("running", [])) & begun
    server.run(lambda: server.services.maintenance["rescuer"].run_once(now=FAR_FUTURE))

    second_log = tmp_path / "second.log"
    proc = spawn_worker(server, second_log, "--work", "0", "--concurrency", "8")
    try:
        wait_until(lambda: statuses(db).get("completed") == len(ids), timeout=60, what="the rest completed")
        proc.send_signal(signal.SIGINT)
        code, out = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, out
    runs = collections.Counter(int(x.split()[1]) for x in first + lines(second_log) if x.startswith("done"))
    assert set(runs) == ids and set(runs.values()) == {1}, "every job ran to completion exactly once"


def test_a_job_still_running_after_the_grace_is_handed_back(server: LiveServer, tmp_path: Path) -> None:
    job = server.enqueue(payload="stuck", max_attempts=1)  # its only attempt: a fail would end it failed
    log = tmp_path / "w.log"
    proc = spawn_worker(server, log, "--block", "--grace", "0.5", "--concurrency", "1")
    try:
        wait_until(lambda: f"start {job['id']}" in lines(log), what="the handler starting")
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, out
    after = server.job(job["id"])
    # Released, not failed: the attempt is given back and no error is recorded.
    assert (after["status"], after["attempts"], after["last_error"]) == ("pending", 0, None)


@pytest.mark.parametrize("server_has_release", [True, False])
def test_stopping_now_hands_a_running_job_back(server: LiveServer, server_has_release: bool) -> None:
    """`stop(now=True)` hands back a job whose handler is still running: with `release`, so the attempt is
    given back; against a server older than the release call (no such route: a plain 404), with a fail
    that asks for an immediate retry, which costs the attempt but loses nothing."""
    if not server_has_release:
        api = server.app.api
        api.router.routes = [r for r in api.router.routes if getattr(r, "operation_id", None) != "releaseJob"]
    started, let_go = threading.Event(), threading.Event()
    worker = Worker(server.url, concurrency=1, wait_seconds=1)

    @worker.handler("q")
    def stuck(job: JobContext) -> str:
        started.set()
        let_go.wait(60)
        return "never sent"

    with Client(server.url) as jobq:
        job = jobq.enqueue("q", "stuck", max_attempts=3)
        try:
            with running(worker):
                assert started.wait(60), "the handler never started"
                worker.stop(now=True)
                wait_until(lambda: jobq.get_job(job.id).status == "pending", what="the job handed back")
        finally:
            let_go.set()
        back = jobq.get_job(job.id)
    assert back.status == "pending"  # and not claimed again: stopping now also stops claiming
    if server_has_release:
        assert (back.attempts, back.last_error, back.result) == (0, None, None)
    else:
        assert back.attempts == 1 and back.last_error is not None and "handed back" in back.last_error
        assert back.result is None


# --- a handler's outcome that cannot be sent as it is ---------------------------------------------------------


def test_a_sync_handler_raising_stop_iteration_fails_the_job(server: LiveServer) -> None:
    """StopIteration cannot be set on an asyncio future; the job must still be failed, not left running."""
    worker = Worker(server.url, concurrency=1, wait_seconds=1)

    @worker.handler("q")
    def exhausted(job: JobContext) -> Any:
        return next(iter([]))

    with Client(server.url) as jobq:
        job = jobq.enqueue("q", "x", max_attempts=1)
        with running(worker):
            wait_until(lambda: jobq.get_job(job.id).status == "failed", what="the job failing")
        last_error = jobq.get_job(job.id).last_error
    assert last_error is not None and "StopIteration" in last_error


def test_an_async_handler_raising_system_exit_fails_only_its_job(server: LiveServer) -> None:
    """As for a sync handler: the job fails, and the worker (its other jobs too) goes on."""
    worker = Worker(server.url, concurrency=1, wait_seconds=1)

    @worker.handler("q")
    async def leaving(job: JobContext) -> str:
        if job.payload == "exit":
            raise SystemExit(3)
        return "fine"

    with Client(server.url) as jobq:
        job = jobq.enqueue("q", "exit", max_attempts=1)
        later = jobq.enqueue("q", "after")
        with running(worker):
            wait_until(lambda: jobq.get_job(job.id).status == "failed", what="the job failing")
            wait_until(lambda: jobq.get_job(later.id).status == "completed", what="the next job")
        assert jobq.get_job(job.id).last_error == "SystemExit: 3"


@pytest.mark.parametrize("kind", ["too large", "not storable", "not encodable", "too deep"])
def test_a_result_the_server_cannot_take_fails_the_job(server_factory, kind: str) -> None:  # type: ignore[no-untyped-def]
    """A complete refused for its result (413/422/500, or a string with a lone surrogate that cannot even be
    encoded) is not going to succeed on a retry: the attempt is failed, not left running until its lease."""
    server: LiveServer = server_factory(max_result_bytes=1024)
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    results = {"too large": "x" * 4096, "not storable": {"nul": "a\x00b"}, "not encodable": "\ud800", "too deep": deep}
    worker = Worker(server.url, concurrency=1, wait_seconds=1, lease_seconds=3600)
    worker.register("q", lambda job: results[kind])
    with Client(server.url) as jobq:
        job = jobq.enqueue("q", kind, max_attempts=1)
        with running(worker):
            # One read per poll: two reads could see "pending" and then "running, attempt 1" and stop too early.
            finished = ("completed", "failed", "cancelled")
            wait_until(lambda: jobq.get_job(job.id).status in finished, what="the attempt ending")
        final = jobq.get_job(job.id)
    assert final.status == "failed" and final.result is None
    assert final.last_error is not None and "result" in final.last_error


def test_an_error_message_that_cannot_be_encoded_still_fails_the_job(server: LiveServer) -> None:
    worker = Worker(server.url, concurrency=1, wait_seconds=1)

    @worker.handler("q")
    def garbled(job: JobContext) -> None:
        raise ValueError("bad byte \udcff from a filename")

    with Client(server.url) as jobq:
        job = jobq.enqueue("q", "x", max_attempts=1)
        with running(worker):
            wait_until(lambda: jobq.get_job(job.id).status == "failed", what="the job failing")
        assert jobq.get_job(job.id).last_error == "ValueError: bad byte \\udcff from a filename"


@pytest.mark.parametrize(
    "retry_in", [-1, float("nan"), 10**12, "soon"], ids=["negative", "nan", "too far", "not seconds"]
)
def test_a_retry_later_with_a_bad_delay_still_fails_the_attempt(server: LiveServer, retry_in: Any) -> None:
    """A `retry_in` the server refuses, or that is not a number at all, must not leave the job running until
    its lease: the attempt is failed with the server's backoff instead."""
    worker = Worker(server.url, concurrency=1, wait_seconds=1, lease_seconds=3600)

    @worker.handler("q")
    def later(job: JobContext) -> None:
        raise RetryLater("upstream busy", retry_in=retry_in)

    with Client(server.url) as jobq:
        job = jobq.enqueue("q", "x", max_attempts=1)
        with running(worker):
            wait_until(lambda: jobq.get_job(job.id).status == "failed", what="the attempt failing")
        assert jobq.get_job(job.id).last_error == "RetryLater: upstream busy"


def test_a_server_with_a_lower_claim_limit_is_claimed_from_in_smaller_batches(server_factory) -> None:  # type: ignore[no-untyped-def]
    """JOBQ_MAX_CLAIM_LIMIT below the worker's free slots: the claim's 422 is about `limit` only, so the worker
    asks for fewer jobs at a time instead of stopping."""
    server: LiveServer = server_factory(max_claim_limit=2)
    worker = Worker(server.url, concurrency=5, wait_seconds=1)
    worker.register("q", lambda job: job.payload)
    with Client(server.url) as jobq:
        jobs = jobq.enqueue_batch("q", [NewJob(payload=i) for i in range(6)])
        with running(worker):
            wait_until(lambda: all(jobq.get_job(j.id).status == "completed" for j in jobs), what="every job done")
