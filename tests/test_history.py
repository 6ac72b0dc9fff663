"""The statistics' history behind the dashboard's charts: backlog samples taken once a minute for the whole
cluster, minutes rolled up into hours after a day, and the series and sparklines the API serves."""

from __future__ import annotations

import itertools
import os
import threading
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from app.db.history import HOURS_KEEP_SECONDS
from app.observability.metrics import DURATION_BOUNDS_MS, percentile_ms
from tests import citus
from tests.support import LiveServer, problem
from tests.test_operations import complete, fail, flush
from tests.test_security import as_key, create_key


def db_now(db: psycopg.Connection) -> datetime:
    row = db.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def minute_of(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def series(server: LiveServer, queue: str | None = None, range_: str = "hour") -> dict[str, Any]:
    path = f"/queues/{queue}/stats/series" if queue else "/stats/series"
    r = server.client.get(path, params={"range": range_})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def point_at(doc: dict[str, Any], t: datetime) -> dict[str, Any]:
    """The point of the bucket holding t."""
    found = [p for p in doc["points"] if datetime.fromisoformat(p["at"]) <= t]
    return found[-1]


def histogram(**buckets: int) -> list[int]:
    """A DURATION_BOUNDS_MS histogram: histogram(b100=3) puts 3 completions in the bucket ending at 100 ms."""
    counts = [0] * (len(DURATION_BOUNDS_MS) + 1)
    for name, n in buckets.items():
        counts[DURATION_BOUNDS_MS.index(int(name[1:]))] = n
    return counts


def add_minute(db: psycopg.Connection, queue: str, minute: datetime, **columns: Any) -> None:
    """A per-minute row as the flush and the sampler write them (arranging history without waiting for it)."""
    names = ["queue_name", "minute", *columns]
    db.execute(
        f"INSERT INTO jobq.queue_stats ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})",
        [queue, minute, *columns.values()],
    )


def sample(server: LiveServer, t: datetime) -> Any:
    """One pass of the server's backlog sampler, as if the database clock read t."""
    return server.run(lambda: server.services.maintenance["samples"].run_once(now=t))


# --- the backlog sample -----------------------------------------------------------------------------------


def test_backlog_is_sampled_once_a_minute_for_the_whole_cluster(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    a: LiveServer = server_factory()
    b: LiveServer = server_factory()
    for queue, n in (("mail", 3), ("img", 2)):
        a.client.post(f"/queues/{queue}/jobs/batch", json={"jobs": [{"payload": i} for i in range(n)]})
    a.enqueue("mail", "later", delay_seconds=3600)  # scheduled, not ready: not in the backlog
    # A minute ten minutes ago (the replicas' own sampler only ever samples the current one), when the
    # ready jobs had been due for 50 minutes.
    t = minute_of(db_now(db)) - timedelta(minutes=10)
    db.execute("UPDATE jobq.jobs SET run_at = %s WHERE run_at <= now()", (t - timedelta(minutes=50),))

    results: list[Any] = []
    replicas = [threading.Thread(target=lambda s=s: results.append(sample(s, t))) for s in (a, b) * 2]
    for thread in replicas:
        thread.start()
    for thread in replicas:
        thread.join()
    assert sorted(r.sampled for r in results) == [0, 0, 0, 1]  # one replica took the minute
    assert sum(r.queues for r in results) == 2

    rows = db.execute(
        "SELECT queue_name, ready, round(oldest_ready_seconds) FROM jobq.queue_stats WHERE minute = %s ORDER BY 1", (t,)
    ).fetchall()
    assert rows == [("img", 2, 50 * 60), ("mail", 3, 50 * 60)]
    assert db.execute("SELECT count(*) FROM jobq.stats_samples WHERE minute = %s", (t,)).fetchone() == (1,)

    doc = series(b, "mail")
    assert point_at(doc, t)["ready"] == 3
    assert point_at(doc, t)["oldest_ready_age_seconds"] == 3000
    assert point_at(doc, t - timedelta(minutes=1))["ready"] is None  # not sampled: a gap, not an empty queue
    assert point_at(series(b), t)["ready"] == 5  # every queue


def test_a_sampled_minute_without_ready_jobs_reads_zero(server: LiveServer, db: psycopg.Connection) -> None:
    server.enqueue("q", 1, delay_seconds=3600)
    t = minute_of(db_now(db)) - timedelta(minutes=5)
    assert sample(server, t).sampled == 1
    point = point_at(series(server, "q"), t)
    assert (point["ready"], point["oldest_ready_age_seconds"]) == (0, 0)


# --- series -------------------------------------------------------------------------------------------------


def test_series_of_a_queue_and_of_every_queue(server: LiveServer) -> None:
    server.client.post("/queues/q/jobs/batch", json={"jobs": [{"payload": i, "max_attempts": 1} for i in range(5)]})
    claims = server.claim("q", limit=4)
    for c in claims[:3]:
        assert complete(server, c).status_code == 200
    assert fail(server, claims[3]).status_code == 200
    server.enqueue("r", 1)
    flush(server)

    for range_, buckets, seconds in (("hour", 60, 60), ("day", 96, 900), ("week", 168, 3600)):
        doc = series(server, "q", range_)
        assert (doc["queue"], doc["range"], doc["bucket_seconds"]) == ("q", range_, seconds)
        assert len(doc["points"]) == buckets
        starts = [datetime.fromisoformat(p["at"]) for p in doc["points"]]
        assert starts[0] == datetime.fromisoformat(doc["since"])
        assert all(b - a == timedelta(seconds=seconds) for a, b in itertools.pairwise(starts))
        assert starts[-1] <= datetime.fromisoformat(doc["as_of"]) < starts[-1] + timedelta(seconds=seconds)
        points = doc["points"]
        totals = [sum(p[k] for p in points) for k in ("enqueued", "completed", "failed")]
        assert totals == [5, 3, 1], range_
        assert any(p["p50_ms"] is not None for p in points)
        everything = series(server, None, range_)
        assert everything["queue"] is None
        assert sum(p["enqueued"] for p in everything["points"]) == 6


def test_series_percentiles_come_from_the_bucket_histograms(server: LiveServer, db: psycopg.Connection) -> None:
    now = minute_of(db_now(db))
    fast, slow = histogram(b100=6), histogram(b1000=4)
    t = now - timedelta(minutes=30)
    add_minute(db, "q", t, completed=6, durations_ms=fast, duration_max_ms=90.0)
    add_minute(db, "q", t + timedelta(minutes=1), completed=4, durations_ms=slow, duration_max_ms=900.0)
    by_minute = series(server, "q")
    assert point_at(by_minute, t)["p95_ms"] == percentile_ms(fast, 0.95, 90.0)
    assert point_at(by_minute, t + timedelta(minutes=1))["p50_ms"] == percentile_ms(slow, 0.5, 900.0)
    assert sum(p["p50_ms"] is not None for p in by_minute["points"]) == 2

    # Two minutes of one hour, three hours ago: one bucket of the week, its histograms added up.
    hour = now.replace(minute=0) - timedelta(hours=3)
    add_minute(db, "q", hour + timedelta(minutes=10), completed=6, durations_ms=fast, duration_max_ms=90.0)
    add_minute(db, "q", hour + timedelta(minutes=11), completed=4, durations_ms=slow, duration_max_ms=900.0)
    hourly = point_at(series(server, "q", "week"), hour)
    merged = [a + b for a, b in zip(fast, slow, strict=True)]
    assert hourly["completed"] == 10
    assert (hourly["p50_ms"], hourly["p95_ms"]) == (
        percentile_ms(merged, 0.5, 900.0),
        percentile_ms(merged, 0.95, 900.0),
    )


def test_series_parameters_are_checked(server: LiveServer) -> None:
    for path in ("/stats/series", "/queues/q/stats/series", "/stats/sparklines"):
        problem(server.client.get(path, params={"range": "month"}), 422, "validation-error")
    problem(server.client.get("/queues/bad name/stats/series"), 422, "validation-error")
    assert len(series(server, "never-used")["points"]) == 60  # an unknown queue has an empty history


def test_sparklines_per_queue(server: LiveServer, db: psycopg.Connection) -> None:
    server.client.post("/queues/a/jobs/batch", json={"jobs": [{"payload": i} for i in range(3)]})
    assert complete(server, server.claim_one("a")).status_code == 200
    server.enqueue("b", 1)
    flush(server)
    t = minute_of(db_now(db)) - timedelta(minutes=3)
    db.execute("UPDATE jobq.jobs SET run_at = now() - interval '1 hour' WHERE status = 'pending'")
    assert sample(server, t).sampled == 1

    r = server.client.get("/stats/sparklines")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert (doc["range"], doc["bucket_seconds"]) == ("hour", 60)
    lines = {line["queue"]: line for line in doc["queues"]}
    assert set(lines) == {"a", "b"}
    for line in lines.values():
        assert {len(line[k]) for k in ("enqueued", "completed", "failed", "ready")} == {60}
    assert (sum(lines["a"]["enqueued"]), sum(lines["a"]["completed"]), sum(lines["b"]["enqueued"])) == (3, 1, 1)
    sampled = [i for i, v in enumerate(lines["a"]["ready"]) if v is not None]
    assert len(sampled) >= 1  # t, and the current minute if the replica's own sampler has run
    i = int((t - datetime.fromisoformat(doc["since"])).total_seconds() // 60)
    assert (lines["a"]["ready"][i], lines["b"]["ready"][i]) == (2, 1)


def test_sparklines_are_bounded_to_the_queues_asked_for_and_cached(server: LiveServer) -> None:
    """The dashboard fetched every queue's sparklines (2.2 MB at 3,000 queues) every refresh: an answer names
    only the queues asked for (`queue`, at most 100), or a page of `limit` (`next_cursor`), and a server
    answers the same question again from a cache for 10 s (the buckets are minutes)."""
    for queue in ("a", "b", "c", "d"):
        server.enqueue(queue, 1)
    flush(server)

    def names(**params: Any) -> tuple[list[str], str | None]:
        r = server.client.get("/stats/sparklines", params=params)
        assert r.status_code == 200, r.text
        return [line["queue"] for line in r.json()["queues"]], r.json()["next_cursor"]

    assert names(queue=["d", "b", "nope"]) == (["b", "d"], None)
    first, cursor = names(limit=3)
    assert first == ["a", "b", "c"] and cursor is not None
    assert names(limit=3, cursor=cursor) == (["d"], None)
    assert server.client.get("/stats/sparklines").headers["cache-control"] == "private, max-age=10"
    before = server.client.get("/stats/sparklines", params={"queue": ["a"]}).json()
    server.enqueue("a", 2)  # counted and flushed: the cached answer stands meanwhile
    flush(server)
    assert server.client.get("/stats/sparklines", params={"queue": ["a"]}).json() == before
    assert sum(before["queues"][0]["enqueued"]) == 1
    too_many = [("queue", f"q{i}") for i in range(101)]
    problem(server.client.get("/stats/sparklines", params=too_many), 422, "validation-error")
    problem(server.client.get("/stats/sparklines", params={"queue": "bad name"}), 422, "validation-error")
    problem(server.client.get("/stats/sparklines", params={"cursor": "nope"}), 422, "validation-error")


def test_history_of_a_key_limited_to_some_queues(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(auth="on")
    admin = as_key(server, create_key(db, "root", ["admin"]))
    mine = as_key(server, create_key(db, "team", ["admin"], ["team-*"]))
    for queue, n in (("team-a", 2), ("other", 5)):
        r = admin.post(f"/queues/{queue}/jobs/batch", json={"jobs": [{"payload": i} for i in range(n)]})
        assert r.status_code == 201, r.text
    flush(server)

    def enqueued(client: Any, path: str) -> int:
        r = client.get(path)
        assert r.status_code == 200, r.text
        return sum(p["enqueued"] for p in r.json()["points"])

    assert enqueued(admin, "/stats/series") == 7
    assert enqueued(mine, "/stats/series") == 2
    assert enqueued(mine, "/queues/team-a/stats/series") == 2
    problem(mine.get("/queues/other/stats/series"), 403, "forbidden")
    assert [q["queue"] for q in mine.get("/stats/sparklines").json()["queues"]] == ["team-a"]


# --- roll-up and retention ----------------------------------------------------------------------------------


def test_minutes_older_than_a_day_become_hours_and_still_add_up(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(sweep_batch_size=7)  # several batches per pass
    hour = minute_of(db_now(db)).replace(minute=0) - timedelta(days=2)
    minutes = [hour + timedelta(minutes=m) for m in range(0, 90, 3)]  # 20 in one hour, 10 in the next
    for i, m in enumerate(minutes):
        add_minute(db, "q", m, enqueued=2, completed=1, durations_ms=histogram(b250=1), duration_max_ms=200.0 + i,
                   ready=i)  # fmt: skip
        db.execute("INSERT INTO jobq.stats_samples (minute) VALUES (%s)", (m,))
    before = series(server, "q", "week")

    result = server.run(lambda: server.services.maintenance["retention"].run_once())
    assert result.minutes_rolled_up == 30
    assert db.execute("SELECT count(*) FROM jobq.queue_stats WHERE minute < now() - interval '1 day'").fetchone() == (
        0,
    )
    hours = db.execute(
        "SELECT hour, enqueued, completed, durations_ms[6], duration_max_ms, ready_sum FROM jobq.queue_stats_hourly"
        " ORDER BY hour"
    ).fetchall()
    assert hours == [
        (hour, 40, 20, 20, 219.0, sum(range(20))),
        (hour + timedelta(hours=1), 20, 10, 10, 229.0, sum(range(20, 30))),
    ]
    after = series(server, "q", "week")
    assert [p for p in after["points"] if p["enqueued"]] == [p for p in before["points"] if p["enqueued"]]
    assert point_at(after, hour)["ready"] == pytest.approx(sum(range(20)) / 20)

    # A flush that arrives late for a rolled-up minute is moved by the next pass: the hour stays exact.
    add_minute(db, "q", minutes[0], enqueued=5)
    server.run(lambda: server.services.maintenance["retention"].run_once())
    assert db.execute("SELECT enqueued FROM jobq.queue_stats_hourly WHERE hour = %s", (hour,)).fetchone() == (45,)
    assert point_at(series(server, "q", "week"), hour)["enqueued"] == 45


def test_history_older_than_eight_days_is_deleted(server: LiveServer, db: psycopg.Connection) -> None:
    now = db_now(db)
    old, kept = now - timedelta(seconds=HOURS_KEEP_SECONDS + 3600), now - timedelta(days=6)
    for t in (old, kept):
        db.execute(
            "INSERT INTO jobq.queue_stats_hourly (queue_name, hour, enqueued)"
            " VALUES ('q', date_trunc('hour', %s::timestamptz), 1)",
            (t,),
        )
        db.execute("INSERT INTO jobq.stats_samples (minute) VALUES (date_trunc('minute', %s::timestamptz))", (t,))
    server.run(lambda: server.services.maintenance["retention"].run_once())
    assert db.execute("SELECT count(*) FROM jobq.queue_stats_hourly").fetchone() == (1,)
    assert db.execute("SELECT count(*) FROM jobq.stats_samples WHERE minute < now() - interval '1 day'").fetchone() == (
        1,
    )
    assert sum(p["enqueued"] for p in series(server, "q", "week")["points"]) == 1


@pytest.mark.skipif(
    bool(os.environ.get(citus.URL_VARIABLE)),
    reason="a figure of plain PostgreSQL: on Citus each table is 32 shards on the worker nodes, whose empty "
    "relations alone weigh more than a week of one queue's history",
)
def test_what_a_week_of_history_costs(database_url: str) -> None:
    """A queue busy every minute of a week: a day of minute rows and a week of hour rows. The figure in
    docs/operations.md (History) comes from here (0.98 MB, indexes included); this keeps it honest within
    a factor of two."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO jobq.queue_stats (queue_name, minute, enqueued, claimed, completed, duration_max_ms,
                                        durations_ms, ready, oldest_ready_seconds)
               SELECT 'emails', date_trunc('minute', now()) - make_interval(mins => i), 900, 900, 900, 850.5,
                      ARRAY[0, 3, 40, 200, 300, 250, 80, 20, 5, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0]::bigint[], 120, 2.5
               FROM generate_series(0, 1439) i"""
        )
        conn.execute(
            """INSERT INTO jobq.queue_stats_hourly (queue_name, hour, enqueued, claimed, completed, duration_max_ms,
                                               durations_ms, ready_sum, oldest_ready_seconds)
               SELECT 'emails', date_trunc('hour', now()) - make_interval(hours => 24 + i), 54000, 54000, 54000,
                      900, ARRAY[0, 180, 2400, 12000, 18000, 15000, 4800, 1200, 300, 120, 0, 0, 0, 0, 0, 0, 0, 0,
                                 0]::bigint[],
                      7200, 3.5
               FROM generate_series(0, 167) i"""
        )
        conn.execute("VACUUM ANALYZE jobq.queue_stats, jobq.queue_stats_hourly")
        row = conn.execute(
            "SELECT pg_total_relation_size('jobq.queue_stats'), pg_total_relation_size('jobq.queue_stats_hourly')"
        ).fetchone()
    assert row is not None
    total = row[0] + row[1]
    assert 500_000 < total < 2_000_000, total  # measured: 0.87 MB of minutes, 0.11 MB of hours
