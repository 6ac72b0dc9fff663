"""Every row of the effects table (app/core/effects.py), through every path its row names: the path is
driven for real on a fresh job, the job is checked to have made that move, and what the move set off is
watched at the wake-up seam and in the metrics: the claims woken on the job's queue (one known to have no
limits, and one with limits), the requests waiting for its result, and every per-queue count."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
import pytest

from app.core.effects import (
    CANCELLED,
    COMPLETED,
    FAILED,
    GONE,
    NEW,
    PENDING,
    RUNNING,
    SCHEDULED,
    TABLE,
    WAITING,
    Path,
)
from app.observability.metrics import EVENTS
from tests.support import LiveServer, record_finishes, record_wakeups, settle_long_poll, wait_until
from tests.test_results import Waiting, parked

FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
PARENTS = "parents"  # the queue of the jobs a dependant waits for: its moves are not the ones watched
LATER = 3600  # seconds: a job due this late is not due within the test


@dataclass
class Case:
    server: LiveServer
    db: psycopg.Connection
    queue: str
    job: dict[str, Any] | None = None  # the job, as the setup left it in the row's from-state

    def post(self, path: str, body: Any = None, status: int = 200) -> dict[str, Any]:
        r = self.server.client.post(path, json=body)
        assert r.status_code == status, r.text
        return r.json()  # type: ignore[no-any-return]

    def running(self, **fields: Any) -> dict[str, Any]:
        self.server.enqueue(self.queue, payload=1, **fields)
        return self.server.claim_one(self.queue)

    def parent(self, state: str) -> dict[str, Any]:
        job = self.server.enqueue(PARENTS, payload="parent")
        if state == PENDING:
            return job
        claimed = self.server.claim_one(PARENTS)
        if state == COMPLETED:
            self.post(f"/jobs/{job['id']}/complete", {"claim_token": claimed["claim_token"]})
        else:
            self.post(f"/jobs/{job['id']}/fail", {"claim_token": claimed["claim_token"], "error": "x", "retry": False})
        return job

    def finish_parent(self, how: str) -> None:
        [parent] = self.job["depends_on"]  # type: ignore[index]
        claimed = self.server.claim_one(PARENTS)
        assert claimed["id"] == parent
        body = {"claim_token": claimed["claim_token"]}
        if how == "complete":
            self.post(f"/jobs/{parent}/complete", body)
        else:
            self.post(f"/jobs/{parent}/fail", {**body, "error": "x", "retry": False})

    def run(self, service: str, **kw: Any) -> Any:
        return self.server.run(lambda: self.server.services.maintenance[service].run_once(**kw))


# -- the setups: a job in each from-state ------------------------------------------------------------------


def _pending(c: Case) -> dict[str, Any]:
    return c.server.enqueue(c.queue, payload=1)


def _waiting(c: Case) -> dict[str, Any]:
    return c.server.enqueue(c.queue, payload=1, depends_on=[c.parent(PENDING)["id"]])


def _finished(status: str) -> Callable[[Case], dict[str, Any]]:
    def setup(c: Case) -> dict[str, Any]:
        job = c.running()
        token = {"claim_token": job["claim_token"]}
        if status == COMPLETED:
            c.post(f"/jobs/{job['id']}/complete", token)
        elif status == FAILED:
            c.post(f"/jobs/{job['id']}/fail", {**token, "error": "x", "retry": False})
        else:
            c.post(f"/jobs/{job['id']}/cancel", {})
        return job

    return setup


SETUPS: dict[str, Callable[[Case], dict[str, Any] | None]] = {
    NEW: lambda c: None,
    PENDING: _pending,
    WAITING: _waiting,
    RUNNING: lambda c: c.running(),
    COMPLETED: _finished(COMPLETED),
    FAILED: _finished(FAILED),
    CANCELLED: _finished(CANCELLED),
}


# -- the paths: each makes the move (path, from, to) and answers the id of the job it moved --------------------


def _id(c: Case) -> int:
    assert c.job is not None
    return int(c.job["id"])


def _token(c: Case) -> dict[str, str]:
    assert c.job is not None
    return {"claim_token": c.job["claim_token"]}


def _schedule(c: Case) -> int:
    name = f"every-hour-{c.queue}"
    r = c.server.client.put(f"/schedules/{name}", json={"queue": c.queue, "cron": "0 * * * *", "payload": 1})
    assert r.status_code == 201, r.text
    c.db.execute("UPDATE jobq.schedules SET next_run_at = now() - interval '1 second' WHERE name = %s", (name,))
    assert c.run("scheduler").enqueued == 1
    row = c.db.execute("SELECT id FROM jobq.jobs WHERE schedule = %s", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def _hand_back(c: Case) -> int:
    """The dispatcher's hand-back of rows claimed for a request that went away (tests/test_waiting.py drives
    it end to end, through a key revoked while its claim waited)."""
    assert c.job is not None
    row = SimpleNamespace(id=c.job["id"], claim_token=c.job["claim_token"], queue=c.queue)
    c.server.run(lambda: c.server.services.dispatcher._release([row]))
    return _id(c)


def _last_attempt(c: Case) -> bool:
    c.db.execute("UPDATE jobq.jobs SET max_attempts = attempts WHERE id = %s", (_id(c),))
    return True


def _timeout(c: Case) -> bool:
    c.db.execute("UPDATE jobq.jobs SET timeout_seconds = 1 WHERE id = %s", (_id(c),))
    return True


def _bulk(action: str) -> Callable[[Case], int]:
    def act(c: Case) -> int:
        doc = c.post("/jobs/bulk", {"action": action, "ids": [_id(c)]})
        assert doc["done"] == 1, doc
        return _id(c)

    return act


def _purge(c: Case) -> int:
    """SQS PurgeQueue (and DeleteQueue, which purges first): every unfinished job of the queue cancelled."""
    assert c.server.run(lambda: c.server.services.sqs.purge(c.queue)) == 1
    return _id(c)


def _handed_off(c: Case) -> int:
    """An enqueue that a claim parked on the queue in this process takes in the same transaction (the direct
    hand-off, tests/test_handoff.py): the claim's own answer carries the job."""
    server = c.server
    answer: list[Any] = []
    thread = threading.Thread(
        target=lambda: answer.append(
            httpx.post(f"{server.url}/queues/{c.queue}/claim", json={"worker": "w", "wait_seconds": 30}, timeout=60)
        )
    )
    thread.start()
    wait_until(lambda: server.services.dispatcher.parked == 1, what="the claim parked")
    settle_long_poll(server, c.queue)
    job_id = int(server.enqueue(c.queue, payload=1)["id"])
    thread.join(60)
    assert [j["id"] for j in answer[0].json()["jobs"]] == [job_id]
    assert server.services.dispatcher.handed == 1
    return job_id


ACTIONS: dict[tuple[Path, str, str], Callable[[Case], int]] = {
    (Path.ENQUEUE, NEW, RUNNING): _handed_off,
    (Path.ENQUEUE, NEW, PENDING): lambda c: c.server.enqueue(c.queue, payload=1)["id"],
    (Path.ENQUEUE, NEW, SCHEDULED): lambda c: c.server.enqueue(c.queue, payload=1, delay_seconds=LATER)["id"],
    (Path.ENQUEUE_DEPENDENT, NEW, PENDING): lambda c: c.server.enqueue(
        c.queue, payload=1, depends_on=[c.parent(COMPLETED)["id"]]
    )["id"],
    (Path.ENQUEUE_DEPENDENT, NEW, SCHEDULED): lambda c: c.server.enqueue(
        c.queue, payload=1, delay_seconds=LATER, depends_on=[c.parent(COMPLETED)["id"]]
    )["id"],
    (Path.ENQUEUE_DEPENDENT, NEW, WAITING): lambda c: c.server.enqueue(
        c.queue, payload=1, depends_on=[c.parent(PENDING)["id"]]
    )["id"],
    (Path.ENQUEUE_DEPENDENT, NEW, CANCELLED): lambda c: c.server.enqueue(
        c.queue, payload=1, depends_on=[c.parent(FAILED)["id"]]
    )["id"],
    (Path.SCHEDULE, NEW, PENDING): _schedule,
    (Path.CLAIM, PENDING, RUNNING): lambda c: c.server.claim_one(c.queue)["id"],
    (Path.COMPLETE, RUNNING, COMPLETED): lambda c: c.post(f"/jobs/{_id(c)}/complete", _token(c))["id"],
    (Path.FAIL, RUNNING, FAILED): lambda c: c.post(f"/jobs/{_id(c)}/fail", {**_token(c), "error": "x", "retry": False})[
        "id"
    ],
    (Path.FAIL, RUNNING, PENDING): lambda c: c.post(
        f"/jobs/{_id(c)}/fail", {**_token(c), "error": "x", "retry_in_seconds": 0}
    )["id"],
    (Path.FAIL, RUNNING, SCHEDULED): lambda c: c.post(
        f"/jobs/{_id(c)}/fail", {**_token(c), "error": "x", "retry_in_seconds": LATER}
    )["id"],
    (Path.RELEASE, RUNNING, PENDING): lambda c: c.post(f"/jobs/{_id(c)}/release", _token(c))["id"],
    (Path.RELEASE, RUNNING, SCHEDULED): lambda c: c.post(
        f"/jobs/{_id(c)}/release", {**_token(c), "delay_seconds": LATER}
    )["id"],
    (Path.HAND_BACK, RUNNING, PENDING): _hand_back,
    (Path.RESCUE, RUNNING, PENDING): lambda c: c.run("rescuer", now=FAR_FUTURE).rescued and _id(c),
    (Path.RESCUE, RUNNING, FAILED): lambda c: _last_attempt(c) and c.run("rescuer", now=FAR_FUTURE).failed and _id(c),
    (Path.TIMEOUT, RUNNING, SCHEDULED): lambda c: _timeout(c) and c.run("timeouts", now=FAR_FUTURE) and _id(c),
    (Path.TIMEOUT, RUNNING, FAILED): lambda c: (
        _last_attempt(c) and _timeout(c) and c.run("timeouts", now=FAR_FUTURE) and _id(c)
    ),
    (Path.CANCEL, PENDING, CANCELLED): lambda c: c.post(f"/jobs/{_id(c)}/cancel", {})["id"],
    (Path.CANCEL, WAITING, CANCELLED): lambda c: c.post(f"/jobs/{_id(c)}/cancel", {})["id"],
    (Path.CANCEL, RUNNING, CANCELLED): lambda c: c.post(f"/jobs/{_id(c)}/cancel", {})["id"],
    (Path.BULK_CANCEL, PENDING, CANCELLED): _bulk("cancel"),
    (Path.BULK_CANCEL, WAITING, CANCELLED): _bulk("cancel"),
    (Path.BULK_CANCEL, RUNNING, CANCELLED): _bulk("cancel"),
    (Path.PURGE, PENDING, CANCELLED): _purge,
    (Path.PURGE, WAITING, CANCELLED): _purge,
    (Path.PURGE, RUNNING, CANCELLED): _purge,
    (Path.RETRY, FAILED, PENDING): lambda c: c.post(f"/jobs/{_id(c)}/retry")["id"],
    (Path.RETRY, CANCELLED, PENDING): lambda c: c.post(f"/jobs/{_id(c)}/retry")["id"],
    (Path.BULK_RETRY, FAILED, PENDING): _bulk("retry"),
    (Path.BULK_RETRY, CANCELLED, PENDING): _bulk("retry"),
    (Path.RETRY, COMPLETED, PENDING): lambda c: c.post(f"/jobs/{_id(c)}/retry")["id"],
    (Path.BULK_RETRY, COMPLETED, PENDING): _bulk("retry"),
    (Path.REDRIVE, FAILED, PENDING): lambda c: c.post(f"/queues/{c.queue}/redrive")["jobs"] and _id(c),
    (Path.RETENTION, COMPLETED, GONE): lambda c: sum(c.run("retention", now=FAR_FUTURE).deleted.values()) and _id(c),
    (Path.RETENTION, FAILED, GONE): lambda c: sum(c.run("retention", now=FAR_FUTURE).deleted.values()) and _id(c),
    (Path.RETENTION, CANCELLED, GONE): lambda c: sum(c.run("retention", now=FAR_FUTURE).deleted.values()) and _id(c),
    (Path.DEPENDENCY, WAITING, PENDING): lambda c: c.finish_parent("complete") or _id(c),
    (Path.DEPENDENCY, WAITING, CANCELLED): lambda c: c.finish_parent("fail") or _id(c),
}

CASES = [(frm, to, path) for (frm, to), effect in TABLE.items() for path in effect.paths]


def test_every_move_of_the_table_has_a_way_to_make_it() -> None:
    assert set(ACTIONS) == {(path, frm, to) for frm, to, path in CASES}


# -- what is watched -----------------------------------------------------------------------------------------


def counts(server: LiveServer, queue: str) -> dict[str, float]:
    """Every count a move may set off: the per-queue job events and durations, and the sweeper's and
    scheduler's counters (global: each case's action moves one job)."""
    registry = server.services.metrics.registry

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    out = {e: value(f"jobq_jobs_{e}_total", queue=queue) for e in EVENTS if e != "empty_claims"}
    out["empty_claims"] = value("jobq_claims_empty_with_ready_total", queue=queue)
    out["durations"] = value("jobq_job_duration_seconds_count", queue=queue)
    for action in ("rescued", "failed", "deleted", "timed_out"):
        out[f"swept_{action}"] = value("jobq_sweeper_rows_total", action=action)
    out["ticks_enqueued"] = value("jobq_schedule_ticks_total", outcome="enqueued")
    return out


def status_of(db: psycopg.Connection, job_id: int) -> str:
    scheduled = "CASE WHEN status = 'pending' AND run_at > clock_timestamp() THEN 'scheduled' ELSE status END"
    row = db.execute(f"SELECT {scheduled} FROM jobq.jobs WHERE id = %s", (job_id,)).fetchone()
    return GONE if row is None else str(row[0])


@pytest.mark.parametrize(("frm", "to", "path"), CASES, ids=[f"{p}:{f}->{t}" for f, t, p in CASES])
def test_a_move_sets_off_what_its_row_says(
    server_factory: Any, db: psycopg.Connection, frm: str, to: str, path: Path
) -> None:
    # No fallback poll and no scheduler of its own: whatever wakes, the move woke.
    server: LiveServer = server_factory(
        poll_interval_seconds=60, schedule_interval_seconds=0, schedule_grace_seconds=3600
    )
    wait_until(lambda: server.services.wakeups.connected.is_set(), what="listening")
    r = server.client.patch("/queues/limited/config", json={"concurrency": 1000})
    assert r.status_code == 200, r.text
    for queue in ("plain", "limited"):
        if (frm, to) == (NEW, RUNNING) and queue == "limited":
            continue  # a queue with limits hands nothing off (tests/test_handoff.py)
        check_move(Case(server, db, queue), frm, to, path)


def check_move(c: Case, frm: str, to: str, path: Path) -> None:
    effect, server, queue = TABLE[(frm, to)], c.server, c.queue
    c.job = SETUPS[frm](c)
    # The configuration of the queue held (read or written just now): "plain" known to have no limits.
    server.run(lambda: server.services.configs.get(queue))
    woken, finished = record_wakeups(server), record_finishes(server)
    before = counts(server, queue)

    job_id = ACTIONS[(path, frm, to)](c)

    assert job_id, "the path moved nothing"
    assert status_of(c.db, job_id) == to
    # The dependency release (path DEPENDENCY) is no exception: the request that finished the parent ran it
    # (its direct dependants) and applied its moves before it answered.
    was_woken = any(queue in w for w in woken)
    assert was_woken == (effect.claims == "now" or (effect.claims == "slot" and queue == "limited")), woken
    assert (job_id in [i for ids in finished for i in ids]) == effect.results, finished
    after = counts(server, queue)
    expected = dict.fromkeys(before, 0.0)
    for event in effect.paths[path]:
        expected[event] += 1
    if "completed" in effect.paths[path]:
        expected["durations"] += 1
    assert {k: after[k] - before[k] for k in before} == expected, queue


FELT = [
    (frm, to, path)
    for frm, to, path in CASES
    if (TABLE[(frm, to)].claims == "now" and to == PENDING) or (TABLE[(frm, to)].results and frm != NEW)
]


@pytest.mark.parametrize(("frm", "to", "path"), FELT, ids=[f"{p}:{f}->{t}" for f, t, p in FELT])
def test_a_waiter_the_move_wakes_gets_its_answer(
    server_factory: Any, db: psycopg.Connection, frm: str, to: str, path: Path
) -> None:
    """What the wake-ups are for, seen by the waiting requests themselves: a long-poll parked on the queue
    gets the job the move made claimable, a request waiting for the job's result gets it finished, well
    before their deadline (no fallback poll within it). That the move itself woke them, rather than the
    presence renewal's look every 2 s, is what test_a_move_sets_off_what_its_row_says shows."""
    effect = TABLE[(frm, to)]
    server: LiveServer = server_factory(
        poll_interval_seconds=60, schedule_interval_seconds=0, schedule_grace_seconds=3600
    )
    wait_until(lambda: server.services.wakeups.connected.is_set(), what="listening")
    c = Case(server, db, "plain")
    c.job = SETUPS[frm](c)
    claim = result = None
    if effect.claims == "now" and to == PENDING:
        claim = server.claim_in_background(c.queue, wait_seconds=30)
        settle_long_poll(server, c.queue)
    if effect.results and c.job is not None:
        result = Waiting(server, _id(c), 30)
        parked(server)

    job_id = ACTIONS[(path, frm, to)](c)

    if claim is not None:
        assert [j["id"] for j in claim()] == [job_id]
    if result is not None:
        assert result.result()["status"] == to
