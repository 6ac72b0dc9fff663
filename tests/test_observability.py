"""What operators see: Prometheus metrics, request logs with request ids, and no secrets in any log."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app.runtime.embedded import free_port as free_port_number
from tests.processes import JOBQ, ServeProcess, jobq_env
from tests.support import LiveServer, wait_until


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text format."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = ",".join(sorted(filter(None, (m.group(2) or "").split(","))))
        if got == want:
            return float(m.group(3))
    return None


def test_metrics_count_job_events_and_requests(server: LiveServer) -> None:
    for i in range(3):
        server.enqueue(payload=i)
    a, b = server.claim(limit=2)
    server.client.post(f"/jobs/{a['id']}/complete", json={"claim_token": a["claim_token"]})
    server.client.post(f"/jobs/{b['id']}/fail", json={"claim_token": b["claim_token"], "error": "e", "retry": False})
    server.client.get(f"/jobs/{a['id']}")

    def get_count() -> float | None:  # a request is counted just after its response is sent
        text = server.client.get("/metrics").text
        return metric(
            text, "jobq_http_request_duration_seconds_count", route="/jobs/{job_id}", method="GET", status="200"
        )

    wait_until(lambda: get_count() == 1, what="the GET to be counted")
    r = server.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert metric(text, "jobq_jobs_enqueued_total", queue="q") == 3
    assert metric(text, "jobq_jobs_claimed_total", queue="q") == 2
    assert metric(text, "jobq_jobs_completed_total", queue="q") == 1
    assert metric(text, "jobq_jobs_failed_total", queue="q") == 1
    assert metric(text, "jobq_job_duration_seconds_count", queue="q") == 1
    # requests are labelled by route template, on the lean path and on FastAPI's alike
    enq = metric(
        text, "jobq_http_request_duration_seconds_count", route="/queues/{queue}/jobs", method="POST", status="201"
    )
    assert enq == 3
    get = metric(text, "jobq_http_request_duration_seconds_count", route="/jobs/{job_id}", method="GET", status="200")
    assert get == 1
    assert "/jobs/" + str(a["id"]) not in text  # never a raw path as a label


def test_gauges_for_waiters_pool_and_depth(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(gauges_interval_seconds=1)
    server.enqueue(queue="deep", payload=1)
    server.enqueue(queue="deep", payload=2)
    # Both wait long enough for the gauges of a slow machine, and are ended below rather than by their deadline.
    t = threading.Thread(target=lambda: server.claim(queue="idle", wait_seconds=30))
    t.start()
    job = server.enqueue(queue="waited", payload=3)
    w = threading.Thread(target=lambda: server.client.get(f"/jobs/{job['id']}", params={"wait_seconds": 30}))
    w.start()
    wait_until(lambda: server.services.dispatcher.parked == 1 and server.services.results.parked == 1)

    def scraped() -> str:
        return server.client.get("/metrics").text

    wait_until(lambda: metric(scraped(), "jobq_waiting_claims") == 1, what="the waiting gauge")
    wait_until(lambda: metric(scraped(), "jobq_waiting_results") == 1, what="the waiting-for-results gauge")
    wait_until(lambda: metric(scraped(), "jobq_queue_ready_jobs", queue="deep") == 2, what="the depth gauge")
    text = scraped()
    assert metric(text, "jobq_pool_connections") is not None
    assert metric(text, "jobq_queue_oldest_ready_age_seconds", queue="deep") is not None
    server.enqueue(queue="idle", payload=4)  # the waiting claim takes it
    claim = server.claim_one(queue="waited")
    server.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": claim["claim_token"]})
    t.join(60)
    w.join(60)
    assert not t.is_alive() and not w.is_alive()


def test_sweeper_metrics(server: LiveServer) -> None:
    from datetime import UTC, datetime

    server.enqueue(payload=1)
    server.claim_one(lease_seconds=1)
    server.run(lambda: server.services.maintenance["rescuer"].run_once(now=datetime(2100, 1, 1, tzinfo=UTC)))
    text = server.client.get("/metrics").text
    assert metric(text, "jobq_sweeper_runs_total") == 1
    assert metric(text, "jobq_sweeper_rows_total", action="rescued") == 1
    assert metric(text, "jobq_jobs_lease_expired_total", queue="q") == 1


def access_lines(server: LiveServer, stream: io.BytesIO) -> list[dict[str, Any]]:
    server.services.access_log.flush()
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_line_per_request_with_a_request_id(server: LiveServer) -> None:
    stream = io.BytesIO()
    server.services.access_log.stream = stream
    r = server.client.post("/queues/q/jobs", json={"payload": 1}, headers={"x-request-id": "trace-42"})
    assert r.headers["x-request-id"] == "trace-42"
    generated = server.client.get("/jobs/424242").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{16}", generated)
    unsafe = server.client.get("/healthz", headers={"x-request-id": "a b\tc"}).headers["x-request-id"]
    assert unsafe != "a b\tc"
    # the line is written just after the response is sent
    wait_until(lambda: len(access_lines(server, stream)) == 3, what="three access lines")
    lines = access_lines(server, stream)
    assert [(x["request_id"], x["method"], x["route"], x["status"]) for x in lines] == [
        ("trace-42", "POST", "/queues/{queue}/jobs", 201),
        (generated, "GET", "/jobs/{job_id}", 404),
        (unsafe, "GET", "/healthz", 200),
    ]
    assert all(x["duration_ms"] >= 0 and x["logger"] == "jobq.access" for x in lines)


def test_payloads_results_and_tokens_never_reach_the_logs(server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    stream = io.BytesIO()
    server.services.access_log.stream = stream
    secret_payload = "PAYLOAD-d41d8cd98f"
    secret_result = "RESULT-9e107d9d37"
    server.enqueue(payload={"card": secret_payload})
    c = server.claim_one()
    server.client.post(f"/jobs/{c['id']}/heartbeat", json={"claim_token": c["claim_token"]})
    server.client.post(f"/jobs/{c['id']}/complete", json={"claim_token": c["claim_token"], "result": secret_result})
    server.client.post(f"/jobs/{c['id']}/complete", json={"claim_token": c["claim_token"] + "x"})  # a 409
    server.client.post(
        "/queues/q/jobs",
        content=b'{"payload": "' + secret_payload.encode() + b'", "x": 1}',
        headers={"content-type": "application/json"},
    )  # a 422
    logged = stream.getvalue().decode() + "\n".join(r.getMessage() + str(r.__dict__) for r in caplog.records)
    for secret in (secret_payload, secret_result, c["claim_token"]):
        assert secret not in logged


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_multiprocess_metrics_add_up(database_url: str, free_port: int) -> None:
    """`jobq serve --workers 2`: /metrics, answered by either process, reports both processes' counts (within a
    second of the last event)."""
    env = {**os.environ, "JOBQ_DATABASE_URL": database_url, "JOBQ_MIGRATE_ON_START": "false"}
    jobq = Path(sys.executable).parent / "jobq"
    proc = subprocess.Popen(
        [str(jobq), "serve", "--port", str(free_port), "--workers", "2", "--no-migrate", "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{free_port}"
        wait_until(lambda: _ready(base), timeout=60, what="the server starting")
        for _ in range(40):  # new connections: the kernel spreads them over both processes
            with httpx.Client(base_url=base) as c:
                assert c.post("/queues/mp/jobs", json={"payload": 1}).status_code == 201

        def enqueued() -> float | None:
            with httpx.Client(base_url=base) as c:  # a new connection: either process may answer
                return metric(c.get("/metrics").text, "jobq_jobs_enqueued_total", queue="mp")

        # A process applies its tallied counts when it answers /metrics and at least once a second
        # (app/maintenance/stats.py): the other one's arrive within a second.
        wait_until(lambda: enqueued() == 40, what="both processes' counts in /metrics")
        for _ in range(6):
            assert enqueued() == 40  # never more: nothing counted twice
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _ready(base: str) -> bool:
    try:
        return httpx.get(base + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        time.sleep(0.1)
        return False


def queue_labels(text: str, metric: str) -> set[str]:
    return set(re.findall(rf'^{metric}\{{queue="([^"]*)"\}}', text, re.M))


def test_queue_labels_in_metrics_are_capped_and_forget_idle_queues(server_factory) -> None:  # type: ignore[no-untyped-def]
    """Queue names come from clients: past the cap, their events count under queue="(other)", and a queue
    idle past its time leaves /metrics, which gives its place to the next. The idle time is 1 s only while the test
    waits for the queues to be forgotten: on a loaded machine six enqueues can take longer than that."""
    server: LiveServer = server_factory(metrics_max_queues=3, gauges_interval_seconds=1)
    labels = server.services.metrics.queue_labels
    for i in range(6):
        server.enqueue(queue=f"q{i}")
    text = server.client.get("/metrics").text
    assert queue_labels(text, "jobq_jobs_enqueued_total") == {"q0", "q1", "q2", "(other)"}
    assert 'jobq_jobs_enqueued_total{queue="(other)"} 3.0' in text
    for i in range(6):
        c = server.claim_one(queue=f"q{i}")
        server.client.post(f"/jobs/{c['id']}/complete", json={"claim_token": c["claim_token"]})

    def forgotten() -> bool:
        # Every one of them: on a slow machine q0-q2 can be forgotten mid-loop and their places taken by q3-q5.
        named = {f"q{i}" for i in range(6)}
        return not named & queue_labels(server.client.get("/metrics").text, "jobq_jobs_enqueued_total")

    labels.idle_seconds = 1.0
    wait_until(forgotten, what="idle queues to leave /metrics")
    labels.idle_seconds = 3600.0
    server.enqueue(queue="fresh")
    assert "fresh" in queue_labels(server.client.get("/metrics").text, "jobq_jobs_enqueued_total")


def test_the_access_log_names_the_client_trusting_only_listed_proxies(server_factory) -> None:  # type: ignore[no-untyped-def]
    key = "container-key-" + "k" * 40
    auth = {"authorization": f"Bearer {key}"}
    for trusted, expected in (("127.0.0.1", "203.0.113.9"), ("", "127.0.0.1"), ("10.0.0.0/8", "127.0.0.1")):
        server: LiveServer = server_factory(auth="on", api_key=key, trusted_proxies=trusted)
        stream = server.services.access_log.stream = io.BytesIO()
        server.client.get("/healthz", headers={**auth, "x-forwarded-for": "6.6.6.6, 203.0.113.9"})
        server.client.get("/healthz", headers=auth)

        def both(s: LiveServer = server, b: io.BytesIO = stream) -> bool:
            return len(access_lines(s, b)) == 2  # each is written just after its answer

        wait_until(both, what="two access lines")
        forwarded, direct = access_lines(server, stream)
        assert (forwarded["client"], direct["client"]) == (expected, "127.0.0.1"), trusted


def _lines(text: str) -> list[str]:
    return [line for line in text.replace("\r", "").splitlines() if line.strip()]


def test_serve_logs_text_on_a_terminal_and_json_elsewhere(database_url: str, tmp_path: Path) -> None:
    """JOBQ_LOG_FORMAT=auto (the default): a person running `jobq serve` in a terminal reads sentences, a log
    collector reading its output from a file or pipe gets JSON; both for lifecycle lines and request lines."""
    env = {"JOBQ_DATABASE_URL": database_url}
    to_file = ServeProcess("--no-migrate", log=tmp_path / "serve.log", env=env).wait_ready()
    try:
        to_file.enqueue("q", 1)
    finally:
        to_file.close()
    docs = [orjson.loads(line) for line in _lines(to_file.output())]
    assert any(d["msg"].startswith("jobq ready") for d in docs if "msg" in d)
    assert any(d.get("route") == "/queues/{queue}/jobs" and d["status"] == 201 for d in docs)

    leader, follower = os.openpty()
    port = free_port_number()
    proc = subprocess.Popen(
        [JOBQ, "serve", "--port", str(port), "--no-migrate"], env=jobq_env(**env), stdout=follower, stderr=follower
    )
    os.close(follower)
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ready(base), timeout=60, what="the server starting")
        assert httpx.post(base + "/queues/q/jobs", json={"payload": 2}).status_code == 201
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        reader.join(10)
        os.close(leader)
    lines = _lines(seen.decode(errors="replace"))
    assert not [line for line in lines if line.startswith("{")], lines
    line = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (?:\x1b\[[\d;]*m)?[A-Z]+ *(?:\x1b\[0m)? "
    assert any(re.match(line + r"jobq: jobq ready", x) for x in lines), lines
    assert any(re.match(line + r"POST /queues/\{queue\}/jobs 201 [\d.]+ms id=[0-9a-f]{16}$", x) for x in lines), lines
