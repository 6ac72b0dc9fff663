"""Queue configuration and flow control through the API, on one service: the configuration endpoints, groups
on jobs, the defaults a queue's configuration gives, and each limit's rule (tests/test_flow_limits.py runs
them across two service processes under load)."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest

from tests.processes import run_jobq
from tests.support import LiveServer, problem, record_wakeups, settle_long_poll, wait_until


def configure(server: LiveServer, queue: str = "q", **fields: Any) -> dict[str, Any]:
    r = server.client.patch(f"/queues/{queue}/config", json=fields)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def running(db: psycopg.Connection, queue: str = "q") -> int:
    return int(
        db.execute("SELECT count(*) FROM jobq.jobs WHERE queue_name = %s AND status = 'running'", (queue,)).fetchone()[
            0
        ]
    )  # type: ignore[index]


# --- configuration --------------------------------------------------------------------------------------------


def test_config_starts_empty_and_a_patch_changes_only_what_it_names(server: LiveServer) -> None:
    empty = server.client.get("/queues/q/config").json()
    assert empty["concurrency"] is None and empty["rate"] is None and empty["changed_at"] is None
    assert empty["retention"] == {"completed": None, "failed": None, "cancelled": None}
    first = configure(server, concurrency=3, rate={"limit": 10, "per_seconds": 60}, retention={"failed": 60})
    assert first["concurrency"] == 3 and first["rate"] == {"limit": 10, "per_seconds": 60}
    assert first["retention"] == {"completed": None, "failed": 60, "cancelled": None}
    second = configure(server, max_attempts=2, retention={"completed": 10})
    assert second["concurrency"] == 3 and second["max_attempts"] == 2
    assert second["retention"] == {"completed": 10, "failed": 60, "cancelled": None}
    cleared = configure(server, concurrency=None, rate=None)
    assert cleared["concurrency"] is None and cleared["rate"] is None and cleared["max_attempts"] == 2
    assert server.client.get("/queues/q/config").json() == cleared
    stats = server.client.get("/queues/q/stats").json()
    assert stats["config"] == cleared


def test_bad_configuration_is_422_and_changes_nothing(server: LiveServer) -> None:
    configure(server, concurrency=2)
    for body in (
        {"concurrency": 0},
        {"concurrency": "5"},
        {"rate": {"limit": 5}},
        {"rate": {"limit": 5, "per_seconds": 0}},
        {"group_rate": {"limit": 1, "per_seconds": 86401}},
        {"max_attempts": 1001},
        {"fair": "yes"},
        {"retention": {"completed": -1}},
        {"lease_seconds": 10**9},
        {"ordered": True, "group_concurrency": 2},
        {"backoff_base_seconds": 100, "backoff_max_seconds": 10},
        {"nonsense": 1},
    ):
        problem(server.client.patch("/queues/q/config", json=body), 422, "validation-error")
    configure(server, group_concurrency=3)
    problem(server.client.patch("/queues/q/config", json={"ordered": True}), 422, "validation-error")
    assert server.client.get("/queues/q/config").json()["concurrency"] == 2
    problem(server.client.patch("/queues/bad name/config", json={}), 422, "validation-error")


def test_a_change_reaches_another_process_at_once(server_factory) -> None:  # type: ignore[no-untyped-def]
    """Two services on one database: a change through one is what the other applies on its next enqueue, as
    soon as the change's notification arrives (no waiting out a cache)."""
    a, b = server_factory(), server_factory()
    wait_until(lambda: b.services.wakeups.connected.is_set(), what="b listening")
    b.enqueue()  # b reads and caches the queue's configuration (none)
    configure(a, max_attempts=7, default_priority=3)
    wait_until(lambda: b.enqueue()["max_attempts"] == 7, timeout=10, what="b to apply the new default")
    assert b.enqueue()["priority"] == 3
    assert b.services.configs.lookups <= 3  # read again once after the change, not on every request


# --- groups and defaults ---------------------------------------------------------------------------------------


def test_group_is_kept_and_shown_wherever_a_job_is(server: LiveServer) -> None:
    job = server.enqueue(payload=1, group="tenant-a")
    assert job["group"] == "tenant-a"
    batch = server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": 2, "group": "b"}, {"payload": 3}]})
    assert [j["group"] for j in batch.json()["jobs"]] == ["b", None]
    assert server.job(job["id"])["group"] == "tenant-a"
    assert [c["group"] for c in server.claim(limit=3)] == ["tenant-a", "b", None]
    listed = server.client.get("/queues/q/jobs").json()["jobs"]
    assert sorted(str(j["group"]) for j in listed) == ["None", "b", "tenant-a"]
    for bad in ("", "x" * 256, "a\x00b", 5, None):
        problem(server.client.post("/queues/q/jobs", json={"payload": 1, "group": bad}), 422, "validation-error")


def test_queue_defaults_apply_to_enqueue_claim_and_fail(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server, max_attempts=2, default_priority=4, lease_seconds=600, backoff_base_seconds=100,
              backoff_max_seconds=100)  # fmt: skip
    job = server.enqueue()
    assert (job["max_attempts"], job["priority"]) == (2, 4)
    assert server.enqueue(max_attempts=9, priority=-1)["max_attempts"] == 9
    other = server.enqueue(queue="other")
    assert (other["max_attempts"], other["priority"]) == (5, 0)  # the global settings
    claim = server.claim_one()
    ttl = db.execute("SELECT extract(epoch FROM lease_expires_at - claimed_at) FROM jobq.jobs WHERE id = %s",
                     (claim["id"],)).fetchone()[0]  # type: ignore[index]  # fmt: skip
    assert float(ttl) == 600
    failed = server.client.post(f"/jobs/{claim['id']}/fail", json={"claim_token": claim["claim_token"], "error": "x"})
    delay = db.execute("SELECT extract(epoch FROM run_at - now()) FROM jobq.jobs WHERE id = %s",
                       (claim["id"],)).fetchone()[0]  # type: ignore[index]  # fmt: skip
    assert failed.json()["status"] == "pending" and 45 < float(delay) <= 100  # base 100 with jitter, not 1


def test_retention_per_queue(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server, "short", retention={"completed": 60})
    for queue in ("short", "long"):
        server.enqueue(queue=queue)
        c = server.claim_one(queue=queue)
        server.client.post(f"/jobs/{c['id']}/complete", json={"claim_token": c["claim_token"]})
    db.execute("UPDATE jobq.jobs SET finished_at = now() - interval '2 hours'")
    server.run(lambda: server.services.maintenance["retention"].run_once())
    left = db.execute("SELECT queue_name FROM jobq.jobs ORDER BY 1").fetchall()
    assert [r[0] for r in left] == ["long"]  # the global retention of completed jobs is a day


# --- limits, one process ---------------------------------------------------------------------------------------


def test_concurrency_caps_running_jobs_and_a_complete_wakes_a_waiting_claim(
    server: LiveServer, db: psycopg.Connection
) -> None:
    for n in range(5):
        server.enqueue(payload=n)
    configure(server, concurrency=2)
    first = server.claim(limit=5)
    assert len(first) == 2 and running(db) == 2
    assert server.claim(limit=5) == []
    waiting = server.claim_in_background(limit=5, wait_seconds=20)
    time.sleep(0.3)
    done = server.client.post(f"/jobs/{first[0]['id']}/complete", json={"claim_token": first[0]["claim_token"]})
    assert done.status_code == 200
    got = waiting()
    assert len(got) == 1 and running(db) == 2
    stats = server.client.get("/queues/q/stats").json()
    wait_until(lambda: server.client.get("/queues/q/stats").json()["window"]["held_back"]["concurrency"] >= 1,
               what="held-back claims in the stats")  # fmt: skip
    assert stats["config"]["concurrency"] == 2


def test_a_process_that_has_not_heard_of_a_limit_claims_nothing_past_it(
    server: LiveServer, db: psycopg.Connection
) -> None:
    """The limit is written behind the service's back (no notification): its cached configuration says
    "no limits", and the claim of an unlimited queue still refuses, learns, and claims under the limit."""
    for n in range(5):
        server.enqueue(payload=n)
    db.execute("INSERT INTO jobq.queue_state (queue_name, concurrency) VALUES ('q', 1)")
    assert len(server.claim(limit=5)) == 1
    assert running(db) == 1


def test_rate_limits_claims_per_window(server: LiveServer, db: psycopg.Connection) -> None:
    for n in range(6):
        server.enqueue(payload=n)
    # A window long enough that the claims, completes and the empty claim below all fall in the first one.
    configure(server, rate={"limit": 2, "per_seconds": 5})
    got = server.claim(limit=6)
    assert len(got) == 2
    for c in got:
        server.client.post(f"/jobs/{c['id']}/complete", json={"claim_token": c["claim_token"]})
    assert server.claim(limit=6) == []  # completes free no rate slot
    # A waiting claim is woken when the window lets the next claims through, not by a poll.
    more = server.claim_in_background(limit=6, wait_seconds=20)()
    assert len(more) == 2
    stamps = [r[0] for r in db.execute("SELECT claimed_at FROM jobq.jobs WHERE claimed_at IS NOT NULL ORDER BY 1")]
    assert (stamps[2] - stamps[1]).total_seconds() >= 5 - 0.01


def test_group_concurrency_holds_a_group_back_not_the_others(server: LiveServer) -> None:
    configure(server, group_concurrency=1)
    for n in range(3):
        server.enqueue(payload=f"a{n}", group="a")
    server.enqueue(payload="b0", group="b")
    server.enqueue(payload="none")
    got = server.claim(limit=10)
    assert sorted(c["payload"] for c in got) == ["a0", "b0", "none"]
    assert server.claim(limit=10) == []
    a0 = next(c for c in got if c["payload"] == "a0")
    server.client.post(f"/jobs/{a0['id']}/complete", json={"claim_token": a0["claim_token"]})
    assert [c["payload"] for c in server.claim(limit=10)] == ["a1"]


def test_ordered_group_waits_for_a_retry(server: LiveServer) -> None:
    configure(server, ordered=True)
    for n in range(3):
        server.enqueue(payload=n, group="g")
    first = server.claim_one()
    assert first["payload"] == 0 and server.claim(limit=5) == []
    server.client.post(f"/jobs/{first['id']}/fail", json={"claim_token": first["claim_token"], "error": "x",
                                                           "retry_in_seconds": 1})  # fmt: skip
    assert server.claim(limit=5) == []  # job 1 must not overtake job 0, which waits for its retry
    again = server.claim_in_background(limit=5, wait_seconds=10)()
    assert [c["payload"] for c in again] == [0]
    server.client.post(f"/jobs/{again[0]['id']}/complete", json={"claim_token": again[0]["claim_token"]})
    assert [c["payload"] for c in server.claim(limit=5)] == [1]


def test_fair_hands_out_round_robin(server: LiveServer) -> None:
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": f"a{n}", "group": "a"} for n in range(6)]})
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": f"b{n}", "group": "b"} for n in range(2)]})
    configure(server, fair=True)
    order = [server.claim_one()["payload"] for _ in range(4)]
    assert sorted(order[:2]) == ["a0", "b0"] and sorted(order[2:]) == ["a1", "b1"]
    batch = server.claim(limit=10)
    assert [c["payload"] for c in batch] == ["a2", "a3", "a4", "a5"]


def test_stats_show_the_top_groups(server: LiveServer) -> None:
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": 1, "group": "big"}] * 3
                                                     + [{"payload": 1, "group": "small"}]})  # fmt: skip
    server.enqueue()
    groups = server.client.get("/queues/q/stats").json()["groups"]
    assert groups == [{"group": "big", "ready": 3, "running": 0}, {"group": "small", "ready": 1, "running": 0}]


# --- the command --------------------------------------------------------------------------------------------


def test_jobq_queues_config_sets_shows_and_clears(server: LiveServer) -> None:
    """`jobq queues config` reads and changes the configuration over the API, with the server's checks."""
    env = {"JOBQ_URL": server.url}
    r = run_jobq("queues", "config", "q", "--set", "max_attempts=7", "--set", "rate=100/60",
                 "--set", "retention.completed=3600", "--set", "fair=true", "--json", env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert (shown["max_attempts"], shown["rate"], shown["fair"]) == (7, {"limit": 100, "per_seconds": 60}, True)
    assert shown["retention"]["completed"] == 3600
    assert server.enqueue()["max_attempts"] == 7
    r = run_jobq("queues", "config", "q", "--set", "rate=null", "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["rate"] is None
    table = run_jobq("queues", "config", "q", env=env)
    assert table.returncode == 0 and "max_attempts" in table.stdout and "100/60s" not in table.stdout
    for bad in ("concurrency=0", "fair=maybe", "ordered=true --set group_concurrency=2", "nonsense=1", "concurrency"):
        r = run_jobq("queues", "config", "q", *[a for part in bad.split(" --set ") for a in ("--set", part)], env=env)
        assert r.returncode == 2 and r.stderr.startswith("jobq:"), (bad, r.stderr)
    assert server.client.get("/queues/q/config").json()["concurrency"] is None
    assert run_jobq("queues", env=env).returncode == 0  # without an action, `jobq queues` still lists


@pytest.mark.parametrize("how", ["cancel", "bulk cancel"])
def test_cancelling_a_running_job_wakes_a_claim_waiting_for_its_slot(server_factory, how: str) -> None:  # type: ignore[no-untyped-def]
    """Under `concurrency: 1`, a claim waits while a job runs; cancelling that job frees the slot, and the
    cancel (single or bulk) wakes the claim at once rather than at the next poll."""
    server: LiveServer = server_factory(poll_interval_seconds=60)  # no fallback poll within the wait
    configure(server, concurrency=1)
    first = server.enqueue(payload=1)
    second = server.enqueue(payload=2)
    assert server.claim_one()["id"] == first["id"]
    answer = server.claim_in_background(wait_seconds=20)
    settle_long_poll(server)
    woken = record_wakeups(server)
    if how == "cancel":
        r = server.client.post(f"/jobs/{first['id']}/cancel", json={})
    else:
        r = server.client.post("/jobs/bulk", json={"action": "cancel", "ids": [first["id"]]})
    assert r.status_code == 200, r.text
    assert {"q"} in woken  # woken by the cancel itself, not by a presence renewal's look
    [claimed] = answer()
    assert claimed["id"] == second["id"]


def free_the_slot(server: LiveServer, how: str, job: dict[str, Any]) -> None:
    """End a running job in one of the ways that free its slot under a concurrency limit."""
    token = {"claim_token": job["claim_token"]}
    if how == "complete":
        r = server.client.post(f"/jobs/{job['id']}/complete", json=token)
    elif how == "fail with retry":
        r = server.client.post(f"/jobs/{job['id']}/fail", json={**token, "error": "boom", "retry_in_seconds": 3600})
    elif how == "fail for good":
        r = server.client.post(f"/jobs/{job['id']}/fail", json={**token, "error": "boom", "retry": False})
    elif how == "release with delay":
        r = server.client.post(f"/jobs/{job['id']}/release", json={**token, "delay_seconds": 3600})
    elif how == "cancel":
        r = server.client.post(f"/jobs/{job['id']}/cancel", json={})
    else:
        r = server.client.post("/jobs/bulk", json={"action": "cancel", "ids": [job["id"]]})
    assert r.status_code == 200, r.text


FREEING = ["complete", "fail with retry", "fail for good", "release with delay", "cancel", "bulk cancel"]


@pytest.mark.parametrize("cached", [True, False])
@pytest.mark.parametrize("how", FREEING)
def test_a_freed_slot_wakes_a_claim_waiting_here(server_factory: Any, how: str, cached: bool) -> None:
    """A slot freed under `concurrency: 1` wakes the claim waiting for it, also when the process's cached
    configuration is gone meanwhile (its listener reconnected, or the entry aged out between two looks)."""
    server: LiveServer = server_factory(poll_interval_seconds=60)  # no fallback poll within the wait
    configure(server, concurrency=1)
    server.enqueue(payload=1)
    second = server.enqueue(payload=2)
    first = server.claim_one()
    answer = server.claim_in_background(wait_seconds=20)
    settle_long_poll(server)
    if not cached:
        server.services.configs.invalidate()  # as after a listener reconnect
    woken = record_wakeups(server)
    free_the_slot(server, how, first)
    assert {"q"} in woken  # woken by the write itself, not by a presence renewal's look
    [claimed] = answer()
    assert claimed["id"] == second["id"]


@pytest.mark.parametrize("how", FREEING)
def test_a_slot_freed_through_another_process_wakes_a_claim_waiting_here(server_factory, how: str) -> None:  # type: ignore[no-untyped-def]
    """A claim waits on one replica; the running job ends through another that never read the queue's
    configuration: the wake-up still reaches the waiting claim."""
    waiter: LiveServer = server_factory(poll_interval_seconds=60)
    other: LiveServer = server_factory(poll_interval_seconds=60)
    configure(waiter, concurrency=1)
    waiter.enqueue(payload=1)
    second = waiter.enqueue(payload=2)
    first = waiter.claim_one()
    answer = waiter.claim_in_background(wait_seconds=20)
    settle_long_poll(waiter)
    wait_until(lambda: other.services.wakeups.remote_waiters("q"), what="the other process to hear of the waiter")
    assert other.services.configs.cached("q") is None
    woken = record_wakeups(other)
    free_the_slot(other, how, first)
    assert {"q"} in woken
    [claimed] = answer()
    assert claimed["id"] == second["id"]


@pytest.mark.parametrize("limit", ["rate", "group_rate"])
def test_a_claim_left_waiting_by_the_statement_that_filled_the_rate_window_is_woken_when_it_frees(
    server_factory: Any, monkeypatch: pytest.MonkeyPatch, limit: str
) -> None:
    """One statement serves two waiting claims under `rate: 1 per 1 s`: the first takes the window's only
    claim, the second stays parked; the window freeing up wakes it (no other look comes: no presence
    renewal, no fallback poll within the wait)."""
    monkeypatch.setattr("app.maintenance.listener.RENEW_INTERVAL", 3600.0)
    server: LiveServer = server_factory(poll_interval_seconds=60)
    configure(server, **{limit: {"limit": 1, "per_seconds": 1}})
    first = server.claim_in_background(wait_seconds=20)
    settle_long_poll(server)
    second = server.claim_in_background(wait_seconds=20)
    wait_until(lambda: server.services.dispatcher.parked == 2, what="both claims waiting")
    jobs = [{"payload": 1, "group": "g"}, {"payload": 2, "group": "g"}]
    r = server.client.post("/queues/q/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201, r.text
    got = first() + second()
    assert sorted(j["payload"] for j in got) == [1, 2]


def test_fair_rotation_survives_the_queue_falling_idle(server: LiveServer) -> None:
    """A worker claiming one job at a time, with pauses in between (after a wake-up, the process forgets a
    queue nobody waits on at its next fallback poll), still gets the groups in turn, not the first group
    every time."""
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": f"a{n}", "group": "a"} for n in range(3)]})
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": f"b{n}", "group": "b"} for n in range(3)]})
    configure(server, fair=True)
    order = []
    for _ in range(4):
        order.append(server.claim_one()["group"])
        server.enqueue(payload="later", group="a", delay_seconds=3600)  # a wake-up, as enqueues bring
        wait_until(lambda: "q" not in server.services.dispatcher._queues, what="the queue to be forgotten")
    assert order == ["a", "b", "a", "b"]


def test_fair_gives_jobs_without_a_group_one_turn_per_round(server: LiveServer) -> None:
    """Jobs without a group take their turn like one more group: after theirs, the round goes on with the
    groups, rather than starting over at the jobs without a group until none are left."""
    jobs = [{"payload": f"{g}{n}", "group": g} for g in ("a", "b") for n in range(3)] + [
        {"payload": n} for n in range(3)
    ]
    server.client.post("/queues/q/jobs/batch", json={"jobs": jobs})
    configure(server, fair=True)
    order = [server.claim_one()["group"] for _ in range(6)]
    assert order == ["a", "b", None, "a", "b", None]
