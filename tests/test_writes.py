"""The worker's writes (app/db/writes.py) routed by the queue their claim token names, on jobs made here by SQL
(not by enqueue and claim), so that these run the same on plain PostgreSQL and on Citus
(JOBQ_TEST_CITUS_URL). Their plans on Citus: tests/test_citus_plans.py."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, TypeVar

import psycopg
import pytest

from app.db import tokens
from app.db import writes as w

T = TypeVar("T")


def run(url: str, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
    async def go() -> T:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            return await work(conn)

    return asyncio.run(go())


def running(db: psycopg.Connection, queue: str, named: bool = True, lease: int = 60) -> tuple[int, str]:
    """A job of `queue` held by a claim, as the claim leaves it: (id, token). `named`: the token names the queue
    (else a token from before 1.2.0, the random part alone)."""
    token = secrets.token_urlsafe(32) + (tokens.queue_suffix(queue) if named else "")
    row = db.execute(
        """INSERT INTO jobq.jobs (queue_name, payload, status, attempts, claimed_at, lease_seconds,
                                  lease_expires_at, locked_by, claim_token)
           VALUES (%s, '{"n": 1}', 'running', 1, now(), %s, now() + make_interval(secs => %s), 'w', %s)
           RETURNING id""",
        (queue, lease, lease, token),
    ).fetchone()
    assert row is not None
    return int(row[0]), token


def job(db: psycopg.Connection, job_id: int) -> dict[str, Any]:
    cur = db.execute("SELECT * FROM jobq.jobs WHERE id = %s", (job_id,))
    found = cur.fetchone()
    assert found is not None
    return dict(zip([d.name for d in cur.description or []], found, strict=True))


def completed(db: psycopg.Connection, queue: str) -> int:
    row = db.execute(
        "SELECT coalesce(sum(n), 0) FROM jobq.queue_counts WHERE queue_name = %s AND status = 'completed'", (queue,)
    ).fetchone()
    return int(row[0]) if row else 0


def since_now(db: psycopg.Connection, value: Any) -> timedelta:
    row = db.execute("SELECT %s::timestamptz - now()", (value,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("named", [True, False], ids=["token naming its queue", "token from before 1.2.0"])
def test_each_write_is_served_by_the_queue_its_token_routes_to(
    db: psycopg.Connection, database_url: str, named: bool
) -> None:
    beat_id, beat_token = running(db, "mail", named)
    done_id, done_token = running(db, "mail", named)
    fail_id, fail_token = running(db, "mail", named)
    give_id, give_token = running(db, "mail", named)

    # A heartbeat: the lease asked for, else the claim's; progress kept.
    renewed = run(database_url, lambda c: w.jobs_heartbeat(c, [w.Heartbeat(beat_id, beat_token, 600, None, "7", True)]))
    assert [(r.outcome, r.worker, r.queue) for r in renewed] == [("ok", "w", "mail")]
    held = job(db, beat_id)
    assert held["lease_expires_at"] == renewed[0].lease_expires_at and held["progress"] == 7
    assert timedelta(seconds=590) < since_now(db, held["lease_expires_at"]) <= timedelta(seconds=600)
    [bare] = run(database_url, lambda c: w.jobs_heartbeat(c, [w.Heartbeat(beat_id, beat_token, None)]))
    assert bare.outcome == "ok" and job(db, beat_id)["progress"] == 7
    assert timedelta(seconds=590) < since_now(db, bare.lease_expires_at) <= timedelta(seconds=600)

    # A complete: the row, and the queue's count of completed jobs, in the same statement.
    [done] = run(database_url, lambda c: w.jobs_complete(c, [w.Completion(done_id, done_token, '{"ok": 1}')]))
    assert (done.outcome, done.changed) == ("ok", True)
    assert done.job is not None and (done.job.status, done.job.result, done.job.queue) == (
        "completed",
        '{"ok": 1}',
        "mail",
    )
    assert job(db, done_id)["finished_at"] is not None and completed(db, "mail") == 1
    [again] = run(database_url, lambda c: w.jobs_complete(c, [w.Completion(done_id, done_token, '{"ok": 2}')]))
    assert (again.outcome, again.changed) == ("ok", False) and job(db, done_id)["result"] == {"ok": 1}

    # A fail: a retry after the queue's own backoff (between half and all of its base for a first attempt).
    db.execute("INSERT INTO jobq.queue_state (queue_name, backoff_base_seconds) VALUES ('mail', 100)")

    def fail(retry: bool) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[w.Done]]:
        return lambda c: w.job_fail(
            c, fail_id, fail_token, "boom", retry=retry, retry_in=None, backoff_base=1.0, backoff_cap=3600.0
        )

    failed = run(database_url, fail(True))
    assert failed.outcome == "ok" and failed.job is not None and failed.job.status == "pending"
    assert timedelta(seconds=49) < since_now(db, failed.job.run_at) <= timedelta(seconds=100)
    assert (job(db, fail_id)["last_error"], job(db, fail_id)["finished_at"]) == ("boom", None)
    assert run(database_url, fail(True)).outcome == "ok"  # a retried fail: ok, nothing changed
    # A release: pending again after its delay, the attempt given back.
    released = run(database_url, lambda c: w.job_release_claim(c, give_id, give_token, 30.0))
    assert released.outcome == "ok" and released.job is not None
    assert (released.job.status, released.job.attempts, released.job.claim_token) == ("pending", 0, None)
    assert timedelta(seconds=29) < since_now(db, released.job.run_at) <= timedelta(seconds=30)
    assert run(database_url, lambda c: w.job_release_claim(c, give_id, give_token, 0.0)).outcome == "claim_lost"


def test_a_token_edited_to_name_another_queue_is_a_wrong_token(db: psycopg.Connection, database_url: str) -> None:
    job_id, token = running(db, "mail")
    running(db, "other")
    before = job(db, job_id)
    for queue in ("other", "nowhere"):
        edited = token[: tokens.RANDOM_CHARS] + tokens.queue_suffix(queue)
        assert tokens.queue_of(edited) == queue

        async def writes(c: psycopg.AsyncConnection[Any], edited: str = edited) -> list[str]:
            return [
                (await w.jobs_heartbeat(c, [w.Heartbeat(job_id, edited, 600)]))[0].outcome,
                (await w.jobs_complete(c, [w.Completion(job_id, edited, None)]))[0].outcome,
                (
                    await w.job_fail(c, job_id, edited, "x", retry=True, retry_in=0, backoff_base=1, backoff_cap=1)
                ).outcome,
                (await w.job_release_claim(c, job_id, edited, 0.0)).outcome,
            ]

        assert run(database_url, writes) == ["claim_lost"] * 4
    assert job(db, job_id) == before
    # Outside the caller's queues, the job is not there, whatever the token names.
    outside = run(database_url, lambda c: w.jobs_complete(c, [w.Completion(job_id, edited, None, "^other$")]))
    assert outside[0].outcome == "not_found"
    # No such job: not found, by a token naming a queue or not.
    for missing in (token[: tokens.RANDOM_CHARS], edited):
        assert (
            run(database_url, lambda c, t=missing: w.jobs_complete(c, [w.Completion(2**40, t, None)]))[0].outcome
            == "not_found"
        )


def test_a_batch_across_queues_runs_per_queue_and_answers_in_order(db: psycopg.Connection, database_url: str) -> None:
    a1, a2 = running(db, "a"), running(db, "a", named=False)
    b1, b2 = running(db, "b"), running(db, "b", named=False)
    items = [
        w.Completion(b1[0], b1[1], "1"),
        w.Completion(a1[0], a1[1], "2"),
        w.Completion(b2[0], "stale", None),
        w.Completion(2**40, "x", None),
        w.Completion(a2[0], a2[1], "3"),
        w.Completion(b2[0], b2[1], "4"),
    ]
    done = run(database_url, lambda c: w.jobs_complete(c, items, full=False))
    assert [(d.outcome, d.job.id if d.job else None, d.changed) for d in done] == [
        ("ok", b1[0], True),
        ("ok", a1[0], True),
        ("claim_lost", b2[0], False),
        ("not_found", None, False),
        ("ok", a2[0], True),
        ("ok", b2[0], True),
    ]
    assert (completed(db, "a"), completed(db, "b")) == (2, 2)
    a3, b3 = running(db, "a"), running(db, "b", named=False)
    beats = [w.Heartbeat(b3[0], b3[1], 60), w.Heartbeat(b1[0], "stale", 60), w.Heartbeat(2**40, "x", 60)]
    beats.append(w.Heartbeat(a3[0], a3[1], 60))
    renewed = run(database_url, lambda c: w.jobs_heartbeat(c, beats))
    assert [r.outcome for r in renewed] == ["ok", "claim_lost", "not_found", "ok"]


def test_claims_handed_back_go_back_per_queue(db: psycopg.Connection, database_url: str) -> None:
    held = [(*running(db, "a"), "a"), (*running(db, "b"), "b"), (*running(db, "a", named=False), "a")]
    rows = [SimpleNamespace(id=i, claim_token=t, queue=q) for i, t, q in held]
    run(database_url, lambda c: w.jobs_release(c, rows))  # type: ignore[arg-type]
    assert [(job(db, i)["status"], job(db, i)["attempts"], job(db, i)["claim_token"]) for i, _, _ in held] == [
        ("pending", 0, None)
    ] * 3
