"""Counts of live jobs past JOBQ_STATS_EXACT_MAX (app/db/live_counts.py): a queue's stats, GET /queues and the
gauges count each kind of live job themselves up to the maximum, and past it answer from the background's count,
marked as estimated and never below what the request saw. A small maximum stands in for a big backlog here; the
reads' bound on a big table is tests/test_plans.py's."""

from __future__ import annotations

import os
from typing import Any

import psycopg

from app.db import live_counts as store_live
from app.errors import StatementTimeout
from tests import citus
from tests.support import LiveServer, wait_until

MAX = 10  # JOBQ_STATS_EXACT_MAX in these tests
# On Citus GET /queues counts every queue's live jobs through every shard (app/db/operations.py
# QUEUES_PAGE_FANOUT): exact, never estimated. The stats are bounded there too.
PAGES_ESTIMATE = not os.environ.get(citus.URL_VARIABLE)


def stats(server: LiveServer, queue: str = "q") -> dict[str, Any]:
    r = server.client.get(f"/queues/{queue}/stats")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def listed(server: LiveServer) -> dict[str, dict[str, Any]]:
    r = server.client.get("/queues")
    assert r.status_code == 200, r.text
    return {q["queue"]: q for q in r.json()["queues"]}


def count_now(server: LiveServer, interval: float | None = None) -> int | None:
    """The background's count, run now (interval None: whenever the last one was), or with `interval` as the
    service passes it."""

    async def run() -> int | None:
        async with server.services.db.connection() as conn:
            if interval is None:
                await conn.execute("UPDATE jobq.live_counts_clock SET counted_at = '-infinity' WHERE id")
            return await store_live.refresh(conn, interval or 0)

    return server.run(run)


def enqueue_many(server: LiveServer, queue: str, n: int, **fields: Any) -> None:
    r = server.client.post(f"/queues/{queue}/jobs/batch", json={"jobs": [{"payload": i, **fields} for i in range(n)]})
    assert r.status_code in (200, 201), r.text


def test_a_queue_under_the_maximum_is_counted_exactly_and_says_so(server_factory: Any) -> None:
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    enqueue_many(server, "q", MAX - 3)
    enqueue_many(server, "q", 3, delay_seconds=3600)
    s = stats(server)
    assert s["counts"]["ready"] == MAX - 3 and s["counts"]["scheduled"] == 3
    assert s["counts_estimated"] is False and s["counts_counted_at"] is None
    q = listed(server)["q"]
    assert q["counts"]["pending"] == MAX and q["counts_estimated"] is False


def test_counts_past_the_maximum_come_from_the_background_count(server_factory: Any, db: psycopg.Connection) -> None:
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    enqueue_many(server, "q", 20)
    enqueue_many(server, "q", 10, delay_seconds=3600)
    db.execute(
        "UPDATE jobq.jobs SET run_at = now() - interval '1 hour'"
        " WHERE queue_name = 'q' AND payload = '7' AND run_at <= now()"
    )
    enqueue_many(server, "small", 3)

    # Not counted by the background yet: at least what the request read (the first MAX + 1 pending jobs, the
    # due ones first), marked estimated; the oldest ready job is exact whatever the backlog.
    s = stats(server)
    assert s["counts_estimated"] is True and s["counts_counted_at"] is None
    assert s["counts"]["pending"] >= MAX + 1 and s["counts"]["ready"] >= MAX + 1
    assert 3600 <= s["oldest_ready_age_seconds"] < 3700
    assert listed(server)["small"]["counts"]["ready"] == 3  # a small queue beside it stays exact
    assert listed(server)["small"]["counts_estimated"] is False

    assert count_now(server) == 2  # two queues with live jobs
    s = stats(server)
    assert (s["counts"]["ready"], s["counts"]["scheduled"], s["counts"]["pending"]) == (20, 10, 30)
    assert s["counts_estimated"] is True and s["counts_counted_at"] is not None
    q = listed(server)["q"]
    assert (q["counts"]["ready"], q["counts"]["scheduled"], q["counts_estimated"]) == (20, 10, PAGES_ESTIMATE)
    assert 3600 <= q["oldest_ready_age_seconds"] < 3700

    # Kinds under the maximum stay exact beside an estimated one: 5 running.
    claims = server.claim(limit=5)
    assert len(claims) == 5
    s = stats(server)
    assert s["counts"]["running"] == 5
    assert s["counts"]["ready"] == 20  # the background's count until its next pass
    count_now(server)
    assert stats(server)["counts"]["ready"] == 15

    # Back under the maximum. Neither the stats nor GET /queues read again a kind the background found past the
    # maximum (such a read would stop at the maximum: on a big backlog it is the whole cost of the call): both
    # keep its figure, marked estimated, and follow the next count. The kinds it found under stay exact.
    for c in claims + server.claim(limit=15):
        r = server.client.post(f"/jobs/{c['id']}/complete", json={"claim_token": c["claim_token"]})
        assert r.status_code == 200, r.text
    s = stats(server)
    assert (s["counts"]["ready"], s["counts"]["scheduled"], s["counts"]["running"]) == (15, 10, 0)
    assert s["counts_estimated"] is True and s["counts_counted_at"] is not None
    assert listed(server)["q"]["counts_estimated"] is PAGES_ESTIMATE
    count_now(server)
    s = stats(server)
    assert (s["counts"]["ready"], s["counts"]["scheduled"], s["counts"]["running"]) == (0, 10, 0)
    assert s["counts_estimated"] is False
    q = listed(server)["q"]
    assert (q["counts"]["ready"], q["counts"]["scheduled"], q["counts_estimated"]) == (0, 10, False)


def test_a_count_too_old_to_trust_does_not_stand_for_a_drained_queue(
    server_factory: Any, db: psycopg.Connection
) -> None:
    """A kind the background's count found past the maximum is taken from that count without a read only while
    the count is recent (app/db/live_counts.py trusted_seconds: two minutes at least). When no replica counts any
    more (JOBQ_LIVE_COUNTS_INTERVAL_SECONDS 0 everywhere, or the counting replica down), a queue drained since is
    read again: its figures are exact, not the old count's forever."""
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    enqueue_many(server, "q", 30)
    count_now(server)
    for c in server.claim(limit=30):
        r = server.client.post(f"/jobs/{c['id']}/complete", json={"claim_token": c["claim_token"]})
        assert r.status_code == 200, r.text
    s = stats(server)
    assert (s["counts"]["ready"], s["counts_estimated"]) == (30, True)  # the recent count stands
    db.execute("UPDATE jobq.queue_live_counts SET counted_at = now() - interval '3 minutes'")
    s = stats(server)
    assert (s["counts"]["ready"], s["counts"]["pending"], s["counts_estimated"]) == (0, 0, False)
    q = listed(server)["q"]
    assert (q["counts"]["ready"], q["counts_estimated"]) == (0, False)


def test_a_kind_that_grew_past_the_last_count_shows_at_least_the_maximum(
    server_factory: Any, db: psycopg.Connection
) -> None:
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    enqueue_many(server, "q", 2)
    count_now(server)  # counted 2
    enqueue_many(server, "q", 40)
    s = stats(server)
    assert s["counts_estimated"] is True
    assert s["counts"]["ready"] >= MAX + 1  # never the older, smaller count
    q = listed(server)["q"]
    assert q["counts"]["ready"] >= MAX + 1 and q["counts_estimated"] is PAGES_ESTIMATE


def test_waiting_and_running_past_the_maximum(server_factory: Any) -> None:
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    parent = server.enqueue(queue="p", payload="parent")
    enqueue_many(server, "q", 15, depends_on=[parent["id"]])
    enqueue_many(server, "q", 12)
    claims = server.claim(limit=12)
    assert len(claims) == 12
    count_now(server)
    s = stats(server)
    assert (s["counts"]["waiting"], s["counts"]["running"], s["counts"]["ready"]) == (15, 12, 0)
    assert s["counts_estimated"] is True
    q = listed(server)["q"]
    assert (q["counts"]["waiting"], q["counts"]["running"], q["counts"]["ready"]) == (15, 12, 0)


def test_one_replica_counts_per_interval_and_a_drained_queue_loses_its_row(
    server_factory: Any, db: psycopg.Connection, database_url: str
) -> None:
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    enqueue_many(server, "a", 2)
    enqueue_many(server, "b", 2)
    assert count_now(server) == 2
    assert count_now(server, interval=3600) is None  # counted within the interval: not this pass's turn
    rows = db.execute("SELECT queue_name, ready FROM jobq.queue_live_counts ORDER BY 1").fetchall()
    assert rows == [("a", 2), ("b", 2)]

    # Another replica counting now (it holds the lock): a pass skips it rather than waiting for it, due as it is.
    db.execute("UPDATE jobq.live_counts_clock SET counted_at = now() - interval '1 hour', took_seconds = 0")
    with psycopg.connect(database_url) as other:
        other.execute(store_live.LIVE_COUNTS_LOCK)
        assert count_now(server) is None
    assert count_now(server) == 2
    for c in server.claim(queue="a", limit=2):
        server.client.post(f"/jobs/{c['id']}/complete", json={"claim_token": c["claim_token"]})
    assert count_now(server) == 1
    assert db.execute("SELECT queue_name FROM jobq.queue_live_counts").fetchall() == [("b",)]

    # A count that took long stretches the interval to ten times its duration (at most a tenth of a core).
    db.execute("UPDATE jobq.live_counts_clock SET counted_at = now() - interval '60 seconds', took_seconds = 30")
    assert count_now(server, interval=10) is None  # 300 s must pass, not 10
    db.execute("UPDATE jobq.live_counts_clock SET took_seconds = 0.5")
    assert count_now(server, interval=10) == 1
    took = db.execute("SELECT took_seconds FROM jobq.live_counts_clock").fetchone()
    assert took is not None and 0 < took[0] < 30


def test_the_background_counts_on_its_own(server_factory: Any, db: psycopg.Connection) -> None:
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=1)
    enqueue_many(server, "q", 25)

    def counted() -> bool:
        s = stats(server)
        return s["counts_counted_at"] is not None and s["counts"]["ready"] == 25

    wait_until(counted, what="the background's count of q")


def test_a_count_past_its_budget_still_moves_the_clock(server_factory: Any, db: psycopg.Connection) -> None:
    """A count cancelled by its statement budget is not tried again at once by every replica: the clock moves by
    the time it spent, and the next count waits ten times that."""
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    enqueue_many(server, "q", 3)
    db.execute("UPDATE jobq.live_counts_clock SET counted_at = '-infinity', took_seconds = 0")
    saved = store_live.REFRESH_TIMEOUT
    store_live.REFRESH_TIMEOUT = "SET LOCAL statement_timeout = 1"
    db.execute("SELECT pg_advisory_lock(4242)")  # the count waits for it, and its 1 ms budget ends the wait
    store_live.LIVE_COUNTS_PRUNE, prune = "SELECT pg_advisory_lock_shared(4242)", store_live.LIVE_COUNTS_PRUNE
    try:
        try:
            count_now(server)
        except StatementTimeout:
            pass
        else:
            raise AssertionError("the count was not cancelled")
    finally:
        store_live.REFRESH_TIMEOUT, store_live.LIVE_COUNTS_PRUNE = saved, prune
        db.execute("SELECT pg_advisory_unlock(4242)")
    row = db.execute("SELECT counted_at > now() - interval '1 minute', took_seconds FROM jobq.live_counts_clock")
    moved, took = row.fetchone() or (False, 0.0)
    assert moved and took > 0
    db.execute("UPDATE jobq.live_counts_clock SET took_seconds = 3600")
    assert count_now(server, interval=0) is None  # ten times what it spent must pass first (its interval: 0)


def groups_of(s: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(g["group"], g["ready"], g["running"]) for g in s["groups"]]


def test_groups_under_the_maximum_are_exact_and_current(server_factory: Any) -> None:
    """Fewer than the maximum of pending jobs that have a group: the groups are exact and current, whatever the
    other counts (here past the maximum, without a group)."""
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    enqueue_many(server, "q", 4, group="a")
    enqueue_many(server, "q", 2, group="b")
    enqueue_many(server, "q", 1, group="c", delay_seconds=3600)  # no job ready: not listed
    assert server.claim_one()["group"] == "a"
    enqueue_many(server, "q", 30)
    count_now(server)
    enqueue_many(server, "q", 1, group="b")  # after the count: seen at once
    s = stats(server)
    assert s["counts_estimated"] is True  # the jobs without a group
    assert groups_of(s) == [("a", 3, 1), ("b", 3, 0)]
    assert s["groups_estimated"] is False and s["groups_counted_at"] is None


def test_groups_past_the_maximum_come_from_the_background_count(server_factory: Any, db: psycopg.Connection) -> None:
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    for group, n in (("a", 8), ("b", 6), ("c", 5), ("d", 3)):
        enqueue_many(server, "q", n, group=group)

    # Not counted by the background yet: the request read the first MAX + 1 pending jobs with a group, in group
    # order: all of a (exact), 3 of b (at least that); c and d it did not reach.
    s = stats(server)
    assert s["groups_estimated"] is True and s["groups_counted_at"] is None
    assert groups_of(s) == [("a", 8, 0), ("b", 3, 0)]

    count_now(server)
    s = stats(server)
    assert groups_of(s) == [("a", 8, 0), ("b", 6, 0), ("c", 5, 0), ("d", 3, 0)]
    assert s["groups_estimated"] is True and s["groups_counted_at"] == s["counts_counted_at"] is not None

    # A group the read sees whole is current; the others are the background's until its next count.
    enqueue_many(server, "q", 2, group="a")
    enqueue_many(server, "q", 4, group="d")
    assert groups_of(stats(server)) == [("a", 10, 0), ("b", 6, 0), ("c", 5, 0), ("d", 3, 0)]
    count_now(server)
    assert groups_of(stats(server)) == [("a", 10, 0), ("d", 7, 0), ("b", 6, 0), ("c", 5, 0)]

    # Only each queue's top groups are kept, and a queue drained of ready grouped jobs keeps none.
    db.execute("UPDATE jobq.jobs SET run_at = now() + interval '1 hour' WHERE queue_name = 'q' AND group_key <> 'a'")
    count_now(server)
    assert db.execute("SELECT group_key, ready FROM jobq.queue_live_groups").fetchall() == [("a", 10)]
    db.execute("UPDATE jobq.jobs SET run_at = now() + interval '1 hour' WHERE queue_name = 'q'")
    count_now(server)
    assert db.execute("SELECT count(*) FROM jobq.queue_live_groups").fetchone() == (0,)
    s = stats(server)
    assert s["groups"] == [] and s["groups_estimated"] is True  # 28 pending with a group, none ready


def test_the_background_keeps_each_queues_top_groups(server_factory: Any, db: psycopg.Connection) -> None:
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    for i in range(store_live.KEPT_GROUPS + 5):
        enqueue_many(server, "q", 1 + i % 3, group=f"g{i:02}")
    enqueue_many(server, "other", 2, group="x")
    count_now(server)
    rows = db.execute("SELECT queue_name, group_key, ready FROM jobq.queue_live_groups ORDER BY 1, 3 DESC, 2")
    kept = rows.fetchall()
    assert [r for r in kept if r[0] == "other"] == [("other", "x", 2)]
    top = [(g, n) for q, g, n in kept if q == "q"]
    assert len(top) == store_live.KEPT_GROUPS == 3 * store_live.TOP_GROUPS == 60
    # 65 groups: 21 of 3, 22 of 2, 22 of 1: the 60 with the most, ties by name.
    assert top[:21] == [(f"g{i:02}", 3) for i in range(2, 65, 3)]
    assert [n for _, n in top] == [3] * 21 + [2] * 22 + [1] * 17
    shown = groups_of(stats(server))
    assert len(shown) == store_live.TOP_GROUPS and shown[:3] == [("g02", 3, 0), ("g05", 3, 0), ("g08", 3, 0)]


def test_a_group_below_the_shown_ones_takes_the_place_of_groups_that_shrank(
    server_factory: Any, db: psycopg.Connection
) -> None:
    """The groups a request reads whole are current; when they shrank since the count, a group the count found just
    below the shown ones moves up into the answer (the count keeps more groups than the stats show)."""
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    for i in range(10):
        enqueue_many(server, "q", 5, group=f"a{i:02}")
        enqueue_many(server, "q", 5, group=f"b{i:02}")
    enqueue_many(server, "q", 4, group="z")  # 21st at the count
    count_now(server)
    db.execute(
        "DELETE FROM jobq.jobs WHERE id IN (SELECT id FROM (SELECT id, row_number() OVER (PARTITION BY group_key"
        " ORDER BY id) AS n FROM jobq.jobs WHERE queue_name = 'q' AND group_key LIKE 'a%%') s WHERE n > 1)"
    )
    s = stats(server)  # the read sees a00..a09 whole (1 each), then stops in b00
    assert s["groups_estimated"] is True
    assert groups_of(s) == [(f"b{i:02}", 5, 0) for i in range(10)] + [("z", 4, 0)] + [
        (f"a{i:02}", 1, 0) for i in range(9)
    ]


def test_a_groups_count_that_fails_leaves_the_queues_counts_made(server_factory: Any, db: psycopg.Connection) -> None:
    """The groups are counted in a savepoint of their own: cut short by their budget or refused, the queues'
    counts just made still commit, and the clock moves."""
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    enqueue_many(server, "q", 20, group="a")
    db.execute("UPDATE jobq.live_counts_clock SET counted_at = '-infinity', took_seconds = 0")
    store_live.LIVE_GROUPS_WRITE, saved = "SELECT 1 / 0", store_live.LIVE_GROUPS_WRITE
    try:
        try:
            count_now(server, interval=0)
        except Exception:  # whatever the service makes of it: the point is what committed
            pass
        else:
            raise AssertionError("the groups' count did not fail")
    finally:
        store_live.LIVE_GROUPS_WRITE = saved
    assert db.execute("SELECT ready FROM jobq.queue_live_counts WHERE queue_name = 'q'").fetchone() == (20,)
    assert db.execute("SELECT count(*) FROM jobq.queue_live_groups").fetchone() == (0,)
    row = db.execute("SELECT counted_at > now() - interval '1 minute' FROM jobq.live_counts_clock").fetchone()
    assert row == (True,)
    s = stats(server)
    assert s["counts_estimated"] is True and s["counts"]["ready"] == 20
    assert s["groups_estimated"] is True and groups_of(s) == [("a", MAX + 1, 0)]  # what the read saw


def test_running_jobs_of_the_groups_past_the_maximum(server_factory: Any) -> None:
    server: LiveServer = server_factory(stats_exact_max=MAX, live_counts_interval_seconds=0)
    enqueue_many(server, "q", 13, group="a")
    enqueue_many(server, "q", 2, group="b")
    assert len(server.claim(limit=12)) == 12  # a's first 12: a has 1 ready, 12 running
    s = stats(server)
    assert s["groups_estimated"] is True
    assert groups_of(s) == [("b", 2, 0), ("a", 1, MAX + 1)]  # at least what the read saw
    count_now(server)
    s = stats(server)
    assert groups_of(s) == [("b", 2, 0), ("a", 1, 12)] and s["groups_estimated"] is True
