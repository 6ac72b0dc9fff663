"""Limits hold across processes: two real `jobq serve` processes on one database, 20 concurrent claimers
spread over both, and the database sampled every few milliseconds from outside.

Slow by nature (about 40 s together): each test drives real work through both services until the queue is
drained, and the fairness test enqueues 20,100 jobs twice. The counts are the smallest that still make each
limit bind many times over."""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.processes import ServeProcess
from tests.support import wait_until

pytestmark = pytest.mark.slow

CLAIMERS = 20


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[list[ServeProcess]]:
    env = {"JOBQ_DATABASE_URL": database_url, "JOBQ_ACCESS_LOG": "false", "JOBQ_SWEEP_INTERVAL_SECONDS": "0.2"}
    started = [ServeProcess(log=tmp_path / f"{name}.log", env=env) for name in ("a", "b")]
    try:
        yield [s.wait_ready() for s in started]
    finally:
        for s in started:
            s.close()


def configure(service: ServeProcess, queue: str, **fields: Any) -> None:
    r = service.client.patch(f"/queues/{queue}/config", json=fields)
    assert r.status_code == 200, r.text


def enqueue(service: ServeProcess, queue: str, jobs: list[dict[str, Any]]) -> None:
    """In batches of 1,000, each job with an idempotency key (unless it has one), so that a batch may be sent again:
    a kept-alive connection is one the server may close at any time (app/runtime/connections.py), and a client
    whose request meets that close gets no answer and cannot know whether it was served. CI saw it twice in this
    file (a batch post answered by a closed connection; not reproduced in 12 runs then, nor in 20 since, loaded or
    not): it sends again, once, as a client of any queue should, and the keys make that safe. The service's log is
    kept with any failure."""
    prefix = uuid.uuid4().hex[:12]
    jobs = [
        job if "idempotency_key" in job else {**job, "idempotency_key": f"{prefix}-{n}"} for n, job in enumerate(jobs)
    ]
    for at in range(0, len(jobs), 1000):
        body = {"jobs": jobs[at : at + 1000]}
        for attempt in (1, 2):
            try:
                r = service.client.post(f"/queues/{queue}/jobs/batch", json=body)
                break
            except httpx.RemoteProtocolError as exc:
                if attempt == 2:
                    raise AssertionError(
                        f"batch {at // 1000}: {exc!r} twice; the service's log:\n{service.output()[-20000:]}"
                    ) from exc
                print(f"measured: batch {at // 1000} of queue {queue}: {exc!r}; sent again")
            except httpx.HTTPError as exc:
                raise AssertionError(
                    f"batch {at // 1000}: {exc!r}; the service's log:\n{service.output()[-20000:]}"
                ) from exc
        assert r.status_code == 201, r.text


Handler = Callable[[httpx.AsyncClient, dict[str, Any]], Awaitable[None]]


def run_claimers(
    services: list[ServeProcess],
    queue: str,
    handle: Handler,
    done: Callable[[], bool],
    most: int = 3,
    wait: float = 1,
) -> int:
    """CLAIMERS workers, alternating between the services, each claiming 1 to `most` jobs with a `wait`
    long-poll and handing each job to `handle`, until `done()`. Returns the number of claims answered."""
    answered = 0

    async def worker(n: int) -> None:
        nonlocal answered
        rng = random.Random(n)
        async with httpx.AsyncClient(base_url=services[n % 2].url, timeout=60) as client:
            while not done():
                body = {"worker": f"w{n}", "limit": rng.randint(1, most), "wait_seconds": wait}
                r = await client.post(f"/queues/{queue}/claim", json=body)
                assert r.status_code == 200, r.text
                answered += 1
                for job in r.json()["jobs"]:
                    await handle(client, job)

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(worker(n) for n in range(CLAIMERS))), timeout=120)

    asyncio.run(main())
    return answered


async def complete(client: httpx.AsyncClient, job: dict[str, Any]) -> None:
    r = await client.post(f"/jobs/{job['id']}/complete", json={"claim_token": job["claim_token"]})
    assert r.status_code == 200, r.text


class Sampler:
    """Counts the queue's running jobs, in all and per group, every few milliseconds, on its own connection."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue
        self.most = self.most_in_group = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                total, in_group = conn.execute(
                    "SELECT coalesce(sum(n), 0), coalesce(max(n) FILTER (WHERE g IS NOT NULL), 0) FROM ("
                    " SELECT group_key AS g, count(*) AS n FROM jobq.jobs"
                    " WHERE queue_name = %s AND status = 'running' GROUP BY 1) r",
                    (self.queue,),
                ).fetchone()  # type: ignore[misc]
                self.most, self.most_in_group = max(self.most, total), max(self.most_in_group, in_group)
                self.samples += 1
                time.sleep(0.003)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_concurrency_and_group_concurrency_hold_across_processes(
    services: list[ServeProcess], database_url: str, db: psycopg.Connection
) -> None:
    """200 jobs in 5 groups; concurrency 4, group_concurrency 2. Workers hold each job 0-10 ms; one claim
    in ten fails its job for a retry at once. Never more than 4 running, or 2 of one group; every job
    completed exactly once, and no claim answered twice. (Checked to fail without the queue's claim lock,
    app/db/claim.py FLOW_LOCK.)"""
    a, _ = services
    configure(a, "c", concurrency=4, group_concurrency=2)
    enqueue(a, "c", [{"payload": n, "group": f"g{n % 5}"} for n in range(200)])
    tokens: set[str] = set()
    completed: list[int] = []
    rng = random.Random(7)

    async def handle(client: httpx.AsyncClient, job: dict[str, Any]) -> None:
        assert job["claim_token"] not in tokens
        tokens.add(job["claim_token"])
        await asyncio.sleep(rng.random() / 100)
        if rng.random() < 0.1:
            body = {"claim_token": job["claim_token"], "error": "again", "retry_in_seconds": 0}
            r = await client.post(f"/jobs/{job['id']}/fail", json=body)
            assert r.status_code == 200, r.text
            return
        await complete(client, job)
        completed.append(job["id"])

    # No long-poll: claimers that find no room ask again at once, so that the two services' claim
    # statements overlap all the time (with long-polls they mostly take turns, woken one by one).
    with Sampler(database_url, "c") as sampler:
        run_claimers(services, "c", handle, lambda: len(completed) >= 200, wait=0)
    assert sorted(set(completed)) == sorted(completed) and len(completed) == 200
    assert sampler.samples > 100
    assert sampler.most == 4, sampler.most  # reached, never passed
    assert sampler.most_in_group == 2, sampler.most_in_group
    # Held-back claims reach /stats with each service's statistics flush (about once a second): the last
    # second's may still be on their way.
    wait_until(lambda: a.client.get("/queues/c/stats").json()["window"]["held_back"]["concurrency"] > 0,
               what="held-back claims in the stats")  # fmt: skip


def test_rate_and_group_rate_hold_in_every_window(services: list[ServeProcess], db: psycopg.Connection) -> None:
    """36 jobs in 3 groups; at most 12 claims a second for the queue and 5 a second per group. Every window
    of one second, wherever it starts, holds at most 12 claims, and at most 5 of each group (claim times by
    the database clock)."""
    a, _ = services
    configure(a, "r", rate={"limit": 12, "per_seconds": 1}, group_rate={"limit": 5, "per_seconds": 1})
    enqueue(a, "r", [{"payload": n, "group": f"g{n % 3}"} for n in range(36)])
    completed: list[int] = []

    async def handle(client: httpx.AsyncClient, job: dict[str, Any]) -> None:
        await complete(client, job)
        completed.append(job["id"])

    run_claimers(services, "r", handle, lambda: len(completed) >= 36)
    rows = db.execute(
        "SELECT claimed_at, group_key FROM jobq.jobs WHERE queue_name = 'r' ORDER BY claimed_at"
    ).fetchall()
    assert len(rows) == 36

    def most_in_a_window(stamps: list[datetime]) -> int:
        return max(sum(1 for t in stamps if s <= t < s + timedelta(seconds=1)) for s in stamps)

    assert most_in_a_window([r[0] for r in rows]) <= 12
    for g in ("g0", "g1", "g2"):
        assert most_in_a_window([r[0] for r in rows if r[1] == g]) <= 5
    assert (rows[-1][0] - rows[0][0]).total_seconds() >= 2  # the limit bound: 36 claims took 3 windows


def test_order_within_a_group_is_exact_through_failures_and_retries(
    services: list[ServeProcess], database_url: str, db: psycopg.Connection
) -> None:
    """4 ordered groups of 15 jobs; a third of the attempts fail and come back after a short backoff (the
    queue's backoff settings), and some workers release the job untried. Whenever a job is handed out, the
    job before it in its group has completed; each group's jobs complete in exactly their order."""
    a, _ = services
    # Enough attempts that no job fails for good (that would end its turn, and the test checks completes).
    configure(a, "o", ordered=True, backoff_base_seconds=0.05, backoff_max_seconds=0.2, max_attempts=100)
    jobs = [{"payload": {"g": g, "n": n}, "group": f"g{g}"} for n in range(15) for g in range(4)]
    enqueue(a, "o", jobs)
    ids = {(row[0], row[1]): row[2] for row in db.execute(
        "SELECT group_key, (payload->>'n')::int, id FROM jobq.jobs WHERE queue_name = 'o'")}  # fmt: skip
    completed: list[tuple[str, int]] = []
    failures = 0
    rng = random.Random(3)

    async def handle(client: httpx.AsyncClient, job: dict[str, Any]) -> None:
        nonlocal failures
        g, n = job["group"], job["payload"]["n"]
        if n > 0:  # the job before it has finished for good, as seen now
            before = await client.get(f"/jobs/{ids[(g, n - 1)]}")
            assert before.json()["status"] == "completed", (g, n, before.json())
        roll = rng.random()
        if roll < 0.3:
            failures += 1
            r = await client.post(f"/jobs/{job['id']}/fail", json={"claim_token": job["claim_token"], "error": "x"})
        elif roll < 0.4:
            r = await client.post(f"/jobs/{job['id']}/release", json={"claim_token": job["claim_token"]})
        else:
            await complete(client, job)
            completed.append((g, n))
            return
        assert r.status_code == 200, r.text

    with Sampler(database_url, "o") as sampler:
        run_claimers(services, "o", handle, lambda: len(completed) >= 60)
    assert failures > 5
    assert sampler.most_in_group == 1
    for g in range(4):
        assert [n for grp, n in completed if grp == f"g{g}"] == list(range(15))
    finish = db.execute("SELECT group_key, id FROM jobq.jobs WHERE queue_name = 'o' ORDER BY finished_at").fetchall()
    for g in range(4):
        assert [i for grp, i in finish if grp == f"g{g}"] == sorted(i for grp, i in finish if grp == f"g{g}")


@pytest.mark.parametrize("fair", [True, False])
def test_fairness_a_small_group_is_not_starved_by_a_big_one(
    services: list[ServeProcess], db: psycopg.Connection, fair: bool
) -> None:
    """Group A has 20,000 ready jobs, group B 100 enqueued a moment later. With `fair`, all of B's jobs
    complete before 5% of A's have; without it, B waits behind A. Both runs stop once 5% of A is done."""
    a, _ = services
    queue = "fair" if fair else "plain"
    if fair:
        configure(a, queue, fair=True)
    enqueue(a, queue, [{"payload": n, "group": "A"} for n in range(20_000)])
    enqueue(a, queue, [{"payload": n, "group": "B"} for n in range(100)])
    done = {"A": 0, "B": 0}

    async def handle(client: httpx.AsyncClient, job: dict[str, Any]) -> None:
        await complete(client, job)
        done[job["group"]] += 1

    run_claimers(services, queue, handle, lambda: done["A"] >= 1000 or done["B"] >= 100, most=10)
    if fair:
        assert done["B"] == 100 and done["A"] < 1000, done
    else:
        assert done["B"] == 0 and done["A"] >= 1000, done
