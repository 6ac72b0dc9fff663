"""jobq on a cluster, not a host: a multi-host JOBQ_DATABASE_URL through a crash of the primary and the
promotion of its standby, a primary turned read-only, and the durability check of the primary's
replication (docs/deployment.md#high-availability). Each test builds a primary and a streaming standby on
loopback (tests/replicas.py); the failover manager's part is played by hand here, and by Patroni in
tests/test_patroni.py."""

from __future__ import annotations

import logging
import threading
from typing import Any

import httpx
import psycopg
import pytest
from jobq_client import Client, RetryPolicy

from app.db.channels import CHANNEL
from app.runtime.embedded import free_port
from tests.conftest import make_settings
from tests.processes import run_jobq
from tests.replicas import Pair, primary_and_standby
from tests.support import LiveServer, problem, record_messages, settle_long_poll, wait_until

PATIENT = RetryPolicy(attempts=200, backoff_base=0.1, backoff_max=0.5)


def gap_answer(response: httpx.Response) -> None:
    """What a request gets while no primary takes writes: 503 problem+json with Retry-After, never a 500."""
    body = problem(response, 503, "database-unavailable")
    assert int(response.headers["retry-after"]) >= 1, response.headers
    assert "payload" not in body


def enqueued(server: LiveServer, payload: Any) -> bool:
    return server.client.post("/queues/q/jobs", json={"payload": payload}).status_code == 201


def serve(url: str, **overrides: object) -> LiveServer:
    settings = {"pool_timeout_seconds": 2.0, **overrides}
    return LiveServer(make_settings(url, **settings)).start()


@pytest.mark.slow  # two clusters, a crash, a promotion and the pool's way back: about 15 s
def test_a_multi_host_url_rides_through_a_crash_of_the_primary_and_a_promotion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "jobq_client")
    with primary_and_standby() as pair:
        pair.synchronous()
        # The fallback poll is out of the way: only the listener and the presence renewals bring wake-ups.
        server = serve(pair.multi_host_url(), poll_interval_seconds=60, wait_max_seconds=50)
        try:
            _through_a_crash(pair, server, caplog)
        finally:
            server.stop()


def _through_a_crash(pair: Pair, server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    ready = server.client.get("/readyz").json()
    assert ready["replication"]["mode"] == "synchronous", ready
    assert ready["replication"]["standbys"] == 1 and ready["replication"]["warning"] is None

    # Before the crash: jobs acknowledged, claims handed out, one job completed.
    ids = [server.enqueue("q", n)["id"] for n in range(5)]
    held = {c["id"]: c["claim_token"] for c in server.claim("q", limit=4)}
    finished, to_beat, to_fail, in_doubt = sorted(held)
    r = server.client.post(f"/jobs/{finished}/complete", json={"claim_token": held[finished], "result": "before"})
    assert r.status_code == 200, r.text
    answer = server.claim_in_background("late", wait_seconds=45)  # parked through the failover
    settle_long_poll(server, "late")

    pair.crash_primary()
    for n in range(3):
        gap_answer(server.client.post("/queues/q/jobs", json={"payload": f"gap-{n}"}))
    gap_answer(server.client.post("/queues/q/claim", json={"worker": "w"}))
    problem(server.client.get("/readyz"), 503, "database-unavailable")

    # The SDK in the gap: a keyed enqueue and a complete, retried on 503 until a primary answers.
    outcomes: dict[str, Any] = {}

    def sdk() -> None:
        with Client(server.url, retry=PATIENT) as jobq:
            outcomes["enqueued"] = jobq.enqueue("q", "keyed", idempotency_key="in-the-gap")
            outcomes["completed"] = jobq.complete(in_doubt, held[in_doubt], "in the gap")

    thread = threading.Thread(target=sdk)
    thread.start()
    wait_until(lambda: "retrying enqueueJob" in caplog.text, what="the SDK's keyed enqueue to be retried")

    pair.promote()
    # Another jobq process would enqueue on the new primary and send its wake-up while this one may not
    # be listening yet: the claim parked here must get the job anyway, long before the fallback poll.
    pair.sql(pair.standby_url, "INSERT INTO jobq.jobs (queue_name, payload) VALUES ('late', '\"after\"')")
    pair.sql(pair.standby_url, f"SELECT pg_notify('{CHANNEL}', 'elsewhere w late')")
    wait_until(lambda: enqueued(server, "after"), timeout=60, what="an enqueue on the promoted standby")

    thread.join(60)
    assert not thread.is_alive()
    assert outcomes["enqueued"].idempotency_key == "in-the-gap"
    assert outcomes["completed"].status == "completed" and outcomes["completed"].result == "in the gap"
    [late] = answer()
    assert late["payload"] == "after"

    # Every acknowledged write of the old primary is on the new one (synchronous replication), and the
    # worker calls made before the crash, repeated with the same token, change nothing twice.
    with psycopg.connect(pair.standby_url, autocommit=True) as db:
        rows = db.execute("SELECT id FROM jobq.jobs WHERE queue_name = 'q' AND id = ANY(%s)", (ids,)).fetchall()
        assert {r[0] for r in rows} == set(ids)
        keyed = db.execute("SELECT count(*) FROM jobq.jobs WHERE idempotency_key = 'in-the-gap'").fetchone()
        assert keyed == (1,)
    again = server.client.post(f"/jobs/{finished}/complete", json={"claim_token": held[finished], "result": "x"})
    assert again.status_code == 200 and again.json()["result"] == "before", again.text
    beat = server.client.post(f"/jobs/{to_beat}/heartbeat", json={"claim_token": held[to_beat]})
    assert beat.status_code == 200, beat.text
    for _ in range(2):
        failed = server.client.post(f"/jobs/{to_fail}/fail", json={"claim_token": held[to_fail], "error": "e"})
        assert failed.status_code == 200 and failed.json()["status"] == "pending", failed.text
    repeat = server.client.post(f"/jobs/{in_doubt}/complete", json={"claim_token": held[in_doubt], "result": "y"})
    assert repeat.status_code == 200 and repeat.json()["result"] == "in the gap", repeat.text

    # The listener listens on the new primary, and the replication was read again on the way: none now.
    messages = record_messages(server)
    pair.sql(pair.standby_url, f"SELECT pg_notify('{CHANNEL}', 'elsewhere h')")
    wait_until(lambda: "elsewhere h" in messages, what="a NOTIFY on the new primary to reach the listener")
    ready = server.client.get("/readyz").json()
    assert ready["replication"]["mode"] == "none" and ready["replication"]["standbys"] == 0, ready


@pytest.mark.slow  # two clusters: about 10 s
def test_a_primary_turned_read_only_is_left_for_the_promoted_standby() -> None:
    """A demoted primary that keeps running (read-only, not restarted) must not keep jobq's connections:
    its writes answer 503 (not 500, as a read-only error would be), its pooled connections are dropped
    and the LISTEN connection leaves it, for the standby once promoted."""
    with primary_and_standby() as pair:
        server = serve(pair.multi_host_url())
        try:
            assert enqueued(server, "before")
            pair.sql(pair.primary.url, "ALTER SYSTEM SET default_transaction_read_only = on")
            pair.sql(pair.primary.url, "SELECT pg_reload_conf()")
            # Each backend takes the reload at its next command boundary, not at once: an enqueue may still
            # commit on a connection that has not read it yet.
            wait_until(
                lambda: server.client.post("/queues/q/jobs", json={"payload": "racing"}).status_code == 503,
                what="the primary's connections turned read-only",
            )
            for n in range(3):
                gap_answer(server.client.post("/queues/q/jobs", json={"payload": f"refused-{n}"}))
            pair.promote()
            wait_until(lambda: enqueued(server, "after"), timeout=60, what="an enqueue on the promoted standby")
            count = "SELECT count(*) FROM jobq.jobs WHERE payload = '\"after\"'"
            assert pair.sql(pair.standby_url, count) != [(0,)]
            assert pair.sql(pair.primary.url, count) == [(0,)]
            messages = record_messages(server)
            pair.sql(pair.standby_url, f"SELECT pg_notify('{CHANNEL}', 'elsewhere h')")
            wait_until(lambda: "elsewhere h" in messages, timeout=60, what="the listener on the promoted standby")
        finally:
            server.stop()


@pytest.fixture(scope="module")
def pair() -> Any:
    with primary_and_standby() as made:
        yield made


def test_asynchronous_standbys_are_reported_in_readyz_stats_and_metrics(pair: Pair) -> None:
    server = serve(pair.primary.url)
    try:
        replication = server.client.get("/readyz").json()["replication"]
        assert replication["mode"] == "asynchronous" and replication["standbys"] == 1
        assert "may be missing on the promoted standby" in replication["warning"]
        stats = server.client.get("/queues/q/stats").json()
        assert stats["database"]["replication"].items() >= replication.items()
        assert stats["database"]["replication"]["synchronous_standby_names"] == ""
        wait_until(
            lambda: "jobq_replication_asynchronous 1.0" in server.client.get("/metrics").text,
            what="the asynchronous gauge",
        )
    finally:
        server.stop()


def test_require_synchronous_replication_refuses_to_start_on_asynchronous_standbys(pair: Pair) -> None:
    done = run_jobq(
        "serve",
        "--no-migrate",
        "--port",
        str(free_port()),
        env={"JOBQ_DATABASE_URL": pair.primary.url, "JOBQ_REQUIRE_SYNCHRONOUS_REPLICATION": "true"},
        timeout=60,
    )
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "JOBQ_REQUIRE_SYNCHRONOUS_REPLICATION" in output and "replicates asynchronously" in output, output


def test_synchronous_replication_is_reported_without_a_warning(pair: Pair) -> None:
    pair.synchronous(True)
    try:
        server = serve(pair.primary.url, require_synchronous_replication=True)
        try:
            replication = server.client.get("/readyz").json()["replication"]
            assert replication["mode"] == "synchronous" and replication["warning"] is None, replication
            assert replication["synchronous_standbys"] == 1
        finally:
            server.stop()
    finally:
        pair.synchronous(False)
