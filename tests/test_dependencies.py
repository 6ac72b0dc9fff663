"""Dependencies between jobs: `depends_on` on enqueue, the `waiting` status, release by the statement that
finishes a parent (in every process, woken at once), cancellation in cascade, and the refusals."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg

from app.auth.keys import new_key
from app.db import finishing
from app.db import keys as store_keys
from app.db.dependencies import Parent, jobs_insert_dependent
from app.db.jobs import NewJob
from tests.support import LiveServer, lock_waiters, problem, record_finishes, record_messages, wait_until


def batch(server: LiveServer, jobs: list[dict[str, Any]], queue: str = "q") -> list[dict[str, Any]]:
    r = server.client.post(f"/queues/{queue}/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201, r.text
    return r.json()["jobs"]  # type: ignore[no-any-return]


def complete(server: LiveServer, claim: dict[str, Any]) -> dict[str, Any]:
    r = server.client.post(f"/jobs/{claim['id']}/complete", json={"claim_token": claim["claim_token"]})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def statuses(server: LiveServer, *jobs: dict[str, Any]) -> list[str]:
    return [server.job(j["id"])["status"] for j in jobs]


def counts(server: LiveServer, queue: str = "q") -> dict[str, int]:
    r = server.client.get(f"/queues/{queue}/stats")
    assert r.status_code == 200, r.text
    return r.json()["counts"]  # type: ignore[no-any-return]


# --- a graph runs in order ------------------------------------------------------------------------------------


def test_a_diamond_runs_in_order_with_two_workers(server: LiveServer) -> None:
    a, b, c, d = batch(
        server,
        [
            {"payload": "a", "ref": "a"},
            {"payload": "b", "ref": "b", "depends_on": ["a"]},
            {"payload": "c", "depends_on": [{"ref": 0}]},
            {"payload": "d", "depends_on": ["b", {"ref": 2}]},
        ],
    )
    assert [j["status"] for j in (a, b, c, d)] == ["pending", "waiting", "waiting", "waiting"]
    assert d["depends_on"] == [b["id"], c["id"]] and d["pending_dependencies"] == 2
    assert d["on_dependency_failure"] == "cancel"
    assert a["depends_on"] is None and a["on_dependency_failure"] is None and a["pending_dependencies"] is None
    assert counts(server)["waiting"] == 3 and counts(server)["ready"] == 1

    log: list[tuple[str, str]] = []  # (event, payload) in the order they happened
    lock = threading.Lock()
    clock = itertools.count()

    def work() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with lock:
                    if sum(e == "completed" for e, _ in log) == 4:
                        return
                r = client.post("/queues/q/claim", json={"worker": "w", "wait_seconds": 0.5})
                for job in r.json()["jobs"]:
                    with lock:
                        log.append(("claimed", job["payload"]))
                    time.sleep(0.05)  # the other worker gets its chance to claim too early
                    with lock:
                        log.append(("completed", job["payload"]))
                        next(clock)
                    done = client.post(f"/jobs/{job['id']}/complete", json={"claim_token": job["claim_token"]})
                    assert done.status_code == 200, done.text

    workers = [threading.Thread(target=work) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(90)
    at = {f"{e} {p}": i for i, (e, p) in enumerate(log)}
    assert len(at) == 8, log
    for parent, child in [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]:
        assert at[f"completed {parent}"] < at[f"claimed {child}"], log
    assert statuses(server, a, b, c, d) == ["completed"] * 4


def test_a_dependant_of_finished_jobs_is_pending_at_once(server: LiveServer) -> None:
    parent = server.enqueue(payload="p")
    complete(server, server.claim_one())
    job = server.enqueue(payload="child", depends_on=[parent["id"]])
    assert job["status"] == "pending" and job["depends_on"] == [parent["id"]]
    assert server.claim_one()["id"] == job["id"]


def test_a_dependant_runs_after_a_parent_in_another_queue(server: LiveServer) -> None:
    parent = server.enqueue("extract", payload="p")
    child = server.enqueue("load", payload="c", depends_on=[parent["id"]], delay_seconds=0)
    assert child["status"] == "waiting"
    assert server.claim("load") == []
    complete(server, server.claim_one("extract"))
    released = server.job(child["id"])
    assert released["status"] == "pending" and released["pending_dependencies"] is None
    assert server.claim_one("load")["id"] == child["id"]


# --- failures cancel, in cascade ------------------------------------------------------------------------------


def test_a_failed_parent_cancels_its_dependants_transitively(server: LiveServer) -> None:
    root, child, grandchild, anyway = batch(
        server,
        [
            {"payload": "root"},
            {"payload": "child", "depends_on": [{"ref": 0}]},
            {"payload": "grandchild", "depends_on": [{"ref": 1}]},
            {"payload": "anyway", "depends_on": [{"ref": 1}], "on_dependency_failure": "run"},
        ],
    )
    claim = server.claim_one()
    assert claim["id"] == root["id"]
    r = server.client.post(
        f"/jobs/{root['id']}/fail", json={"claim_token": claim["claim_token"], "error": "x", "retry": False}
    )
    assert r.status_code == 200 and r.json()["status"] == "failed"
    c, g, a = server.job(child["id"]), server.job(grandchild["id"]), server.job(anyway["id"])
    assert (c["status"], c["last_error"]) == ("cancelled", f"dependency {root['id']} failed")
    assert (g["status"], g["last_error"]) == ("cancelled", f"dependency {child['id']} cancelled")
    assert c["finished_at"] is not None
    # on_dependency_failure=run: its parent (child) was cancelled, so it counts as done and the job runs.
    assert a["status"] == "pending" and a["on_dependency_failure"] == "run"
    assert server.claim_one()["id"] == anyway["id"]
    got = counts(server)
    assert (got["cancelled"], got["failed"], got["waiting"], got["running"]) == (2, 1, 0, 1)


def test_a_retried_fail_is_no_failure_of_the_dependency(server: LiveServer) -> None:
    parent = server.enqueue(payload="p", max_attempts=2)
    child = server.enqueue(payload="c", depends_on=[parent["id"]])
    claim = server.claim_one()
    r = server.client.post(
        f"/jobs/{parent['id']}/fail", json={"claim_token": claim["claim_token"], "error": "x", "retry_in_seconds": 0}
    )
    assert r.json()["status"] == "pending"
    assert server.job(child["id"])["status"] == "waiting"
    complete(server, server.claim_one())
    assert server.job(child["id"])["status"] == "pending"


def test_a_cancelled_parent_cancels_its_dependants_and_a_waiting_job_can_be_cancelled(server: LiveServer) -> None:
    root, middle, leaf, other = batch(
        server,
        [
            {"payload": "root"},
            {"payload": "middle", "depends_on": [{"ref": 0}]},
            {"payload": "leaf", "depends_on": [{"ref": 1}]},
            {"payload": "other", "depends_on": [{"ref": 0}]},
        ],
    )
    # A waiting job can be cancelled; its own dependants go with it, the rest of the graph stays.
    r = server.client.post(f"/jobs/{middle['id']}/cancel", json={})
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert statuses(server, root, middle, leaf, other) == ["pending", "cancelled", "cancelled", "waiting"]
    assert server.job(leaf["id"])["last_error"] == f"dependency {middle['id']} cancelled"
    r = server.client.post(f"/jobs/{root['id']}/cancel", json={})
    assert r.status_code == 200
    assert statuses(server, root, middle, leaf, other) == ["cancelled"] * 4
    assert server.job(other["id"])["last_error"] == f"dependency {root['id']} cancelled"
    assert counts(server)["cancelled"] == 4
    # A cancelled dependant retried runs at once, whatever its dependencies.
    r = server.client.post(f"/jobs/{leaf['id']}/retry")
    assert r.status_code == 200 and r.json()["status"] == "pending"
    assert server.claim_one()["id"] == leaf["id"]


def test_a_dependant_of_a_failed_job_is_cancelled_at_once_or_runs_with_run(server: LiveServer) -> None:
    parent = server.enqueue(payload="p")
    r = server.client.post(f"/jobs/{parent['id']}/cancel", json={})
    assert r.status_code == 200
    cancelled = server.enqueue(payload="c", depends_on=[parent["id"]])
    assert cancelled["status"] == "cancelled" and cancelled["last_error"] == f"dependency {parent['id']} cancelled"
    anyway = server.enqueue(payload="r", depends_on=[parent["id"]], on_dependency_failure="run")
    assert anyway["status"] == "pending"
    # A batch item depending on an item cancelled at birth is cancelled too.
    first, second = batch(
        server, [{"payload": 1, "depends_on": [parent["id"]]}, {"payload": 2, "depends_on": [{"ref": 0}]}]
    )
    assert (first["status"], second["status"]) == ("cancelled", "cancelled")
    assert second["last_error"] == f"dependency {first['id']} cancelled"
    # Two items with one key are one job: an item naming the second is decided by the first's fate.
    keyed, again, third = batch(
        server,
        [
            {"payload": 3, "idempotency_key": "k", "depends_on": [parent["id"]]},
            {"payload": 3, "idempotency_key": "k"},
            {"payload": 4, "depends_on": [{"ref": 1}]},
        ],
    )
    assert again["id"] == keyed["id"] and again["status"] == keyed["status"] == "cancelled"
    assert third["status"] == "cancelled" and third["last_error"] == f"dependency {keyed['id']} cancelled"
    assert counts(server)["cancelled"] == 6


def test_a_cascade_of_two_thousand_is_cancelled_in_the_background(server_factory: Callable[..., LiveServer]) -> None:
    """The cancel answers at once; the chain below the root is cancelled by the release, a step at a time,
    until every job of it is (no statement of it deeper than INLINE_LEVELS levels is in the request)."""
    server = server_factory(max_batch_jobs=2000, max_dependency_depth=2000)
    root = server.enqueue(payload="root")
    chain = batch(server, [{"payload": 0, "depends_on": [root["id"]]}]
                  + [{"payload": i, "depends_on": [{"ref": i - 1}]} for i in range(1, 2000)])  # fmt: skip
    assert counts(server)["waiting"] == 2000
    r = server.client.post(f"/jobs/{root['id']}/cancel", json={})
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    start = time.perf_counter()
    # A level is a few statements, and a step of the background follows ten: about 10 ms a level on a quiet
    # machine, several times that on a loaded one (CI runs beside nothing else, but the deadline is generous).
    wait_until(lambda: counts(server)["cancelled"] == 2001, timeout=240, what="the whole chain cancelled")
    print(f"\n2,000-deep chain cancelled in the background in {time.perf_counter() - start:.1f} s")
    assert counts(server)["waiting"] == 0
    assert server.job(chain[-1]["id"])["last_error"] == f"dependency {chain[-2]['id']} cancelled"


# --- the release, and the race with an enqueue ---------------------------------------------------------------------


def test_ten_thousand_dependants_are_released_after_one_complete(server_factory: Callable[..., LiveServer]) -> None:
    """The complete releases one batch before it answers (claimable at once), the background the rest."""
    server = server_factory(max_batch_jobs=10_000)
    parent = server.enqueue("parent", payload="p")
    batch(server, [{"payload": i, "depends_on": [parent["id"]]} for i in range(10_000)], queue="fan")
    assert counts(server, "fan")["waiting"] == 10_000
    claim = server.claim_one("parent")
    start = time.perf_counter()
    complete(server, claim)
    answered = time.perf_counter()
    assert counts(server, "fan")["ready"] >= server.services.settings.dependency_batch_size
    wait_until(lambda: counts(server, "fan")["ready"] == 10_000, timeout=120, what="every dependant released")
    print(f"\ncomplete of a parent of 10,000 dependants: answered in {(answered - start) * 1000:.0f} ms, "
          f"all released in {(time.perf_counter() - start) * 1000:.0f} ms")  # fmt: skip
    assert counts(server, "fan")["waiting"] == 0
    assert len(server.claim("fan", limit=100)) == 100


def test_the_answer_comes_after_the_first_batch_even_when_the_background_looks_at_once(
    server_factory: Callable[..., LiveServer],
) -> None:
    """The background pass takes any queue's outbox rows (SKIP LOCKED); one that takes a row right after the
    complete commits must not make the request skip its own step and answer before any dependant is
    released: the request waits for that row instead. The background looks every millisecond here, so that it meets
    the request's step often (CI saw it once with the default 1 s)."""
    server = server_factory(dependency_batch_size=10, dependency_interval_seconds=0.001)
    for round_ in range(40):
        parent = server.enqueue("parent", payload=round_)
        batch(server, [{"payload": i, "depends_on": [parent["id"]]} for i in range(11)], queue=f"fan{round_}")
        complete(server, server.claim_one("parent"))
        assert counts(server, f"fan{round_}")["ready"] >= 10, f"round {round_}: answered before the first batch"


def test_a_batch_past_a_statements_chunk_refused_for_depth_writes_nothing(
    server_factory: Callable[..., LiveServer], db: psycopg.Connection
) -> None:
    """A batch with dependencies is one transaction; on Citus its jobs go in by statements of CHUNK (500) rows in
    a savepoint of it (app/db/jobs.py _citus_chunks). One item too deep, found after the insert: nothing stays."""
    server = server_factory(max_dependency_depth=5)
    parent = server.enqueue("q", "parent")["id"]
    jobs: list[dict[str, Any]] = [{"payload": i, "depends_on": [parent]} for i in range(600)]
    for i in range(590, 600):  # a chain at the end: item 599 is 10 deep
        jobs[i]["depends_on"] = [{"ref": i - 1}]
    problem(server.client.post("/queues/q/jobs/batch", json={"jobs": jobs}), 422, "validation-error")
    row = db.execute("SELECT count(*) FROM jobq.jobs").fetchone()
    assert row is not None and row[0] == 1
    del jobs[594:]  # item 593 is 5 deep: at the limit
    r = server.client.post("/queues/q/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201, r.text
    made = r.json()["jobs"]
    assert [j["id"] for j in made] == sorted(j["id"] for j in made) and len(made) == 594
    assert {j["status"] for j in made} == {"waiting"}
    row = db.execute("SELECT count(*) FROM jobq.job_dependencies").fetchone()
    assert row is not None and row[0] == 594


def test_a_dependant_enqueued_while_its_parent_completes_is_released(server: LiveServer, database_url: str) -> None:
    """The enqueue holds the parent's row lock; the complete waits for it, and must then see the new
    dependency (a CTE in the complete statement, on the statement's snapshot, would not)."""
    parent = server.enqueue("a", payload="p")
    claim = server.claim_one("a")

    async def race() -> int:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            async with conn.transaction():
                job = NewJob("b", "1", 0, None, None, 5, None)
                [row] = await jobs_insert_dependent(conn, [job], [[Parent(job_id=parent["id"])]], [None], None)
                assert row.job.status == "waiting"
                completing = asyncio.ensure_future(asyncio.to_thread(complete, server, claim))
                await asyncio.to_thread(blocked_on_a_lock, database_url, "status = 'completed'")
            # committed: the complete goes on, records the parent, and its release finds the dependency
            done = await completing
            assert done["status"] == "completed"
            return row.job.id

    child = asyncio.run(race())
    assert server.job(child)["status"] == "pending"
    assert server.claim_one("b")["id"] == child


def test_dependants_enqueued_around_their_parents_complete_never_wait_forever(server: LiveServer) -> None:
    """Enqueues racing the complete of their parent, in both orders: each dependant ends pending."""
    parents = [server.enqueue("a", payload=i) for i in range(4)]
    claims = server.claim("a", limit=4)
    made: list[dict[str, Any]] = []
    lock = threading.Lock()

    def enqueue(n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            for i in range(25):
                r = c.post("/queues/b/jobs", json={"payload": i, "depends_on": [parents[(n + i) % 4]["id"]]})
                assert r.status_code == 201, r.text
                with lock:
                    made.append(r.json())

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(made) >= 10, what="some dependants enqueued")
    for claim in claims:
        complete(server, claim)
    for t in threads:
        t.join(60)
    assert len(made) == 100
    assert {j["status"] for j in made} <= {"waiting", "pending"}
    got = counts(server, "b")
    assert (got["waiting"], got["ready"]) == (0, 100)


def test_batch_completes_sharing_dependants_in_crossed_order_do_not_deadlock(
    server: LiveServer, database_url: str
) -> None:
    """Two batch completes of (a, b) and (c, d), where x depends on a and d and y on b and c: the release each
    runs takes the dependants of all the jobs it completed in one id order, so one waits for the other
    instead of both failing with a deadlock."""
    a, b, c, d = (server.enqueue("p", payload=i) for i in range(4))
    x = server.enqueue("q", payload="x", depends_on=[a["id"], d["id"]])
    y = server.enqueue("q", payload="y", depends_on=[b["id"], c["id"]])
    z = server.enqueue("q", payload="z", depends_on=[c["id"]])  # after y: held, it stalls c's release
    tokens = {j["id"]: j["claim_token"] for j in server.claim("p", limit=4)}
    answers: dict[str, httpx.Response] = {}

    def complete_many(name: str, *jobs: dict[str, Any]) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            body = {"jobs": [{"id": j["id"], "claim_token": tokens[j["id"]]} for j in jobs]}
            answers[name] = client.post("/jobs/complete", json=body)

    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT FROM jobq.jobs WHERE queue_name = 'q' AND id = %s FOR UPDATE", (z["id"],))
        # (c, d) releases y, then waits for z; (a, b) then takes x and waits for y. Once z is free, the
        # first goes on to x: in the old order, held by the second, which waits for it (a cycle).
        late = threading.Thread(target=complete_many, args=("cd", c, d))
        late.start()
        blocked_on_a_lock(database_url, "j.pending_dependencies > i.n")  # the release's settle (releases.py)
        early = threading.Thread(target=complete_many, args=("ab", a, b))
        early.start()
        wait_until(
            lambda: lock_waiters(holder) == 2,
            what="both completes waiting",
        )
    late.join(60)
    early.join(60)
    for name in ("ab", "cd"):
        assert answers[name].status_code == 200, answers[name].text
        assert [o["outcome"] for o in answers[name].json()["results"]] == ["completed", "completed"]
    assert statuses(server, x, y, z) == ["pending"] * 3


def test_an_enqueue_after_a_waiting_job_and_a_running_one_does_not_deadlock_with_their_complete(
    server: LiveServer, database_url: str
) -> None:
    """A complete of (b, a) locks b and a, then b's dependant w. An enqueue depending on w and a used to
    lock w (the lower id) and wait for a: a cycle, one of the two failed with 503. The enqueue now waits
    for a busy parent holding none."""
    b = server.enqueue("p", payload="b")
    w = server.enqueue("q", payload="w", depends_on=[b["id"]])
    a = server.enqueue("p", payload="a")
    tokens = {j["id"]: j["claim_token"] for j in server.claim("p", limit=2)}
    answers: dict[str, httpx.Response] = {}

    def post(name: str, path: str, body: dict[str, Any]) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            answers[name] = client.post(path, json=body)

    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT FROM jobq.jobs WHERE queue_name = 'p' AND id = %s FOR UPDATE", (a["id"],))
        body = {"jobs": [{"id": j["id"], "claim_token": tokens[j["id"]]} for j in (b, a)]}
        completing = threading.Thread(target=post, args=("complete", "/jobs/complete", body))
        completing.start()
        blocked_on_a_lock(database_url, "status = 'completed'")
        body = {"payload": "e", "depends_on": [w["id"], a["id"]]}
        enqueueing = threading.Thread(target=post, args=("enqueue", "/queues/q/jobs", body))
        enqueueing.start()
        wait_until(
            lambda: lock_waiters(holder) == 2,
            what="the complete and the enqueue waiting",
        )
    completing.join(60)
    enqueueing.join(60)
    assert answers["complete"].status_code == 200, answers["complete"].text
    assert [o["outcome"] for o in answers["complete"].json()["results"]] == ["completed", "completed"]
    assert answers["enqueue"].status_code == 201, answers["enqueue"].text
    e = answers["enqueue"].json()
    assert (e["status"], e["pending_dependencies"]) == ("waiting", 1)  # w is pending now, not completed
    assert statuses(server, w) == ["pending"]
    complete(server, server.claim_one("q"))  # w
    assert statuses(server, e) == ["pending"]


def test_a_batch_naming_a_keyed_job_and_its_dependant_does_not_deadlock_with_its_complete(
    server: LiveServer, database_url: str
) -> None:
    """A batch whose first item's key names the running job r, and whose second item depends on it and on
    r's dependant w (by id): the enqueue locked w, then waited for r, which a complete held while it
    waited to release w. The enqueue now gives w back before it waits."""
    r = server.enqueue(payload="r", idempotency_key="r")
    w = server.enqueue(payload="w", depends_on=[r["id"]])
    claim = server.claim_one()
    answers: dict[str, httpx.Response] = {}

    def post(name: str, path: str, body: dict[str, Any]) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            answers[name] = client.post(path, json=body)

    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT FROM jobq.jobs WHERE queue_name = 'q' AND id = %s FOR UPDATE", (r["id"],))
        completing = threading.Thread(
            target=post, args=("complete", f"/jobs/{r['id']}/complete", {"claim_token": claim["claim_token"]})
        )
        completing.start()
        blocked_on_a_lock(database_url, "status = 'completed'")
        body = {
            "jobs": [
                {"payload": "r", "idempotency_key": "r", "ref": "r"},
                {"payload": "e", "depends_on": ["r", w["id"]]},
            ]
        }
        enqueueing = threading.Thread(target=post, args=("enqueue", "/queues/q/jobs/batch", body))
        enqueueing.start()
        wait_until(
            lambda: lock_waiters(holder) == 2,
            what="the complete and the enqueue waiting",
        )
    completing.join(60)
    enqueueing.join(60)
    assert answers["complete"].status_code == 200, answers["complete"].text
    assert answers["enqueue"].status_code == 201, answers["enqueue"].text
    again, e = answers["enqueue"].json()["jobs"]
    assert again["id"] == r["id"]
    assert (e["status"], e["pending_dependencies"]) == ("waiting", 1)  # r completed, w released
    assert statuses(server, w) == ["pending"]


def blocked_on_a_lock(database_url: str, text: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        wait_until(
            lambda: lock_waiters(conn, text) == 1,
            what="a statement waiting for a row lock",
        )


# --- wake-ups -------------------------------------------------------------------------------------------------------


def test_a_long_poll_on_the_dependants_queue_is_answered_by_the_release(
    server_factory: Callable[..., LiveServer],
) -> None:
    # Two replicas, the fallback poll at 60 s and a 20 s wait: only the release's wake-up, sent by the
    # statement that completes the parent on one replica, can answer the claim parked on the other.
    here, there = server_factory(poll_interval_seconds=60), server_factory(poll_interval_seconds=60)
    wait_until(
        lambda: here.services.wakeups.connected.is_set() and there.services.wakeups.connected.is_set(), what="listening"
    )
    parent = here.enqueue("a", payload="p")
    child = here.enqueue("b", payload="c", depends_on=[parent["id"]])
    answer = there.claim_in_background("b", wait_seconds=20)
    wait_until(lambda: there.services.dispatcher.parked == 1, what="a parked claim")
    # A parked claim is also looked at whenever its presence is renewed (every 2 s), so the answer alone
    # does not show the wake-up: the message from the replica whose release made the job pending does.
    received = record_messages(there)
    complete(here, here.claim_one("a"))
    got = answer()
    assert [j["id"] for j in got] == [child["id"]]
    sender = here.services.wakeups.sender
    wait_until(lambda: any(m.split()[:2] == [sender, "w"] and "b" in m.split()[2:] for m in received), what="wake-up")


def test_a_result_wait_on_a_dependant_answers_when_its_parent_fails(server_factory: Callable[..., LiveServer]) -> None:
    server = server_factory(poll_interval_seconds=60)
    wait_until(server.services.wakeups.connected.is_set, what="listening")
    parent = server.enqueue("a", payload="p")
    child = server.enqueue("b", payload="c", depends_on=[parent["id"]])
    answer: list[httpx.Response] = []

    def wait() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            answer.append(c.get(f"/jobs/{child['id']}", params={"wait_seconds": 20}))

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: server.services.results.parked == 1, what="a waiting request")
    finished = record_finishes(server)
    claim = server.claim_one("a")
    r = server.client.post(
        f"/jobs/{parent['id']}/fail", json={"claim_token": claim["claim_token"], "error": "no", "retry": False}
    )
    assert r.status_code == 200
    thread.join(60)
    assert answer[0].status_code == 200
    assert answer[0].json()["status"] == "cancelled"
    # The release (not a presence renewal's look) woke it: the cancelled dependant went through the seam.
    assert any(child["id"] in ids for ids in finished), finished


# --- refusals --------------------------------------------------------------------------------------------------------


def test_unknown_ids_too_many_and_bad_refs_are_422(server_factory: Callable[..., LiveServer]) -> None:
    server = server_factory(max_dependencies=3)
    parent = server.enqueue(payload="p")

    def refused(path: str, body: dict[str, Any], loc: list[Any]) -> dict[str, Any]:
        got = problem(server.client.post(path, json=body), 422, "validation-error")
        assert got["errors"][0]["loc"][: len(loc)] == loc, got
        return got

    got = refused("/queues/q/jobs", {"payload": 1, "depends_on": [parent["id"], 999_999]}, ["body", "depends_on", 1])
    assert "999999" in got["detail"]
    refused("/queues/q/jobs", {"payload": 1, "depends_on": [1, 2, 3, 4]}, ["body", "depends_on"])
    refused("/queues/q/jobs", {"payload": 1, "depends_on": ["x"]}, ["body", "depends_on", 0])
    refused("/queues/q/jobs", {"payload": 1, "depends_on": [0]}, ["body", "depends_on", 0])
    refused("/queues/q/jobs", {"payload": 1, "on_dependency_failure": "run"}, ["body"])
    refused("/queues/q/jobs", {"payload": 1, "depends_on": [parent["id"]], "on_dependency_failure": "skip"}, ["body"])
    jobs = "/queues/q/jobs/batch"
    refused(
        jobs,
        {"jobs": [{"payload": 1, "depends_on": [{"ref": 1}]}, {"payload": 2}]},
        ["body", "jobs", 0, "depends_on", 0],
    )
    refused(jobs, {"jobs": [{"payload": 1, "depends_on": [{"ref": 0}]}]}, ["body", "jobs", 0, "depends_on", 0])
    refused(
        jobs, {"jobs": [{"payload": 1}, {"payload": 2, "depends_on": ["nope"]}]}, ["body", "jobs", 1, "depends_on", 0]
    )
    refused(jobs, {"jobs": [{"payload": 1, "ref": "a"}, {"payload": 2, "ref": "a"}]}, ["body", "jobs", 1, "ref"])
    refused(jobs, {"jobs": [{"payload": 1, "depends_on": [{"ref": -1}]}]}, ["body", "jobs", 0, "depends_on", 0])
    refused(jobs, {"jobs": [{"payload": 1}, {"payload": 2, "depends_on": [parent["id"], 424_242]}]},
            ["body", "jobs", 1, "depends_on", 1])  # fmt: skip
    # Nothing of a refused batch was inserted, and the parent is as it was.
    assert counts(server)["ready"] == 1 and counts(server)["waiting"] == 0


def test_a_parent_in_a_queue_the_key_may_not_use_is_unknown(
    server_factory: Callable[..., LiveServer], db: psycopg.Connection
) -> None:
    """A key learns nothing about queues it cannot use: a parent there is refused exactly like a missing
    job (422), not with a 403 that would confirm it exists."""
    server = server_factory(auth="on", api_key="admin-key-" + "k" * 40)
    key, selector, key_hash = new_key()
    store_keys.api_key_insert(db, "loader", selector, key_hash, ["produce"], ["load"])
    admin = {"authorization": "Bearer admin-key-" + "k" * 40}
    secret = server.client.post("/queues/secret/jobs", json={"payload": 1}, headers=admin).json()
    mine = server.client.post(
        "/queues/load/jobs", json={"payload": 1}, headers={"authorization": f"Bearer {key}"}
    ).json()
    as_loader = {"authorization": f"Bearer {key}"}
    r = server.client.post("/queues/load/jobs", json={"payload": 2, "depends_on": [secret["id"]]}, headers=as_loader)
    assert problem(r, 422, "validation-error")["errors"][0]["loc"] == ["body", "depends_on", 0]
    r = server.client.post("/queues/load/jobs", json={"payload": 2, "depends_on": [mine["id"]]}, headers=as_loader)
    assert r.status_code == 201 and r.json()["status"] == "waiting"


# --- idempotency, listings ------------------------------------------------------------------------------------------


def test_an_idempotent_repeat_returns_the_job_with_its_dependencies_unchanged(server: LiveServer) -> None:
    a = server.enqueue(payload="a")
    b = server.enqueue(payload="b")
    first = server.enqueue(payload="x", idempotency_key="k", depends_on=[a["id"]])
    r = server.client.post("/queues/q/jobs", json={"payload": "x", "idempotency_key": "k", "depends_on": [b["id"]]})
    assert r.status_code == 200 and r.json()["id"] == first["id"] and r.json()["depends_on"] == [a["id"]]
    # A later item of a batch may depend on the existing job its key names.
    existing, after = batch(
        server, [{"payload": "x", "idempotency_key": "k", "ref": "x"}, {"payload": "y", "depends_on": ["x"]}]
    )
    assert existing["id"] == first["id"] and after["status"] == "waiting"
    complete(server, server.claim_one())  # a
    assert server.job(first["id"])["status"] == "pending"
    jobs = {j["payload"]: j for j in server.claim("q", limit=10)}
    complete(server, {"id": first["id"], "claim_token": jobs["x"]["claim_token"]})
    assert server.job(after["id"])["status"] == "pending"


def test_waiting_jobs_are_listed_and_searched(server: LiveServer) -> None:
    parent = server.enqueue(payload="p")
    waiting = [server.enqueue(payload=i, depends_on=[parent["id"]]) for i in range(3)]
    r = server.client.get("/queues/q/jobs", params={"status": "waiting", "limit": 2})
    assert r.status_code == 200, r.text
    page = r.json()
    assert [j["id"] for j in page["jobs"]] == [waiting[0]["id"], waiting[1]["id"]]
    r = server.client.get("/queues/q/jobs", params={"status": "waiting", "cursor": page["next_cursor"]})
    assert [j["id"] for j in r.json()["jobs"]] == [waiting[2]["id"]]
    queues = {q["queue"]: q for q in server.client.get("/queues").json()["queues"]}
    assert queues["q"]["counts"]["waiting"] == 3
    r = server.client.post("/jobs/search", json={"status": "waiting"})
    assert r.status_code == 200, r.text
    assert sorted(j["id"] for j in r.json()["jobs"]) == sorted(j["id"] for j in waiting)


def test_outbox_records_of_a_settle_go_in_statements_of_bounded_size(database_url: str) -> None:
    """A settle may cancel up to JOBQ_DEPENDENCY_BATCH_SIZE (100,000) dependants at once; a statement takes at
    most 65,535 parameters, so their records go in chunks (finishing.RECORD_CHUNK), every one of them."""
    n = 2 * finishing.RECORD_CHUNK + 1

    async def recorded() -> int:
        connect = psycopg.AsyncConnection.connect(database_url, autocommit=True)
        async with await connect as conn, conn.transaction():
            await finishing.releases_written(conn, "q", [(i, "cancelled") for i in range(1, n + 1)])
            cur = await conn.execute("SELECT count(DISTINCT job_id) FROM jobq.dependency_releases")
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    assert asyncio.run(recorded()) == n
