"""Scale-out: several real `jobq serve` processes on one database."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.processes import Announcements, ServeProcess
from tests.support import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def instances(database_url: str, tmp_path: Path) -> Iterator[list[ServeProcess]]:
    """Two instances on different ports sharing one database, sweepers on (every 0.2 s), and a fallback
    poll so slow (60 s) that only a cross-process wake-up can reach a waiting claim in time."""
    env = {
        "JOBQ_DATABASE_URL": database_url,
        "JOBQ_SWEEP_INTERVAL_SECONDS": "0.2",
        "JOBQ_POLL_INTERVAL_SECONDS": "60",
    }
    started = [ServeProcess(log=tmp_path / f"{name}.log", env=env) for name in ("a", "b")]
    try:
        yield [s.wait_ready() for s in started]
        for s in started:
            assert s.stop() == 0, s.output()
    finally:
        for s in started:
            s.close()


def test_two_instances_with_their_sweepers_never_claim_a_job_twice(
    instances: list[ServeProcess], db: psycopg.Connection
) -> None:
    """16 claimers spread over both instances drain 2,000 jobs. 200 of them were first claimed with a 1 s
    lease by a worker that vanished, so both sweepers race to return those while claims go on."""
    a, b = instances
    for srv in (a, b):
        r = srv.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(1000)]})
        assert r.status_code == 201
    abandoned = set()
    for srv in (a, b):
        r = srv.client.post("/queues/q/claim", json={"worker": "gone", "limit": 100, "lease_seconds": 1})
        abandoned |= {j["id"] for j in r.json()["jobs"]}
    assert len(abandoned) == 200

    claims: list[tuple[int, str]] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        srv = (a, b)[n % 2]
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            while True:
                r = c.post("/queues/q/claim", json={"worker": f"w{n}", "limit": 5, "wait_seconds": 3})
                assert r.status_code == 200, r.text
                jobs = r.json()["jobs"]
                if not jobs:
                    return  # nothing for 3 s: the abandoned leases have long lapsed and been swept
                with lock:
                    claims.extend((j["id"], j["claim_token"]) for j in jobs)
                tokens = [{"id": j["id"], "claim_token": j["claim_token"]} for j in jobs]
                done = c.post("/jobs/complete", json={"jobs": tokens})
                assert done.status_code == 200, done.text

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    ids = [i for i, _ in claims]
    assert len(ids) == len(set(ids)) == 2000, "a job was handed to two live claims"
    counts = dict(db.execute("SELECT status, count(*) FROM jobq.jobs GROUP BY status").fetchall())
    assert counts == {"completed": 2000}
    attempts = dict(db.execute("SELECT attempts, count(*) FROM jobq.jobs GROUP BY attempts").fetchall())
    assert attempts == {1: 1800, 2: 200}  # each abandoned job swept back exactly once


def test_an_enqueue_through_one_instance_wakes_a_long_poll_on_the_other(
    instances: list[ServeProcess], database_url: str
) -> None:
    a, b = instances
    announcements = Announcements(database_url)
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(
            lambda: a.client.post("/queues/mail/claim", json={"worker": "w", "wait_seconds": 30}).json()["jobs"]
        )
        announcements.wait_for({"mail"})  # a's claim is parked, and a has told the others
        announcements.close()
        # b acts on a's announcement as soon as its listener reads it: until the claim is answered, enqueue
        # through b now and then. With a's fallback poll at 60 s and the claim's deadline at 30 s, only
        # b's NOTIFY can wake it.
        through_b = []
        while not waiting.done() and len(through_b) < 20:
            through_b.append(b.enqueue("mail", payload="through b")["id"])
            wait([waiting], timeout=0.5)
        jobs = waiting.result(timeout=60)
        assert len(jobs) == 1 and jobs[0]["id"] in through_b


def _claim_complete(url: str, n: int) -> int:
    with httpx.Client(base_url=url, timeout=60) as c:
        jobs = c.post("/queues/w/claim", json={"worker": f"w{n}", "wait_seconds": 20}).json()["jobs"]
        assert len(jobs) == 1
        r = c.post(f"/jobs/{jobs[0]['id']}/complete", json={"claim_token": jobs[0]["claim_token"]})
        assert r.status_code == 200
        return int(jobs[0]["id"])


def test_workers_share_the_port_and_shut_down_gracefully(database_url: str, tmp_path: Path) -> None:
    """`--workers 2`: two processes behind one port. Long-polls waiting in either are woken by enqueues
    that may land in the other, and on SIGTERM the ones still waiting are answered [] and it exits 0."""
    srv = ServeProcess("--workers", "2", log=tmp_path / "serve.log", env={"JOBQ_DATABASE_URL": database_url})
    try:
        srv.wait_ready()
        wait_until(lambda: srv.output().count("jobq ready") == 2, what="both worker processes ready")
        announcements = Announcements(database_url)
        with ThreadPoolExecutor(max_workers=12) as pool:
            workers = [pool.submit(_claim_complete, srv.url, n) for n in range(8)]
            announcements.wait_for({"w"})
            enqueued = {srv.enqueue("w", payload=n)["id"] for n in range(8)}
            assert {w.result(timeout=60) for w in workers} == enqueued

            def idle(n: int) -> Any:
                with httpx.Client(base_url=srv.url, timeout=120) as c:
                    r = c.post(f"/queues/idle-{n}/claim", json={"worker": "w", "wait_seconds": 30})
                    return r.status_code, r.json()

            polls = [pool.submit(idle, n) for n in range(4)]
            announcements.wait_for({f"idle-{n}" for n in range(4)})
            announcements.close()
            srv.signal()
            assert [p.result(timeout=60) for p in polls] == [(200, {"jobs": [], "completed": []})] * 4
        assert srv.wait(60) == 0, srv.output()
    finally:
        srv.close()
