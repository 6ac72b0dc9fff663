"""A queue spread over several distribution keys (app/db/spread.py, docs/scale-out.md): where its jobs are stored,
how a claim takes them, what its configuration refuses, and that a worker, a key's scope and a pause see one queue.
The reads that add the keys up (stats, listings, metrics) are tests/test_spread_reads.py's. On Citus
(JOBQ_TEST_CITUS_URL) the same tests run, and one more checks that the keys land on several nodes."""

from __future__ import annotations

import concurrent.futures
import itertools
import os
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from app.db import claim as store_claim
from app.db import spread
from app.errors import DatabaseUnavailable
from tests import citus
from tests.support import LiveServer, problem, record_wakeups, settle_long_poll
from tests.test_security import admin, as_key, create_key, secured  # noqa: F401  (fixtures)
from tests.test_sqs import client as sqs_client


def configure(client: httpx.Client, queue: str = "q", **fields: Any) -> dict[str, Any]:
    r = client.patch(f"/queues/{queue}/config", json=fields)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def stored(db: psycopg.Connection, status: str | None = None) -> Counter[str]:
    """Jobs per stored name (a key), of every queue."""
    rows = db.execute(
        "SELECT queue_name, count(*) FROM jobq.jobs WHERE %(s)s::text IS NULL OR status::text = %(s)s GROUP BY 1",
        {"s": status},
    ).fetchall()
    return Counter({name: n for name, n in rows})


def enqueue_many(client: httpx.Client, n: int, queue: str = "q", **fields: Any) -> list[int]:
    ids = []
    for i in range(n):
        r = client.post(f"/queues/{queue}/jobs", json={"payload": {"i": i}, **fields})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return ids


def test_a_spread_queue_stores_new_jobs_under_every_key_and_a_claim_takes_them_all(
    server: LiveServer, db: psycopg.Connection
) -> None:
    assert configure(server.client, spread=3)["spread"] == 3
    ids = enqueue_many(server.client, 60)
    batch = server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(20)]})
    assert batch.status_code == 201, batch.text
    ids += [j["id"] for j in batch.json()["jobs"]]
    where = stored(db)
    assert set(where) == {"q", "q#1", "q#2"}, where  # 61 random draws: each key gets some (p of a miss < 1e-10)
    assert where.total() == 80
    assert {r["queue"] for r in (server.client.get(f"/jobs/{i}").json() for i in ids[:5])} == {"q"}
    # Claims of 7 take from every key in turn until none is left: every job once, each document naming the queue.
    claimed: list[dict[str, Any]] = []
    while True:
        r = server.client.post("/queues/q/claim", json={"worker": "w", "limit": 7})
        assert r.status_code == 200, r.text
        jobs = r.json()["jobs"]
        if not jobs:
            break
        assert len(jobs) == 7 or len(claimed) + len(jobs) == 80  # a key ran dry: the claim took from the next
        claimed += jobs
    assert sorted(j["id"] for j in claimed) == sorted(ids)
    assert {j["queue"] for j in claimed} == {"q"}
    # The tokens find their jobs under whichever key: complete one at a time and in batches.
    for j in claimed[:10]:
        r = server.client.post(f"/jobs/{j['id']}/complete", json={"claim_token": j["claim_token"], "result": 1})
        assert r.status_code == 200 and r.json()["queue"] == "q", r.text
    r = server.client.post(
        "/jobs/complete", json={"jobs": [{"id": j["id"], "claim_token": j["claim_token"]} for j in claimed[10:]]}
    )
    assert {o["outcome"] for o in r.json()["results"]} == {"completed"}, r.text
    assert stored(db, "completed").total() == 80 and stored(db, "running").total() == 0


def complete(server: LiveServer, job: dict[str, Any]) -> None:
    r = server.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": job["claim_token"]})
    assert r.status_code == 200, r.text


def settle_change(db: psycopg.Connection, queue: str = "q") -> None:
    """The queue's last configuration change as if made a minute ago: every process's cached copy (at most
    app/core/flow.py CACHE_SECONDS old) has it."""
    db.execute("UPDATE jobq.queue_state SET changed_at = now() - interval '1 minute' WHERE queue_name = %s", (queue,))


@pytest.fixture
def round_robin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys in turn instead of at random (app/db/spread.py spread_key; the service runs in this process): every key
    holds jobs whatever the draws."""
    turn = itertools.count()
    monkeypatch.setattr(spread, "randrange", lambda n: next(turn) % n)


@pytest.mark.usefixtures("round_robin")
def test_heartbeat_fail_and_release_work_under_any_key(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=4, max_attempts=3)
    enqueue_many(server.client, 40)
    jobs = server.client.post("/queues/q/claim", json={"worker": "w", "limit": 40}).json()["jobs"]
    assert len(jobs) == 40 and len({j["claim_token"][43:] for j in jobs}) == 4  # tokens name the four keys
    for j in jobs:
        body = {"claim_token": j["claim_token"]}
        assert server.client.post(f"/jobs/{j['id']}/heartbeat", json=body).status_code == 200
    for j in jobs[:20]:
        r = server.client.post(f"/jobs/{j['id']}/fail", json={"claim_token": j["claim_token"], "error": "x"})
        assert r.status_code == 200 and r.json()["status"] in ("pending", "failed"), r.text
    for j in jobs[20:]:
        r = server.client.post(f"/jobs/{j['id']}/release", json={"claim_token": j["claim_token"]})
        assert r.status_code == 200 and r.json()["queue"] == "q", r.text
    assert stored(db, "running").total() == 0
    # Each job stayed under the key it was enqueued under.
    assert stored(db).total() == 40 and len(stored(db)) == 4


def test_keyed_jobs_live_under_key_0_so_their_keys_stay_one_of_a_kind(
    server: LiveServer, db: psycopg.Connection
) -> None:
    configure(server.client, spread=8)
    first = [server.client.post("/queues/q/jobs", json={"payload": i, "idempotency_key": f"k{i}"}) for i in range(16)]
    again = [server.client.post("/queues/q/jobs", json={"payload": i, "idempotency_key": f"k{i}"}) for i in range(16)]
    assert [r.json()["id"] for r in first] == [r.json()["id"] for r in again]
    assert {r.status_code for r in again} == {200}
    unique = [
        server.client.post("/queues/q/jobs", json={"payload": 1, "unique": {"key": "u", "for_seconds": 60}})
        for _ in range(6)
    ]
    assert len({r.json()["id"] for r in unique}) == 1
    debounced = [
        server.client.post("/queues/q/jobs", json={"payload": i, "debounce": {"key": "d", "seconds": 60}})
        for i in range(4)
    ]
    assert len({r.json()["id"] for r in debounced}) == 1
    assert stored(db) == Counter({"q": 18})


def test_a_batch_goes_under_one_key(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=5)
    for _ in range(6):
        r = server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(10)]})
        assert r.status_code == 201, r.text
        ids = [j["id"] for j in r.json()["jobs"]]
        names = db.execute("SELECT DISTINCT queue_name FROM jobq.jobs WHERE id = ANY(%s)", (ids,)).fetchall()
        assert len(names) == 1


@pytest.mark.parametrize(
    "limit",
    [
        {"concurrency": 2},
        {"rate": {"limit": 5, "per_seconds": 1}},
        {"group_concurrency": 1},
        {"group_rate": {"limit": 5, "per_seconds": 1}},
        {"fair": True},
        {"ordered": True},
    ],
    ids=lambda d: next(iter(d)),
)
def test_settings_that_need_one_key_are_refused_on_a_spread_queue_and_the_reverse(
    server: LiveServer, db: psycopg.Connection, limit: dict[str, Any]
) -> None:
    configure(server.client, spread=2)
    [field] = limit
    r = server.client.patch("/queues/q/config", json=limit)
    body = problem(r, 422, "validation-error")
    assert field in r.text and "spread" in r.text, body
    assert server.client.get("/queues/q/config").json()[field] is None
    # Both in one request: refused too. With spread back to 1, refused while key 1 may still get jobs from a
    # process that has not heard of the change; taken once that change is older than any cached configuration.
    problem(server.client.patch("/queues/q2/config", json={**limit, "spread": 3}), 422, "validation-error")
    configure(server.client, "q", spread=1)
    problem(server.client.patch("/queues/q/config", json=limit), 422, "validation-error")
    settle_change(db)
    configure(server.client, "q", **limit)
    assert db.execute("SELECT keys_used FROM jobq.queue_state WHERE queue_name = 'q'").fetchone() == (1,)
    problem(server.client.patch("/queues/q/config", json={"spread": 2}), 422, "validation-error")
    for bad in (0, 65, "2", 1.5, True):
        problem(server.client.patch("/queues/q3/config", json={"spread": bad}), 422, "validation-error")


def test_settings_that_hold_across_keys_are_copied_to_every_key(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, max_attempts=7, lease_seconds=45, default_priority=3)
    configure(server.client, spread=3)
    configure(server.client, retention={"completed": 60}, timeout_seconds=30)
    rows = db.execute(
        "SELECT queue_name, max_attempts, lease_seconds, default_priority, retention_completed_seconds, timeout_seconds"
        " FROM jobq.queue_state WHERE queue_name LIKE 'q%%' ORDER BY 1"
    ).fetchall()
    assert rows == [(name, 7, 45, 3, 60, 30) for name in ("q", "q#1", "q#2")]
    enqueue_many(server.client, 12)
    jobs = server.client.post("/queues/q/claim", json={"worker": "w", "limit": 12}).json()["jobs"]
    assert len(jobs) == 12 and {j["max_attempts"] for j in jobs} == {7} and {j["priority"] for j in jobs} == {3}


def test_pause_stops_claims_under_every_key(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=4)
    enqueue_many(server.client, 20)
    assert server.client.post("/queues/q/pause").status_code == 200
    assert server.client.post("/queues/q/claim", json={"worker": "w", "limit": 20}).json()["jobs"] == []
    paused = db.execute("SELECT queue_name, paused FROM jobq.queue_state ORDER BY 1").fetchall()
    assert paused == [("q", True), ("q#1", True), ("q#2", True), ("q#3", True)]
    # A key added while paused starts paused.
    configure(server.client, spread=6)
    assert db.execute("SELECT bool_and(paused), count(*) FROM jobq.queue_state").fetchone() == (True, 6)
    assert server.client.post("/queues/q/resume").status_code == 200
    assert len(server.client.post("/queues/q/claim", json={"worker": "w", "limit": 20}).json()["jobs"]) == 20


@pytest.mark.usefixtures("round_robin")
def test_a_lowered_spread_still_claims_from_the_keys_above_it(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=4)
    enqueue_many(server.client, 40)
    assert configure(server.client, spread=1)["spread"] == 1
    enqueue_many(server.client, 10)
    assert stored(db)["q"] >= 10 and len(stored(db)) == 4
    got = server.client.post("/queues/q/claim", json={"worker": "w", "limit": 50}).json()["jobs"]
    assert len(got) == 50


def test_a_claim_takes_from_the_one_key_with_jobs_in_one_request(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=6)
    # Jobs under key 4 alone (as a lowered spread, or chance, leaves them): the claim walks past the empty keys
    # in the same request rather than answering empty.
    db.execute("INSERT INTO jobq.jobs (queue_name, payload) SELECT 'q#4', '1' FROM generate_series(1, 5)")
    for _ in range(5):
        r = server.client.post("/queues/q/claim", json={"worker": "w"})
        assert len(r.json()["jobs"]) == 1, r.text
    assert server.client.post("/queues/q/claim", json={"worker": "w"}).json()["jobs"] == []


def test_jobs_coming_due_under_any_key_reach_a_waiting_claim(server_factory: Any, db: psycopg.Connection) -> None:
    # No wake-up says a delayed job came due: the fallback poll's look for ready jobs finds it, under every key
    # (here under keys 1 to 3 only, where a look at the queue's own name would never see them).
    server: LiveServer = server_factory(poll_interval_seconds=0.2)
    configure(server.client, spread=4)
    ids = [
        row[0]
        for row in db.execute(
            "INSERT INTO jobq.jobs (queue_name, payload, run_at) SELECT 'q#' || (1 + n % 3), '1', now() + interval '1s'"
            " FROM generate_series(1, 12) n RETURNING id"
        ).fetchall()
    ]
    got: list[int] = []
    while len(got) < 12:
        r = server.client.post("/queues/q/claim", json={"worker": "w", "limit": 12, "wait_seconds": 20})
        jobs = r.json()["jobs"]
        assert jobs, "a claim waited 20 s while jobs were due"
        got += [j["id"] for j in jobs]
    assert sorted(got) == sorted(ids)


@pytest.mark.usefixtures("round_robin")
def test_a_waiting_claim_is_woken_by_a_job_under_any_key(server_factory: Any, db: psycopg.Connection) -> None:
    server: LiveServer = server_factory(poll_interval_seconds=60)
    configure(server.client, spread=4)
    # Park a long-poll, then enqueue one job: under whichever key it lands, its wake-up (which names the key) gets
    # it to the waiting claim, not the fallback poll (60 s away: the claim waits at most 20).
    with httpx.Client(base_url=server.url, timeout=60) as other, concurrent.futures.ThreadPoolExecutor(1) as pool:
        for _ in range(8):
            fut = pool.submit(
                lambda: other.post("/queues/q/claim", json={"worker": "w", "wait_seconds": 20}).json()["jobs"]
            )
            settle_long_poll(server, "q")
            r = server.client.post("/queues/q/jobs", json={"payload": 1})
            assert r.status_code == 201
            [job] = fut.result(timeout=30)
            assert job["id"] == r.json()["id"] and job["queue"] == "q"
    assert len(stored(db)) == 4  # two under each key


def test_a_scoped_key_reaches_the_jobs_of_its_queue_under_every_key(
    secured: LiveServer,  # noqa: F811
    db: psycopg.Connection,
    admin: httpx.Client,  # noqa: F811
) -> None:
    configure(admin, "a", spread=4)
    configure(admin, "b", spread=4)
    enqueue_many(admin, 20, "b")
    theirs = admin.post("/queues/b/claim", json={"worker": "w", "limit": 20}).json()["jobs"]
    with as_key(secured, create_key(db, "a-only", ["consume", "produce"], ["a"])) as c:
        enqueue_many(c, 20, "a")
        mine = c.post("/queues/a/claim", json={"worker": "w", "limit": 20}).json()["jobs"]
        assert len(mine) == 20 and {j["claim_token"][43:] for j in mine} != {mine[0]["claim_token"][43:]}
        for j in mine:
            assert c.post(f"/jobs/{j['id']}/complete", json={"claim_token": j["claim_token"]}).status_code == 200
        for j in theirs:
            problem(c.post(f"/jobs/{j['id']}/complete", json={"claim_token": j["claim_token"]}), 404, "job-not-found")
            problem(c.get(f"/jobs/{j['id']}"), 404, "job-not-found")
        assert c.post("/queues/b/claim", json={"worker": "w"}).status_code == 403


@pytest.mark.skipif(not os.environ.get(citus.URL_VARIABLE), reason=f"a Citus cluster only ({citus.URL_VARIABLE})")
def test_the_keys_are_claimed_on_their_own_shards_on_citus(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=8)
    shards = {
        db.execute("SELECT get_shard_id_for_distribution_column('jobq.jobs', %s::text)", (name,)).fetchone()[0]  # type: ignore[index]
        for name in ["q"] + [f"q#{k}" for k in range(1, 8)]
    }
    assert len(shards) > 1
    nodes = db.execute(
        "SELECT count(DISTINCT nodeport) FROM pg_dist_shard_placement WHERE shardid = ANY(%s)", (list(shards),)
    ).fetchone()[0]  # type: ignore[index]
    assert nodes == 2
    enqueue_many(server.client, 40)
    assert len(server.client.post("/queues/q/claim", json={"worker": "w", "limit": 40}).json()["jobs"]) == 40


def test_jobs_that_wait_for_jobs_under_other_keys_are_released_when_those_finish(
    server: LiveServer, db: psycopg.Connection
) -> None:
    configure(server.client, "p", spread=4)
    parents = enqueue_many(server.client, 12, "p")
    assert len({n for n in stored(db) if n.startswith("p")}) > 1
    child = server.client.post("/queues/c/jobs", json={"payload": 1, "depends_on": parents})
    assert child.status_code == 201 and child.json()["status"] == "waiting", child.text
    # A spread queue's own jobs with depends_on live under key 0, released the same way.
    sibling = server.client.post("/queues/p/jobs", json={"payload": 1, "depends_on": parents[:3]}).json()
    jobs = server.client.post("/queues/p/claim", json={"worker": "w", "limit": 12}).json()["jobs"]
    assert sorted(j["id"] for j in jobs) == sorted(parents)
    for j in jobs[:-1]:
        assert (
            server.client.post(f"/jobs/{j['id']}/complete", json={"claim_token": j["claim_token"]}).status_code == 200
        )
    assert server.client.get(f"/jobs/{child.json()['id']}").json()["status"] == "waiting"
    last = jobs[-1]
    assert (
        server.client.post(f"/jobs/{last['id']}/complete", json={"claim_token": last["claim_token"]}).status_code == 200
    )
    assert server.client.get(f"/jobs/{child.json()['id']}").json()["status"] == "pending"
    assert server.client.get(f"/jobs/{sibling['id']}").json()["status"] == "pending"
    assert db.execute("SELECT queue_name FROM jobq.jobs WHERE id = %s", (sibling["id"],)).fetchone() == ("p",)


@pytest.mark.usefixtures("round_robin")
def test_a_lowered_spread_keeps_its_keys_until_they_are_empty_then_takes_limits(
    server: LiveServer, db: psycopg.Connection
) -> None:
    configure(server.client, spread=4)
    enqueue_many(server.client, 8)
    configure(server.client, spread=1)
    settle_change(db)
    # Keys 1-3 hold jobs: still claimed from, and a limit is refused (it would hold for key 0 alone).
    problem(server.client.patch("/queues/q/config", json={"concurrency": 2}), 422, "validation-error")
    assert db.execute("SELECT keys_used FROM jobq.queue_state WHERE queue_name = 'q'").fetchone() == (4,)
    jobs = server.client.post("/queues/q/claim", json={"worker": "w", "limit": 6}).json()["jobs"]
    for j in jobs:
        assert (
            server.client.post(f"/jobs/{j['id']}/complete", json={"claim_token": j["claim_token"]}).status_code == 200
        )
    assert stored(db, "pending").total() == 2
    problem(server.client.patch("/queues/q/config", json={"concurrency": 2}), 422, "validation-error")
    for j in server.client.post("/queues/q/claim", json={"worker": "w", "limit": 6}).json()["jobs"]:
        assert (
            server.client.post(f"/jobs/{j['id']}/complete", json={"claim_token": j["claim_token"]}).status_code == 200
        )
    settle_change(db)
    assert configure(server.client, concurrency=2)["concurrency"] == 2
    assert db.execute("SELECT keys_used FROM jobq.queue_state WHERE queue_name = 'q'").fetchone() == (1,)
    enqueue_many(server.client, 4)
    assert stored(db, "pending") == Counter({"q": 4})
    assert len(server.client.post("/queues/q/claim", json={"worker": "w", "limit": 4}).json()["jobs"]) == 2


@pytest.mark.usefixtures("round_robin")
def test_a_key_whose_claim_fails_does_not_lose_what_the_other_keys_gave(
    server: LiveServer, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(server.client, spread=3)
    enqueue_many(server.client, 30)
    original = store_claim.jobs_claim

    async def failing(conn: Any, queue: str, slots: Any) -> Any:
        if queue == "q#2":
            raise DatabaseUnavailable("the node holding key 2 is down")
        return await original(conn, queue, slots)

    monkeypatch.setattr(store_claim, "jobs_claim", failing)
    handed: list[int] = []
    for _ in range(6):
        r = server.client.post("/queues/q/claim", json={"worker": "w", "limit": 30})
        if r.status_code == 200:
            handed += [j["id"] for j in r.json()["jobs"]]
        else:
            problem(r, 503, "database-unavailable")
    # Every job that became running was handed to a worker: none is held by a claim that answered an error.
    running = [row[0] for row in db.execute("SELECT id FROM jobq.jobs WHERE status = 'running'").fetchall()]
    assert sorted(running) == sorted(handed) and len(handed) == 20


def test_finishing_jobs_under_a_key_wakes_no_claim_of_a_queue_without_limits(
    server: LiveServer, db: psycopg.Connection
) -> None:
    configure(server.client, spread=3)
    enqueue_many(server.client, 30)
    jobs = server.client.post("/queues/q/claim", json={"worker": "w", "limit": 30}).json()["jobs"]
    woken = record_wakeups(server)
    for j in jobs:
        assert (
            server.client.post(f"/jobs/{j['id']}/complete", json={"claim_token": j["claim_token"]}).status_code == 200
        )
    assert woken == []  # a freed slot matters only under limits, which a spread queue cannot have


@pytest.mark.usefixtures("round_robin")
def test_lapsed_leases_under_every_key_are_rescued_and_claimed_again(
    server: LiveServer, db: psycopg.Connection
) -> None:
    configure(server.client, spread=3, max_attempts=3)
    ids = enqueue_many(server.client, 9)
    assert len(stored(db)) == 3
    first = server.client.post("/queues/q/claim", json={"worker": "w", "limit": 9, "lease_seconds": 60}).json()["jobs"]
    assert len(first) == 9
    far = datetime.now(UTC) + timedelta(hours=1)
    server.run(lambda: server.services.maintenance["rescuer"].run_once(now=far))
    assert stored(db, "pending").total() == 9 and len(stored(db, "pending")) == 3  # each back under its key
    again = server.client.post("/queues/q/claim", json={"worker": "w", "limit": 9}).json()["jobs"]
    assert sorted(j["id"] for j in again) == sorted(ids) and {j["attempts"] for j in again} == {2}
    for j in first:  # the lapsed claims' tokens are stale under every key
        r = server.client.post(f"/jobs/{j['id']}/complete", json={"claim_token": j["claim_token"]})
        assert r.status_code == 409, r.text


@pytest.mark.usefixtures("round_robin")
def test_sqs_receive_and_delete_reach_every_key(server: LiveServer, db: psycopg.Connection) -> None:
    sqs = sqs_client(server)
    try:
        url = sqs.create_queue(QueueName="s")["QueueUrl"]
        configure(server.client, "s", spread=3)
        for i in range(4):  # batches of 3 without attributes, and single messages with attributes
            sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(n), "MessageBody": f"b{i}.{n}"} for n in range(3)])
            attrs = {"k": {"DataType": "String", "StringValue": str(i)}}
            sqs.send_message(QueueUrl=url, MessageBody=f"a{i}", MessageAttributes=attrs)
        assert len({n for n in stored(db) if n.startswith("s")}) == 3
        got: list[dict[str, Any]] = []
        while len(got) < 16:
            batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
            assert batch.get("Messages"), "received nothing while messages waited"
            got += batch["Messages"]
        assert sorted(m["Body"] for m in got) == sorted(
            [f"b{i}.{n}" for i in range(4) for n in range(3)] + [f"a{i}" for i in range(4)]
        )
        assert {m["MessageAttributes"]["k"]["StringValue"] for m in got if "MessageAttributes" in m} == {
            "0",
            "1",
            "2",
            "3",
        }
        for m in got:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    finally:
        sqs.close()
    assert stored(db, "completed").total() == 16 and stored(db, "pending").total() == 0
