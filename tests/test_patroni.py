"""jobq under a real failover manager: one etcd and two PostgreSQL 15 members under Patroni, synchronous mode
on (tests/patroni.py), `jobq serve` on a URL naming both members, producers enqueueing with idempotency keys
and an SDK worker running (tests/failover_load.py, which writes down every request). A planned switchover
(`patronictl switchover`), then the leader's PostgreSQL killed with SIGKILL and its standby promoted by
Patroni. From the whole history afterwards: no acknowledged enqueue missing, no job completed under two
claims, every job completed, never a 500, no failed request seen by the workers in the switchover, and the
outage clients saw, measured and printed (docs/deployment.md#what-a-failover-looks-like).

Needs Debian's `patroni` and `etcd-server` packages: skipped without them, unless JOBQ_REQUIRE_PATRONI is set
(CI), and then it fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.patroni import PatroniCluster, missing, patroni_cluster
from tests.processes import ServeProcess
from tests.support import report, wait_until, whole_lines

ROOT = Path(__file__).parent.parent

# Two PostgreSQL servers, etcd and Patroni started, a switchover and a failover under load: about 90 s.
# The members are the machine's PostgreSQL 15 whatever the suite runs on: CI runs it once.
pytestmark = [pytest.mark.slow, pytest.mark.one_major]


@pytest.fixture
def patroni() -> Iterator[PatroniCluster]:
    if why := missing():
        if os.environ.get("JOBQ_REQUIRE_PATRONI"):
            pytest.fail(f"JOBQ_REQUIRE_PATRONI is set but {why}")
        pytest.skip(f"{why}; set JOBQ_REQUIRE_PATRONI to insist")
    with patroni_cluster() as cluster:
        yield cluster


class Run:
    """The load driver's history, read back."""

    def __init__(self, path: Path) -> None:
        self.entries = [json.loads(line) for line in whole_lines(path) if line.strip()]

    def of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]

    def acknowledged(self) -> dict[str, int]:
        return {e["key"]: e["id"] for e in self.of("enqueue") if "id" in e}

    def outage(self, who: str, since: float, until: float) -> tuple[float, int, int]:
        """Within [since, until]: the longest time `who` went without a successful answer, and how many of its
        requests were answered 503 and got no answer at all."""
        calls = [e for e in self.of("http", who=who) if since <= e["t1"] and e["t0"] <= until]
        ok = sorted(e["t1"] for e in calls if 200 <= e.get("status", 0) < 300)
        marks = [since, *ok, until]
        longest = max((b - a for a, b in pairwise(marks)), default=0.0)
        return longest, sum(e.get("status") == 503 for e in calls), sum("error" in e for e in calls)


def test_jobq_through_a_switchover_and_a_crash_of_the_leader_under_patroni(
    patroni: PatroniCluster, tmp_path: Path
) -> None:
    url = patroni.create_database()
    server = ServeProcess(log=tmp_path / "serve.log", env={"JOBQ_DATABASE_URL": url}).wait_ready()
    history, producing = tmp_path / "history.jsonl", tmp_path / "producing"
    producing.touch()
    with (tmp_path / "load.out").open("wb") as out:
        load = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "failover_load.py"), server.url, str(history), str(producing)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        replication = server.client.get("/readyz").json()["replication"]
        assert replication["mode"] == "synchronous" and replication["warning"] is None, replication

        def acknowledged() -> int:
            return len(Run(history).acknowledged()) if history.exists() else 0

        def more(n: int) -> None:
            target = acknowledged() + n
            wait_until(lambda: acknowledged() >= target, timeout=120, what=f"{n} more acknowledged enqueues")

        more(100)
        switch_from = time.time()
        patroni.switchover("pg0", "pg1")
        wait_until(lambda: patroni.leader() == "pg1", timeout=120, what="pg1 to lead")
        more(100)
        wait_until(lambda: patroni.sync_standby() == "pg0", timeout=120, what="pg0 back as the synchronous standby")
        switch_until = time.time()

        more(100)
        crash_from = time.time()
        patroni.kill_postgres("pg1")
        wait_until(lambda: patroni.leader() == "pg0", timeout=120, what="Patroni to promote pg0")
        more(100)
        crash_until = time.time()
        producing.unlink()

        with psycopg.connect(url, autocommit=True) as db:

            def all_completed() -> bool:
                row = db.execute("SELECT count(*) FILTER (WHERE status <> 'completed') FROM jobq.jobs").fetchone()
                return row == (0,)

            wait_until(all_completed, timeout=180, what="every job completed")
            rows = db.execute(
                "SELECT id, idempotency_key, status, result FROM jobq.jobs WHERE queue_name = 'ha'"
            ).fetchall()
    finally:
        producing.unlink(missing_ok=True)
        if load.poll() is None:
            load.send_signal(signal.SIGTERM)
        load.wait(60)
        server.close()
    run = Run(history)

    # No acknowledged enqueue is missing, each is one job, and every job ended completed with its own result.
    acked = run.acknowledged()
    jobs = {key: (job_id, status, result) for job_id, key, status, result in rows}
    assert set(acked) <= set(jobs), sorted(set(acked) - set(jobs))[:10]
    assert all(jobs[key][0] == job_id for key, job_id in acked.items())
    assert all(status == "completed" and result == {"key": key} for key, (_, status, result) in jobs.items())
    # No job was completed under two claims: every confirmed complete of a job carried the same token.
    tokens: dict[int, set[str]] = defaultdict(set)
    for entry in run.of("http", who="worker"):
        for job_id, token in entry.get("completed", []):
            tokens[job_id].add(token)
    assert all(len(t) == 1 for t in tokens.values()), {j: t for j, t in tokens.items() if len(t) > 1}
    assert set(tokens) == {job_id for job_id, _, _ in jobs.values()}
    # Never a 500, whatever happened.
    assert not [e for e in run.of("http") if e.get("status", 0) >= 500 and e["status"] != 503]
    # The switchover: the SDK's retries hide it from the workers (and from the producers).
    failed = [e for e in run.of("log") if switch_from <= e["t"] <= switch_until]
    assert not failed, failed
    assert not [e for e in run.of("enqueue") if "error" in e], "an enqueue gave up"

    runs: dict[int, int] = defaultdict(int)
    for entry in run.of("run"):
        runs[entry["id"]] += 1
    for phase, since, until in (("switchover", switch_from, switch_until), ("crash", crash_from, crash_until)):
        producers, p503, plost = run.outage("producer", since, until)
        workers, w503, wlost = run.outage("worker", since, until)
        report(
            f"patroni {phase}: producers went {producers:.1f}s without an acknowledgement (503 answers: {p503}, "
            f"requests without an answer: {plost}, all retried), workers {workers:.1f}s without a successful "
            f"request (503 answers: {w503}, without an answer: {wlost})"
        )
    worker_failures = [e for e in run.of("log") if crash_from <= e["t"] <= crash_until]
    report(
        f"patroni run: {len(acked)} jobs acknowledged and completed, none lost; {sum(n > 1 for n in runs.values())} "
        f"ran twice (a claim's answer lost in the crash: back when its lease lapsed); "
        f"{len(worker_failures)} worker warnings in the crash"
    )
