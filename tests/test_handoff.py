"""The direct hand-off (app/core/dispatcher.py take_parked / handed_off, app/db/claim.py
jobs_insert_handing_off): an enqueue in a process where a claim is parked on the job's queue claims for it in
the enqueue's own transaction. What a user relies on: the waiter gets its job, in claim order (an older ready
job first), with a token that completes it; a paused queue or one with limits hands nothing off; a waiter
that went away has its job back in the queue; a claim that fails never fails the enqueue nor loses or
doubles the job. Every claim here waits long and the fallback poll is a minute away, so only the enqueue can
have answered it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest

from app.db import claim as store_claim
from tests.citus import plain_only
from tests.support import LiveServer, settle_long_poll, wait_until
from tests.test_waiting import _join_threads, long_poll  # noqa: F401 (the fixture joins long_poll's threads)


@pytest.fixture
def quiet(server_factory: Any) -> LiveServer:
    """A server whose fallback poll does not run within a test: a parked claim is answered by a wake-up."""
    server: LiveServer = server_factory(poll_interval_seconds=60)
    return server


def parked(server: LiveServer, queue: str, n: int = 1) -> list[Callable[[], httpx.Response]]:
    polls = []
    for _ in range(n):
        polls.append(long_poll(server, None, queue, wait=30))
        wait_until(lambda: server.services.dispatcher.parked == len(polls), what="the long-poll parked")
    settle_long_poll(server, queue)
    return polls


def job_row(db: psycopg.Connection, job_id: int) -> tuple[Any, ...]:
    row = db.execute("SELECT status, attempts, claim_token FROM jobq.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row


def test_an_enqueue_hands_its_job_to_the_parked_claim(quiet: LiveServer, db: psycopg.Connection) -> None:
    (poll,) = parked(quiet, "h")
    job = quiet.enqueue("h", payload={"n": 1})
    answer = poll()
    assert answer.status_code == 200, answer.text
    (got,) = answer.json()["jobs"]
    assert got["id"] == job["id"] and got["payload"] == {"n": 1} and got["attempts"] == 1
    assert quiet.services.dispatcher.handed == 1  # by the enqueue's transaction, not by the line
    assert job_row(db, job["id"]) == ("running", 1, got["claim_token"])
    r = quiet.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": got["claim_token"], "result": 7})
    assert r.status_code == 200, r.text
    stats = quiet.client.get("/queues/h/stats").json()
    counts = stats["counts"]
    assert (counts["pending"], counts["running"], counts["completed"]) == (0, 0, 1)


def test_claim_order_holds_an_older_ready_job_goes_first(
    quiet: LiveServer, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that became ready while the claim was parked, with no wake-up (here: made due in SQL), is older
    than the one enqueued: the hand-off gives the waiter the older one and leaves the new one pending."""
    # Enqueued before the claim parks: an enqueue wakes the claims waiting on its queue even for a job due later,
    # and that statement, run after the UPDATE below, would take the job before the hand-off could.
    older = quiet.enqueue("o", payload="older", delay_seconds=3600)
    (poll,) = parked(quiet, "o")
    # Nor may the presence renewal's look (every 2 s) find it first.
    monkeypatch.setattr(quiet.services.dispatcher, "look", lambda queues=None: None)
    db.execute("UPDATE jobq.jobs SET run_at = now() - interval '1 minute' WHERE id = %s", (older["id"],))
    newer = quiet.enqueue("o", payload="newer")
    (got,) = poll().json()["jobs"]
    assert got["id"] == older["id"]
    assert job_row(db, newer["id"])[0] == "pending"
    assert quiet.services.dispatcher.handed == 1


def test_two_waiters_a_batch_of_three(quiet: LiveServer, db: psycopg.Connection) -> None:
    polls = parked(quiet, "b", n=2)
    r = quiet.client.post("/queues/b/jobs/batch", json={"jobs": [{"payload": i} for i in range(3)]})
    assert r.status_code in (200, 201), r.text
    got = sorted(j["payload"] for p in polls for j in p().json()["jobs"])
    assert got == [0, 1]  # the oldest request the best job, one each
    assert quiet.services.dispatcher.handed == 2
    statuses = sorted(s for (s,) in db.execute("SELECT status FROM jobq.jobs WHERE queue_name = 'b'").fetchall())
    assert statuses == ["pending", "running", "running"]


def test_one_job_takes_one_waiter_out_of_the_line(quiet: LiveServer) -> None:
    """Three claims parked, one job: the oldest claim gets it; the other two stay parked, and the next jobs
    reach them."""
    polls = parked(quiet, "one", n=3)
    first = quiet.enqueue("one", payload="first")
    assert polls[0]().json()["jobs"][0]["id"] == first["id"]
    assert quiet.services.dispatcher.parked == 2
    quiet.enqueue("one", payload="second")
    quiet.enqueue("one", payload="third")
    assert sorted(p().json()["jobs"][0]["payload"] for p in polls[1:]) == ["second", "third"]
    assert quiet.services.dispatcher.handed == 3


def test_a_paused_queue_hands_nothing_off(quiet: LiveServer, db: psycopg.Connection) -> None:
    assert quiet.client.post("/queues/p/pause").status_code in (200, 204)
    (poll,) = parked(quiet, "p")
    job = quiet.enqueue("p", payload=1)
    assert job_row(db, job["id"])[0] == "pending"
    assert quiet.services.dispatcher.parked == 1  # still waiting, back in its line
    assert quiet.client.post("/queues/p/resume").status_code in (200, 204)
    (got,) = poll().json()["jobs"]
    assert got["id"] == job["id"]
    assert quiet.services.dispatcher.handed == 0  # claimed by the line, woken by the resume


def test_a_queue_with_limits_is_left_to_its_line(quiet: LiveServer, db: psycopg.Connection) -> None:
    r = quiet.client.patch("/queues/l/config", json={"concurrency": 1})
    assert r.status_code == 200, r.text
    (poll,) = parked(quiet, "l")
    job = quiet.enqueue("l", payload=1)
    (got,) = poll().json()["jobs"]
    assert got["id"] == job["id"]
    assert quiet.services.dispatcher.handed == 0


def test_a_delayed_job_is_not_handed_off(quiet: LiveServer, db: psycopg.Connection) -> None:
    (poll,) = parked(quiet, "d")
    job = quiet.enqueue("d", payload=1, delay_seconds=3600)
    assert job_row(db, job["id"])[0] == "pending"
    assert quiet.services.dispatcher.handed == 0
    assert quiet.services.dispatcher.parked == 1
    db.execute("UPDATE jobq.jobs SET run_at = now() WHERE id = %s", (job["id"],))
    quiet.loop.call_soon_threadsafe(quiet.services.dispatcher.wake, ["d"])  # as the fallback poll would
    assert poll().json()["jobs"][0]["id"] == job["id"]


def test_a_waiter_gone_meanwhile_has_its_job_released(
    quiet: LiveServer, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter is answered (its deadline, say) after the enqueue took it and before the commit: the job
    claimed for it goes back to pending at once, its attempt given back, and the next claim gets it."""
    dispatcher = quiet.services.dispatcher
    take = dispatcher.take_parked

    def take_then_leave(queue: str, jobs: int) -> Any:
        handoff = take(queue, jobs)
        if handoff is not None:
            for t in handoff.tickets:
                t.future.set_result([])
        return handoff

    monkeypatch.setattr(dispatcher, "take_parked", take_then_leave)
    (poll,) = parked(quiet, "g")
    job = quiet.enqueue("g", payload=1)
    assert poll().json()["jobs"] == []
    wait_until(lambda: job_row(db, job["id"])[:2] == ("pending", 0), what="the undelivered claim released")
    got = quiet.claim_one("g")
    assert got["id"] == job["id"] and got["attempts"] == 1


def test_a_failing_claim_never_fails_the_enqueue(
    quiet: LiveServer, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hand-off's claim statement fails (here: cancelled by the server): the transaction is rolled back,
    the job inserted alone (once), and the parked claim gets it from its line."""
    claim = store_claim.jobs_claim
    failed: list[str] = []

    async def fail_once(conn: Any, queue: str, slots: Any) -> Any:
        if not failed:
            failed.append(queue)
            await conn.execute("SET LOCAL statement_timeout = 1")
            await conn.execute("SELECT pg_sleep(1)")
        return await claim(conn, queue, slots)

    (poll,) = parked(quiet, "f")
    monkeypatch.setattr(store_claim, "jobs_claim", fail_once)
    job = quiet.enqueue("f", payload=1)
    (got,) = poll().json()["jobs"]
    assert failed == ["f"] and got["id"] == job["id"]
    assert quiet.services.dispatcher.handed == 0
    (n,) = db.execute("SELECT count(*) FROM jobq.jobs WHERE queue_name = 'f'").fetchone() or (0,)
    assert n == 1


def test_a_wake_up_during_a_hand_off_that_gave_nothing_is_not_lost(
    quiet: LiveServer, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retried enqueue (its idempotency key names a running job) takes the parked claim out of its line and
    its claim finds nothing; meanwhile another enqueue commits a job and wakes the queue, whose line is empty at
    that moment. The claim, back in its line, must still get that job: not from the presence renewal's look
    (switched off here), from a claim of its line."""
    a = quiet.enqueue("w", payload="a", idempotency_key="k")
    assert quiet.claim_one("w")["id"] == a["id"]
    (poll,) = parked(quiet, "w")
    monkeypatch.setattr(quiet.services.dispatcher, "look", lambda queues=None: None)
    claim = store_claim.jobs_claim
    other: list[dict[str, Any]] = []

    async def claim_then_another_enqueue(conn: Any, queue: str, slots: Any) -> Any:
        result = await claim(conn, queue, slots)
        if not other:

            def post() -> httpx.Response:
                with httpx.Client(base_url=quiet.url, timeout=30) as c:
                    return c.post("/queues/w/jobs", json={"payload": "b"})

            other.append((await asyncio.to_thread(post)).json())
        return result

    monkeypatch.setattr(store_claim, "jobs_claim", claim_then_another_enqueue)
    again = quiet.client.post("/queues/w/jobs", json={"payload": "a", "idempotency_key": "k"})
    assert again.status_code == 200 and again.json()["id"] == a["id"], again.text
    (got,) = poll().json()["jobs"]
    assert got["id"] == other[0]["id"]


@plain_only("Citus refuses triggers on distributed tables, the fault this test injects")
def test_a_commit_that_fails_after_the_claim_leaves_no_job_held_and_the_waiter_parked(
    quiet: LiveServer, db: psycopg.Connection
) -> None:
    """The transaction fails at COMMIT, after its claim was made (here a deferred constraint trigger refuses the
    job: the way a commit can fail, or be lost with the connection, once the statements succeeded). The enqueue
    fails, nothing is left behind (the claims the dispatcher releases by token: a no-op when nothing committed),
    and the parked claim, back in its line, gets the next job."""
    db.execute(
        """
        CREATE FUNCTION jobq.refuse_boom() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
        CREATE CONSTRAINT TRIGGER refuse_boom AFTER INSERT ON jobq.jobs DEFERRABLE INITIALLY DEFERRED
          FOR EACH ROW WHEN (NEW.payload = '"boom"'::jsonb) EXECUTE FUNCTION jobq.refuse_boom();
        """
    )
    (poll,) = parked(quiet, "c")
    r = quiet.client.post("/queues/c/jobs", json={"payload": "boom"})
    assert r.status_code >= 500, r.text
    assert db.execute("SELECT count(*) FROM jobq.jobs WHERE queue_name = 'c'").fetchone() == (0,)
    assert quiet.services.dispatcher.parked == 1
    job = quiet.enqueue("c", payload="fine")
    (got,) = poll().json()["jobs"]
    assert got["id"] == job["id"]


# --- a queue known to have no job ready (app/core/dispatcher.py KNOWN_EMPTY_SECONDS) -----------------------------


def count_claim_statements(monkeypatch: pytest.MonkeyPatch, queue: str) -> list[int]:
    """How many claim statements (JOB_CLAIM, by the line or by a hand-off) ran on `queue` from now on."""
    seen = [0]
    real = store_claim.jobs_claim

    async def counted(conn: Any, name: str, slots: Any) -> store_claim.ClaimResult:
        if name == queue:
            seen[0] += 1
        return await real(conn, name, slots)

    monkeypatch.setattr(store_claim, "jobs_claim", counted)
    return seen


def test_a_claim_arriving_while_others_wait_on_an_empty_queue_waits_with_them_without_a_statement(
    quiet: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers that come back for more while the queue is empty and others already wait on it cost no claim
    statement each: the queue's last statement found nothing and nothing has woken it since. They wait with
    the others and are served by the same enqueues. (The window is widened here so that the machine's speed
    does not decide whether the second claim falls in it.)"""
    from app.core import dispatcher as dispatcher_module

    monkeypatch.setattr(dispatcher_module, "KNOWN_EMPTY_SECONDS", 60.0)
    statements = count_claim_statements(monkeypatch, "known")
    first = parked(quiet, "known")
    assert statements[0] == 1  # the first claim looked, found nothing, and waits
    others = [long_poll(quiet, None, "known", wait=30) for _ in range(2)]
    wait_until(lambda: quiet.services.dispatcher.parked == 3, what="three claims waiting")
    assert statements[0] == 1  # the two that came after it looked for nothing
    jobs = [quiet.enqueue("known", payload=i)["id"] for i in range(3)]
    got = sorted(j["id"] for answer in (*first, *others) for j in answer().json()["jobs"])
    assert got == sorted(jobs)  # each waiter served, each job once


def test_past_the_window_a_new_claim_looks_for_itself(
    quiet: LiveServer, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some jobs become ready with no wake-up (here: a delayed job made due in SQL, as a due time passing
    does). A claim already waiting learns of it from the fallback poll (a minute away here; the presence
    renewal's look is switched off); a claim arriving once the queue's window has passed looks for itself, and
    the job goes out at once (to the claim that has waited longest, as claims are served in order)."""
    # Enqueued before the first claim waits: an enqueue wakes the queue's claims even for a job due later, and
    # that statement would open the window again.
    job = quiet.enqueue("window", payload="due", delay_seconds=3600)
    (first,) = parked(quiet, "window")
    monkeypatch.setattr(quiet.services.dispatcher, "look", lambda queues=None: None)
    line = quiet.services.dispatcher._queues["window"]

    async def window_passed() -> bool:
        return asyncio.get_running_loop().time() > line.empty_until

    wait_until(lambda: quiet.run(window_passed), what="the queue's known-empty window passed")
    statements = count_claim_statements(monkeypatch, "window")
    db.execute("UPDATE jobq.jobs SET run_at = now() - interval '1 minute' WHERE id = %s", (job["id"],))
    second = long_poll(quiet, None, "window", wait=30)
    assert [j["id"] for j in first().json()["jobs"]] == [job["id"]]
    assert statements[0] == 1  # the second claim's own look, which served the first
    later = quiet.enqueue("window", payload="for the second")
    assert [j["id"] for j in second().json()["jobs"]] == [later["id"]]
