"""Reads from a replica (JOBQ_READ_DATABASE_URL): stats, listings, search, history, the workers and the
scaling signal go to a streaming standby while it is up and close enough, to the primary otherwise, and every
such answer says which served it (JOBQ-Served-By). Against a primary and a `pg_basebackup -R` standby on
loopback (tests/replicas.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.db.replica import SERVED_BY_HEADER
from tests.conftest import make_settings
from tests.replicas import Pair, primary_and_standby
from tests.support import LiveServer, wait_until

# Every route whose reads may come from the replica, as (method, path, body).
READS: list[tuple[str, str, Any]] = [
    ("GET", "/queues", None),
    ("GET", "/queues/rq/stats", None),
    ("GET", "/queues/rq/jobs", None),
    ("POST", "/jobs/search", {"queue": "rq"}),
    ("GET", "/stats/series", None),
    ("GET", "/queues/rq/stats/series", None),
    ("GET", "/stats/sparklines", None),
    ("GET", "/workers", None),
    ("GET", "/queues/rq/scale", None),
]


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with primary_and_standby() as made:
        yield made


def serve(pair: Pair, **overrides: object) -> LiveServer:
    settings = make_settings(pair.primary.url, read_database_url=pair.standby_url, **overrides)
    return LiveServer(settings).start()


def served_by(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.headers[SERVED_BY_HEADER]


def listed(server: LiveServer) -> tuple[str, set[Any]]:
    """Who served the listing of queue rq, and the payloads it shows."""
    r = server.client.get("/queues/rq/jobs", params={"limit": 500})
    return served_by(r), {j["payload"] for j in r.json()["jobs"]}


def test_reads_go_to_the_replica_and_each_answer_says_which_served_it(pair: Pair) -> None:
    server = serve(pair)
    try:
        job = server.enqueue("rq", "first")
        wait_until(lambda: listed(server) == ("replica", {"first"}), what="the listing served by the replica")
        for method, path, body in READS:
            assert served_by(server.client.request(method, path, json=body)) == "replica", path
        # Claims, writes and reads of a job by id (and why it is not running) stay on the primary, and do not
        # say otherwise.
        assert SERVED_BY_HEADER not in server.client.get(f"/jobs/{job['id']}").headers
        assert SERVED_BY_HEADER not in server.client.get(f"/jobs/{job['id']}/explain").headers
        assert server.claim_one("rq", worker="replica-reader")["id"] == job["id"]

        # The worker that claimed it, once its process has flushed the registry and the replica has it.
        def worker_on_replica() -> bool:
            r = server.client.get("/workers/replica-reader")
            return (
                r.status_code == 200
                and served_by(r) == "replica"
                and [j["id"] for j in r.json()["jobs"]] == [job["id"]]
            )

        wait_until(worker_on_replica, what="GET /workers/{name} served by the replica, holding the job")
        scale = server.client.get("/queues/rq/scale")
        assert served_by(scale) == "replica" and scale.json()["running"] == 1, scale.json()

        stats = server.client.get("/queues/rq/stats").json()["database"]["read_replica"]
        assert stats["serving"] is True and stats["reason"] is None, stats
        assert 0 <= stats["lag_seconds"] <= stats["max_lag_seconds"] == 5.0
        metrics = server.client.get("/metrics").text
        assert "jobq_read_replica_serving 1.0" in metrics and "jobq_read_replica_lag_seconds" in metrics
    finally:
        server.stop()


def test_a_lagging_replica_is_left_for_the_primary_and_taken_back(pair: Pair) -> None:
    server = serve(pair, read_max_lag_seconds=1.0)
    try:
        wait_until(lambda: listed(server)[0] == "replica", what="reads on the replica")
        pair.sql(pair.standby_url, "SELECT pg_wal_replay_pause()")
        paused = "SELECT pg_get_wal_replay_pause_state()"
        wait_until(lambda: pair.sql(pair.standby_url, paused) == [("paused",)], what="the replay to pause")
        try:
            server.enqueue("rq", "while paused")

            # Whoever serves says so: the replica cannot show the job enqueued after its replay stopped,
            # the primary must. Once the lag passes the bound, the primary serves.
            def primary_serves() -> bool:
                by, payloads = listed(server)
                assert ("while paused" in payloads) == (by == "primary"), (by, payloads)
                return by == "primary"

            wait_until(primary_serves, what="reads on the primary once the replica lags past the bound")
            state = server.client.get("/queues/rq/stats").json()["database"]["read_replica"]
            assert state["serving"] is False and "behind" in state["reason"], state
        finally:
            pair.sql(pair.standby_url, "SELECT pg_wal_replay_resume()")

        def caught_up() -> bool:
            by, payloads = listed(server)
            return by == "replica" and "while paused" in payloads

        wait_until(caught_up, what="reads back on the replica, caught up")
    finally:
        server.stop()


def test_a_replica_down_sends_reads_to_the_primary_without_an_error(pair: Pair) -> None:
    assert pair.standby is not None
    server = serve(pair)
    try:
        wait_until(lambda: listed(server)[0] == "replica", what="reads on the replica")
        pair.standby.stop(mode="immediate")
        try:
            # Every read answers 200 through the replica's loss, from the primary once it is noticed.
            wait_until(lambda: listed(server)[0] == "primary", what="reads on the primary")
            for method, path, body in READS:
                assert served_by(server.client.request(method, path, json=body)) == "primary", path
            state = server.client.get("/readyz").json()["read_replica"]
            assert state["serving"] is False and "unavailable" in state["reason"], state
        finally:
            pair.standby.start()
        wait_until(lambda: listed(server)[0] == "replica", timeout=60, what="reads back on the replica")
    finally:
        server.stop()
