"""Dependency cascades that cannot stall anyone (issue 21): the depth limit, the chains and fan-outs of the
review, finished by a request that answers at once while the release goes on in the background, the sweeper
that works queue by queue, a crash mid-cascade, and the leftovers of a previous release's processes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from app.core.dependencies import INLINE_LEVELS
from tests.processes import ServeProcess
from tests.support import LiveServer, lock_waiters, wait_until

FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def batch(server: LiveServer, jobs: list[dict[str, Any]], queue: str) -> list[dict[str, Any]]:
    r = server.client.post(f"/queues/{queue}/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201, r.text
    return r.json()["jobs"]  # type: ignore[no-any-return]


def counts(server: LiveServer, queue: str) -> dict[str, int]:
    r = server.client.get(f"/queues/{queue}/stats")
    assert r.status_code == 200, r.text
    return r.json()["counts"]  # type: ignore[no-any-return]


def chain(server: LiveServer, queue: str, root: int, length: int, per_batch: int = 1000) -> list[dict[str, Any]]:
    """The review's chain: batches whose every item depends on the one before, the first on the last job of
    the batch before (or on `root`)."""
    made: list[dict[str, Any]] = []
    previous = root
    while len(made) < length:
        n = min(per_batch, length - len(made))
        jobs = [{"payload": len(made), "depends_on": [previous]}]
        jobs += [{"payload": len(made) + i, "depends_on": [{"ref": i - 1}]} for i in range(1, n)]
        made += batch(server, jobs, queue)
        previous = made[-1]["id"]
    return made


def releaser(server: LiveServer, **kw: Any) -> Any:
    return server.run(lambda: server.services.maintenance["releaser"].run_once(**kw))


# --- the depth limit -----------------------------------------------------------------------------------------------


def test_the_reviews_chain_stops_at_the_depth_limit_and_nothing_beyond_it_is_written(
    server_factory: Callable[..., LiveServer],
) -> None:
    """10 batches of 1,000, each item depending on the one before: with the default limit (1,000) the chain
    is refused at the item that would be 1,001 deep, with a 422 naming it, and that batch writes nothing."""
    server = server_factory()
    assert server.services.settings.max_dependency_depth == 1000
    root = server.enqueue("a1", payload="root")
    made = batch(server, [{"payload": 0, "depends_on": [root["id"]]}]
                 + [{"payload": i, "depends_on": [{"ref": i - 1}]} for i in range(1, 999)], "a1")  # fmt: skip
    assert len(made) == 999  # depths 1 .. 999
    second = [{"payload": 999, "depends_on": [made[-1]["id"]]}]
    second += [{"payload": 999 + i, "depends_on": [{"ref": i - 1}]} for i in range(1, 1000)]
    r = server.client.post("/queues/a1/jobs/batch", json={"jobs": second})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["errors"][0]["loc"] == ["body", "jobs", 1, "depends_on"]
    assert problem["errors"][0]["type"] == "too_deep"
    assert "1001 dependencies deep" in problem["detail"] and "JOBQ_MAX_DEPENDENCY_DEPTH" in problem["detail"]
    assert counts(server, "a1")["waiting"] == 999  # nothing of the refused batch
    # The same item alone, a request of its own: at the limit exactly, accepted; one more level is not.
    last = server.enqueue("a1", payload="at the limit", depends_on=[made[-1]["id"]])
    assert last["status"] == "waiting"
    r = server.client.post("/queues/a1/jobs", json={"payload": "beyond", "depends_on": [last["id"]]})
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "depends_on"], r.text
    # A job depending on a shallow one next to the deep one is as deep as the deeper.
    r = server.client.post("/queues/a1/jobs", json={"payload": "two", "depends_on": [root["id"], last["id"]]})
    assert r.status_code == 422, r.text
    assert counts(server, "a1")["waiting"] == 1000


# --- chains and fan-outs finished by a request that answers at once --------------------------------------------------


@pytest.mark.parametrize("how", ["fail", "cancel"])
def test_a_chain_at_the_limit_is_cancelled_after_the_request_answered(
    server_factory: Callable[..., LiveServer], how: str
) -> None:
    """The review's probe: a 1 s statement timeout, a chain 1,000 deep (the limit), `fail` (retry false) or
    an admin cancel of the root. The request answers with the root finished, having followed only the
    first INLINE_LEVELS levels; the rest is the background release's, visible in the jobs' states, until
    every descendant is cancelled. (No background release runs here until the test runs its pass.)"""
    server = server_factory(statement_timeout_ms=1000, dependency_interval_seconds=0)
    root = server.enqueue("a1", payload="root")
    jobs = chain(server, "a1", root["id"], 1000)
    assert counts(server, "a1")["waiting"] == 1000
    claim = server.claim_one("a1") if how == "fail" else None
    start = time.perf_counter()
    if claim is not None:
        r = server.client.post(
            f"/jobs/{root['id']}/fail", json={"claim_token": claim["claim_token"], "error": "no", "retry": False}
        )
    else:
        r = server.client.post(f"/jobs/{root['id']}/cancel", json={})
    answered = time.perf_counter() - start
    assert r.status_code == 200, r.text
    assert r.json()["status"] == ("failed" if how == "fail" else "cancelled")
    # What the request did: the first levels, each cancelled with the reason; the rest still waits.
    assert counts(server, "a1")["waiting"] == 1000 - INLINE_LEVELS
    assert server.job(jobs[0]["id"])["last_error"] == f"dependency {root['id']} {r.json()['status']}"
    assert server.job(jobs[INLINE_LEVELS - 1]["id"])["status"] == "cancelled"
    assert server.job(jobs[INLINE_LEVELS]["id"])["status"] == "waiting"
    cancelled = 0
    start = time.perf_counter()
    while True:  # passes until one ends with nothing left (a pass gives each queue a slice of time)
        result = releaser(server)
        assert result.errors == 0
        cancelled += result.cancelled
        if not result.more:
            break
    assert cancelled == 1000 - INLINE_LEVELS
    print(f"\n{how} of the root of a 1,000-deep chain: answered in {answered * 1000:.0f} ms; "
          f"the background cancelled the rest in {(time.perf_counter() - start) * 1000:.0f} ms")  # fmt: skip
    got = counts(server, "a1")
    assert (got["waiting"], got["cancelled"]) == (0, 1000 + (how == "cancel"))
    assert server.job(jobs[-1]["id"])["last_error"] == f"dependency {jobs[-2]['id']} cancelled"


def test_a_wide_fan_out_is_released_a_batch_per_step(server_factory: Callable[..., LiveServer]) -> None:
    """2,500 dependants of one job in two queues, each with one dependant of its own: the request that
    cancels the root cancels one batch (100 here) and answers; the background release, running as in
    production, cancels the other 4,900 jobs a bounded step at a time."""
    server = server_factory(dependency_batch_size=100)
    root = server.enqueue("fan", payload="root")
    for queue in ("left", "right"):
        for start in range(0, 2500, 500):
            jobs: list[dict[str, Any]] = []
            for i in range(start, start + 500, 2):
                jobs += [
                    {"payload": i, "depends_on": [root["id"]]},
                    {"payload": i + 1, "depends_on": [{"ref": len(jobs)}]},
                ]
            batch(server, jobs, queue)
    # (left: 1,250 children of the root and 1,250 grandchildren; right the same)
    start = time.perf_counter()
    r = server.client.post(f"/jobs/{root['id']}/cancel", json={})
    answered = time.perf_counter() - start
    assert r.status_code == 200 and r.json()["status"] == "cancelled"

    def cancelled() -> int:
        return counts(server, "left")["cancelled"] + counts(server, "right")["cancelled"]

    wait_until(lambda: cancelled() == 5000, timeout=120, what="every dependant cancelled")
    print(f"\ncancel of a root of 2,500 (each with one dependant), batches of 100: answered in "
          f"{answered * 1000:.0f} ms, all cancelled after {(time.perf_counter() - start) * 1000:.0f} ms")  # fmt: skip
    assert counts(server, "left")["waiting"] == counts(server, "right")["waiting"] == 0


def test_completing_a_parent_of_many_releases_them_all(
    server_factory: Callable[..., LiveServer],
) -> None:
    server = server_factory(dependency_batch_size=100, max_batch_jobs=2000)
    parent = server.enqueue("p", payload="p")
    batch(server, [{"payload": i, "depends_on": [parent["id"]]} for i in range(2000)], "kids")
    answer = server.claim_in_background("kids", wait_seconds=20, limit=100)
    claim = server.claim_one("p")
    r = server.client.post(f"/jobs/{parent['id']}/complete", json={"claim_token": claim["claim_token"]})
    assert r.status_code == 200
    assert len(answer()) == 100  # released in the request, woken at once
    wait_until(lambda: counts(server, "kids")["waiting"] == 0, timeout=120, what="every dependant released")
    assert counts(server, "kids")["ready"] + counts(server, "kids")["running"] == 2000


# --- the sweeper, queue by queue ---------------------------------------------------------------------------------


def _lapse(db: psycopg.Connection, *ids: int) -> None:
    db.execute("UPDATE jobq.jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = ANY(%s)", (list(ids),))


def test_a_lapsed_last_attempt_in_another_queue_is_failed_while_a_big_cascade_is_in_progress(
    server_factory: Callable[..., LiveServer], db: psycopg.Connection, database_url: str
) -> None:
    """Tenant a1's root (last attempt) lapses with a chain of 1,000 and a fan-out of 1,000 below it; tenant
    b1's job (last attempt) lapses too. The sweeper fails both at once; a1's cascade, held up mid-way by a
    row lock, is in progress meanwhile, and completes once the lock is gone."""
    server = server_factory(sweep_interval_seconds=3600)
    root = server.enqueue("a1", payload="root", max_attempts=1)
    jobs = chain(server, "a1", root["id"], 1000)
    batch(server, [{"payload": i, "depends_on": [root["id"]]} for i in range(1000)], "a1-fan")
    other = server.enqueue("b1", payload="b", max_attempts=1)
    assert server.claim_one("a1")["id"] == root["id"]
    assert server.claim_one("b1")["id"] == other["id"]
    _lapse(db, root["id"], other["id"])
    held = jobs[500]
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT FROM jobq.jobs WHERE queue_name = 'a1' AND id = %s FOR UPDATE", (held["id"],))
        result = server.run(lambda: server.services.maintenance["rescuer"].run_once())
        assert (result.failed, result.errors) == (2, 0)
        assert server.job(other["id"])["status"] == "failed"
        assert server.job(root["id"])["status"] == "failed"
        # The cascade is under way, and stuck at the held job until the lock goes.
        wait_until(
            lambda: server.job(jobs[499]["id"])["status"] == "cancelled", timeout=120, what="the cascade under way"
        )
        assert server.job(held["id"])["status"] == "waiting"
    wait_until(lambda: counts(server, "a1")["waiting"] == 0, timeout=120, what="the chain cancelled")
    assert counts(server, "a1-fan")["waiting"] == 0


@contextlib.contextmanager
def slow_updates_of(db: psycopg.Connection, queue: str) -> Iterator[None]:
    """Every UPDATE of a job of `queue` sleeps 30 s first (a queue in trouble), until the block ends. (On Citus a
    trigger on a distributed table is allowed by citus.enable_unsafe_triggers; it is created on every shard.)"""
    if db.execute("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')").fetchone() == (True,):
        db.execute("SET citus.enable_unsafe_triggers = on")
    db.execute(f"""
        CREATE FUNCTION slow_queue() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.queue_name = '{queue}' THEN PERFORM pg_sleep(30); END IF; RETURN NEW; END $$
    """)  # fmt: skip
    db.execute("CREATE TRIGGER slow_queue BEFORE UPDATE ON jobq.jobs FOR EACH ROW EXECUTE FUNCTION slow_queue()")
    try:
        yield
    finally:
        db.execute("DROP TRIGGER slow_queue ON jobq.jobs")
        db.execute("DROP FUNCTION slow_queue()")


def test_a_queue_whose_sweep_runs_past_its_budget_stops_no_other_queue(
    server_factory: Callable[..., LiveServer], db: psycopg.Connection
) -> None:
    # A budget the stuck queue runs past (its updates sleep 30 s) and no other statement of the pass comes near.
    server = server_factory(sweep_interval_seconds=3600, maintenance_statement_timeout_ms=3000)
    stuck = [server.enqueue("a1", payload=i, max_attempts=1) for i in range(3)]
    other = server.enqueue("b1", payload="b", max_attempts=1)
    retried = server.enqueue("c1", payload="c", max_attempts=5)
    claimed = [server.claim_one(q)["id"] for q in ("a1", "a1", "a1", "b1", "c1")]
    _lapse(db, *claimed)
    errors = server.services.metrics.registry.get_sample_value("jobq_maintenance_errors_total", {"service": "rescuer"})
    with slow_updates_of(db, "a1"):
        result = server.run(lambda: server.services.maintenance["rescuer"].run_once())
    assert (result.failed, result.rescued, result.errors) == (1, 1, 1)
    assert server.job(other["id"])["status"] == "failed"
    assert server.job(retried["id"])["status"] == "pending"
    assert {server.job(j["id"])["status"] for j in stuck} == {"running"}
    after = server.services.metrics.registry.get_sample_value("jobq_maintenance_errors_total", {"service": "rescuer"})
    assert (after or 0) - (errors or 0) == 1
    # The trouble gone, the next pass fails them.
    result = server.run(lambda: server.services.maintenance["rescuer"].run_once())
    assert (result.failed, result.errors) == (3, 0)


# --- crashes, and what a previous release leaves --------------------------------------------------------------------


@pytest.mark.slow  # two `jobq serve` processes, one killed mid-cascade and left to time out its statement
def test_a_cascade_a_killed_process_was_doing_is_finished_by_another(database_url: str, tmp_path: Path) -> None:
    env = {
        "JOBQ_DATABASE_URL": database_url,
        "JOBQ_MIGRATE_ON_START": "false",
        "JOBQ_MAINTENANCE_STATEMENT_TIMEOUT_MS": "2000",
        "JOBQ_SWEEP_INTERVAL_SECONDS": "3600",
    }
    first = ServeProcess(env=env, log=tmp_path / "first.log").wait_ready()
    second: ServeProcess | None = None
    try:
        r = first.client.post("/queues/a1/jobs", json={"payload": "root"})
        root = r.json()
        previous, ids = root["id"], []
        for start in range(0, 300, 100):
            jobs = [{"payload": start, "depends_on": [previous]}]
            jobs += [{"payload": start + i, "depends_on": [{"ref": i - 1}]} for i in range(1, 100)]
            r = first.client.post("/queues/a1/jobs/batch", json={"jobs": jobs})
            assert r.status_code == 201, r.text
            ids += [j["id"] for j in r.json()["jobs"]]
            previous = ids[-1]
        with psycopg.connect(database_url, autocommit=True) as db, psycopg.connect(database_url) as holder:
            # The first process's background release, mid-cascade, waits for a job held here; then it dies.
            holder.execute("SELECT FROM jobq.jobs WHERE queue_name = 'a1' AND id = %s FOR UPDATE", (ids[150],))
            r = first.client.post(f"/jobs/{root['id']}/cancel", json={})
            assert r.status_code == 200

            wait_until(
                lambda: lock_waiters(db, "j.pending_dependencies > i.n") == 1,
                what="the first process's release waiting mid-cascade",
            )
            first.kill()
            holder.rollback()
            second = ServeProcess(env=env, log=tmp_path / "second.log").wait_ready()

            def waiting() -> int:
                row = db.execute(
                    "SELECT count(*) FROM jobq.jobs WHERE queue_name = 'a1' AND status = 'waiting'"
                ).fetchone()
                return int(row[0]) if row else -1

            wait_until(lambda: waiting() == 0, timeout=120, what="the second process to finish the cascade")
            assert db.execute("SELECT count(*) FROM jobq.dependency_releases").fetchone() == (0,)
            assert db.execute("SELECT count(*) FROM jobq.job_dependencies").fetchone() == (0,)
    finally:
        first.close()
        if second is not None:
            second.close()


def test_what_a_previous_releases_process_left_is_released_by_the_reconciliation(
    server_factory: Callable[..., LiveServer], db: psycopg.Connection
) -> None:
    """A process of the previous release enqueues without queue names on the dependency rows and finishes
    jobs without recording them: the reconciliation finds both, and the dependants are released."""
    server = server_factory(dependency_interval_seconds=0)
    done, failed = server.enqueue("a1", payload="p"), server.enqueue("a1", payload="f")
    child = server.enqueue("b1", payload="c", depends_on=[done["id"]])
    other = server.enqueue("b1", payload="o", depends_on=[failed["id"]])
    gone = server.enqueue("a1", payload="g")
    orphan = server.enqueue("b1", payload="x", depends_on=[gone["id"]])
    # As the previous release wrote them, and finished them: no queue names, no outbox row.
    db.execute("UPDATE jobq.job_dependencies SET parent_queue = NULL, job_queue = NULL")
    db.execute("UPDATE jobq.jobs SET status = 'completed', finished_at = now() WHERE id = %s", (done["id"],))
    db.execute("UPDATE jobq.jobs SET status = 'failed', finished_at = now() WHERE id = %s", (failed["id"],))
    db.execute("DELETE FROM jobq.jobs WHERE id = %s", (gone["id"],))  # finished, then deleted by retention
    assert releaser(server, reconcile=False).released == 0  # nothing recorded: nothing to do yet
    result = releaser(server, reconcile=True)
    assert (result.recorded, result.released, result.cancelled) == (3, 2, 1)
    assert server.job(child["id"])["status"] == "pending"
    assert server.job(orphan["id"])["status"] == "pending"
    assert (server.job(other["id"])["status"], server.job(other["id"])["last_error"]) == (
        "cancelled",
        f"dependency {failed['id']} failed",
    )
    assert db.execute("SELECT count(*) FROM jobq.job_dependencies").fetchone() == (0,)
    assert releaser(server, reconcile=True).recorded == 0
