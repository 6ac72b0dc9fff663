"""A spread queue read and handled as one queue (app/db/spread_reads.py): its stats, its row in GET /queues, its job
listing, search, redrive, purge, quota, scaling signal, history, metrics and workers add up, or reach, every key
(`q#k`, app/db/spread.py), and no answer names a key. Jobs are enqueued through the API, each batch under the next
key in turn (_round_robin), so that every key holds some. Where and how jobs are stored
and claimed is tests/test_spread.py's."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

from app.db import spread
from tests.support import LiveServer, problem, wait_until
from tests.test_observability import metric
from tests.test_operations import flush
from tests.test_sqs import client


def configure(client: httpx.Client, queue: str = "q", **fields: Any) -> None:
    r = client.patch(f"/queues/{queue}/config", json=fields)
    assert r.status_code == 200, r.text


def enqueue_batches(client: httpx.Client, batches: int, size: int, queue: str = "q", **fields: Any) -> list[int]:
    """Jobs in batches: a spread queue puts each batch under one key, drawn at random."""
    ids: list[int] = []
    for b in range(batches):
        jobs = [{"payload": {"i": b * size + i}, **fields} for i in range(size)]
        r = client.post(f"/queues/{queue}/jobs/batch", json={"jobs": jobs})
        assert r.status_code == 201, r.text
        ids += [j["id"] for j in r.json()["jobs"]]
    return ids


def by_key(db: psycopg.Connection, queue: str = "q") -> Counter[tuple[str, str]]:
    """(stored name, status) -> jobs, of the queue and its keys."""
    rows = db.execute(
        "SELECT queue_name, status::text, count(*) FROM jobq.jobs WHERE split_part(queue_name, '#', 1) = %s"
        " GROUP BY 1, 2",
        (queue,),
    ).fetchall()
    return Counter({(name, status): n for name, status, n in rows})


@pytest.fixture(autouse=True)
def _round_robin(monkeypatch: pytest.MonkeyPatch) -> None:
    """An enqueue draws its key at random (app/db/spread.py spread_key): here in turn instead, so that every key
    holds jobs whatever the draws (the service runs in this process). The same on Citus, where a job never changes
    key (its distribution column cannot be updated)."""
    turn = itertools.count()
    monkeypatch.setattr(spread, "randrange", lambda n: next(turn) % n)


def spread_over_keys(db: psycopg.Connection, keys: int = 3) -> None:
    """Every key of the queue holds jobs."""
    names = {name for name, _ in by_key(db)}
    assert len(names) == keys, names


def statuses(db: psycopg.Connection) -> Counter[str]:
    out: Counter[str] = Counter()
    for (_, status), n in by_key(db).items():
        out[status] += n
    return out


def test_stats_add_up_every_key(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=3)
    enqueue_batches(server.client, 12, 3)
    enqueue_batches(server.client, 6, 1, delay_seconds=3600)  # scheduled
    spread_over_keys(db)
    # The oldest ready job, under a key of its own (not the queue's own name).
    db.execute(
        "UPDATE jobq.jobs SET run_at = now() - interval '90 seconds'"
        " WHERE id = (SELECT min(id) FROM jobq.jobs WHERE queue_name = 'q#2' AND run_at <= now())"
    )
    claims = server.claim(limit=14)
    assert len(claims) == 14
    for c in claims[:6]:
        r = server.client.post(f"/jobs/{c['id']}/complete", json={"claim_token": c["claim_token"]})
        assert r.status_code == 200, r.text
    for c in claims[6:9]:
        r = server.client.post(
            f"/jobs/{c['id']}/fail", json={"claim_token": c["claim_token"], "error": "boom", "retry": False}
        )
        assert r.status_code == 200, r.text
    assert server.client.post(f"/jobs/{claims[9]['id']}/cancel").status_code == 200
    flush(server)
    truth = statuses(db)
    assert truth["completed"] == 6
    r = server.client.get("/queues/q/stats")
    assert r.status_code == 200, r.text
    doc = r.json()
    counts = doc["counts"]
    assert counts["ready"] == 36 - 14 and counts["scheduled"] == 6
    for status in ("running", "completed", "failed", "cancelled"):
        assert counts[status] == truth[status], (status, counts, truth)
    assert counts["pending"] == truth["pending"]
    assert doc["oldest_ready_age_seconds"] >= 89
    window = doc["window"]
    assert window["enqueued"] == 42 and window["claimed"] == 14 and window["completed"] == 6
    assert window["duration"]["count"] == 6 and window["duration"]["p50_ms"] is not None
    assert doc["queue"] == "q" and "#" not in json.dumps(doc)


def test_the_queue_list_shows_a_spread_queue_once_with_every_keys_counts(
    server_factory: Any, db: psycopg.Connection
) -> None:
    server: LiveServer = server_factory(gauges_interval_seconds=1)
    configure(server.client, spread=3)
    enqueue_batches(server.client, 10, 2)
    for other in ("a", "q-x", "q0", "r"):  # names on either side of q's keys, in C order and any other
        server.enqueue(queue=other, payload=1)
    spread_over_keys(db)
    done = server.claim_one()
    assert (
        server.client.post(f"/jobs/{done['id']}/complete", json={"claim_token": done["claim_token"]}).status_code == 200
    )
    running = server.claim(limit=3)
    assert len(running) == 3
    for limit in (1, 2, 5, 100):
        seen: list[dict[str, Any]] = []
        cursor = None
        while True:
            r = server.client.get("/queues", params={"limit": limit, **({"cursor": cursor} if cursor else {})})
            assert r.status_code == 200, r.text
            page = r.json()
            assert len(page["queues"]) == limit or page["next_cursor"] is None, (limit, page)
            seen += page["queues"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert [q["queue"] for q in seen] == ["a", "q", "q-x", "q0", "r"], (limit, seen)
        q = next(q for q in seen if q["queue"] == "q")
        assert q["counts"]["ready"] == 16 and q["counts"]["running"] == 3 and q["counts"]["completed"] == 1, q
    # The depth gauges read the same pages: one series for the queue, holding every key's jobs.
    wait_until(lambda: metric(server.client.get("/metrics").text, "jobq_queue_ready_jobs", queue="q") == 16)
    text = server.client.get("/metrics").text
    assert metric(text, "jobq_queue_running_jobs", queue="q") == 3
    assert 'queue="q#' not in text


def test_the_job_listing_pages_through_every_key_in_its_order(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=3)
    for p in (0, 2, 1, 2, 0, 1):
        enqueue_batches(server.client, 3, 2, priority=p)
    spread_over_keys(db)
    rows = db.execute(
        "SELECT id, priority, run_at FROM jobq.jobs WHERE split_part(queue_name, '#', 1) = 'q'"
    ).fetchall()
    by_id = sorted((r[0] for r in rows), reverse=True)
    claim_order = [r[0] for r in sorted(rows, key=lambda r: (-r[1], r[2], r[0]))]

    def listed(status: str | None, limit: int) -> list[int]:
        out: list[int] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": limit}
            if status:
                params["status"] = status
            if cursor:
                params["cursor"] = cursor
            r = server.client.get("/queues/q/jobs", params=params)
            assert r.status_code == 200, r.text
            page = r.json()
            assert {j["queue"] for j in page["jobs"]} <= {"q"}
            out += [j["id"] for j in page["jobs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                return out

    for limit in (1, 4, 7, 100):
        assert listed(None, limit) == by_id, limit  # every job of every key once, newest first
        assert listed("pending", limit) == claim_order, limit  # the pending listing's order across keys


def test_search_in_a_spread_queue_walks_every_key_and_pages_through_them(
    server_factory: Any, db: psycopg.Connection
) -> None:
    server: LiveServer = server_factory(search_scan_rows=100)  # 33 jobs per key per page: pages stop part-way
    configure(server.client, spread=3)
    ids = []
    for b in range(15):
        jobs = [{"payload": {"tag": "x" if (b * 10 + i) % 23 == 0 else "y"}} for i in range(10)]
        r = server.client.post("/queues/q/jobs/batch", json={"jobs": jobs})
        assert r.status_code == 201, r.text
        ids += [(j["id"], (b * 10 + i) % 23 == 0) for i, j in enumerate(r.json()["jobs"])]
    spread_over_keys(db)
    tagged = sorted((i for i, t in ids if t), reverse=True)  # newest first
    in_claim_order = [  # the pending listing's order
        r[0]
        for r in db.execute(
            "SELECT id FROM jobq.jobs WHERE id = ANY(%s) ORDER BY priority DESC, run_at, id", (tagged,)
        ).fetchall()
    ]
    for body, expected in (
        ({"payload_contains": {"tag": "x"}}, tagged),
        ({"payload_contains": {"tag": "x"}, "status": "pending"}, in_claim_order),
    ):
        found: list[int] = []
        partial = False
        cursor = None
        while True:
            r = server.client.post(
                "/jobs/search", json={"queue": "q", "limit": 5, **body, **({"cursor": cursor} if cursor else {})}
            )
            assert r.status_code == 200, r.text
            page = r.json()
            assert page["examined"] <= 100
            partial = partial or page["partial"]
            found += [j["id"] for j in page["jobs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert partial  # the walks did stop at their budget on the way
        assert found == expected, body  # each match once, in order, from every key
    # By id: a job under any key.
    row = db.execute("SELECT id FROM jobq.jobs WHERE queue_name = 'q#2' ORDER BY id LIMIT 1").fetchone()
    assert row is not None
    some = row[0]
    r = server.client.post("/jobs/search", json={"queue": "q", "id": some})
    assert [j["id"] for j in r.json()["jobs"]] == [some], r.text


def test_redrive_moves_the_failed_jobs_of_every_key(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=3)
    enqueue_batches(server.client, 12, 1, max_attempts=1)
    spread_over_keys(db)
    for c in server.claim(limit=12):
        r = server.client.post(f"/jobs/{c['id']}/fail", json={"claim_token": c["claim_token"], "error": "boom"})
        assert r.status_code == 200, r.text
    assert statuses(db)["failed"] == 12
    r = server.client.post("/queues/q/redrive", json={"dry_run": True})
    assert r.status_code == 200 and r.json()["jobs"] == 12, r.text
    r = server.client.post("/queues/q/redrive", json={"limit": 5})
    assert r.json() == {"queue": "q", "dry_run": False, "jobs": 5}, r.text
    assert statuses(db) == Counter({"failed": 7, "pending": 5})
    assert server.client.post("/queues/q/redrive", json={}).json()["jobs"] == 7
    assert statuses(db) == Counter({"pending": 12})
    counts = server.client.get("/queues/q/stats").json()["counts"]
    assert counts["failed"] == 0 and counts["ready"] == 12, counts


def test_max_pending_counts_the_jobs_of_every_key(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=3, max_pending=10)
    # Jobs this process did not admit (another process's, or SQL's): only a count of the keys sees them.
    db.execute(
        "INSERT INTO jobq.jobs (queue_name, payload) SELECT 'q#' || (1 + g % 2), '1' FROM generate_series(1, 10) g"
    )
    problem(server.client.post("/queues/q/jobs", json={"payload": 1}), 429, "queue-full")
    db.execute("DELETE FROM jobq.jobs WHERE queue_name = 'q#2'")
    wait_until(lambda: server.client.post("/queues/q/jobs", json={"payload": 2}).status_code == 201)


def test_scale_adds_up_every_key(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=3)
    enqueue_batches(server.client, 12, 2)
    spread_over_keys(db)
    server.claim(limit=4)
    r = server.client.get("/queues/q/scale")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["queue"] == "q" and doc["ready"] == 20 and doc["claimable"] == 20 and doc["running"] == 4, doc
    configure(server.client, spread=2)  # lowered: the key above still holds jobs, and still counts
    assert server.client.get("/queues/q/scale").json()["ready"] == 20
    assert server.client.post("/queues/q/pause").status_code == 200
    doc = server.client.get("/queues/q/scale").json()
    assert doc["claimable"] == 0 and doc["held_by"] == ["paused"] and doc["ready"] == 20, doc


def test_history_and_sparklines_add_up_every_key(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=3)
    server.enqueue(queue="other", payload=1)
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    for name, n, histogram in (("q", 3, [1, 0]), ("q#1", 4, [0, 2]), ("q#2", 5, [0, 1])):
        db.execute(
            "INSERT INTO jobq.queue_stats (queue_name, minute, enqueued, completed, durations_ms, duration_max_ms)"
            " VALUES (%s, %s, %s, %s, %s, 20)",
            (name, minute, n, sum(histogram), histogram),
        )
    flush(server)
    r = server.client.get("/queues/q/stats/series", params={"range": "hour"})
    assert r.status_code == 200, r.text
    points = r.json()["points"]
    assert sum(p["enqueued"] for p in points) == 12 and sum(p["completed"] for p in points) == 4
    assert any(p["p50_ms"] is not None for p in points)
    r = server.client.get("/stats/sparklines", params={"range": "hour"})
    assert r.status_code == 200, r.text
    lines = {line["queue"]: line for line in r.json()["queues"]}
    assert set(lines) == {"q", "other"}, lines
    assert sum(lines["q"]["enqueued"]) == 12


def test_workers_and_explain_name_the_queue_not_its_keys(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=3)
    enqueue_batches(server.client, 12, 1)
    spread_over_keys(db)
    claims = server.claim(worker="w1", limit=12)
    c = claims[0]
    r = server.client.post(
        f"/jobs/{c['id']}/fail", json={"claim_token": c["claim_token"], "error": "boom", "retry": False}
    )
    assert r.status_code == 200
    server.run(server.services.maintenance["workers"].run_once)
    r = server.client.get("/workers")
    assert r.status_code == 200, r.text
    (worker,) = [w for w in r.json()["workers"] if w["name"] == "w1"]
    assert worker["queues"] == ["q"], worker
    detail = server.client.get("/workers/w1").json()
    assert {j["queue"] for j in detail["jobs"]} == {"q"} and len(detail["jobs"]) == 11, detail
    keyed = db.execute("SELECT id FROM jobq.jobs WHERE queue_name = 'q#1' LIMIT 1").fetchone()
    assert keyed is not None
    r = server.client.get(f"/jobs/{keyed[0]}/explain")
    assert r.status_code == 200 and r.json()["queue"] == "q", r.text


def test_an_sqs_purge_and_its_counts_reach_every_key(server: LiveServer, db: psycopg.Connection) -> None:
    configure(server.client, spread=3)
    enqueue_batches(server.client, 12, 2)
    spread_over_keys(db)
    sqs = client(server)
    try:
        url = sqs.get_queue_url(QueueName="q")["QueueUrl"]
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
        assert attrs["ApproximateNumberOfMessages"] == "24", attrs
        assert [u.rsplit("/", 1)[-1] for u in sqs.list_queues()["QueueUrls"]] == ["q"]
        sqs.purge_queue(QueueUrl=url)
    finally:
        sqs.close()
    assert statuses(db) == Counter({"cancelled": 24})
    assert server.client.get("/queues/q/stats").json()["counts"]["cancelled"] == 24
