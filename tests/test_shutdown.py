"""Graceful shutdown: a real `jobq serve` process, a real SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from app.runtime.embedded import LocalPostgres
from tests import citus
from tests.processes import Announcements, ServeProcess, embedded_url, postgres_pids
from tests.support import wait_until

pytestmark = pytest.mark.slow


def _long_poll(url: str, queue: str) -> tuple[int, Any]:
    with httpx.Client(base_url=url, timeout=120) as c:
        r = c.post(f"/queues/{queue}/claim", json={"worker": "waiter", "wait_seconds": 300})
        return r.status_code, r.json()


def _wait_for_result(url: str, job_id: int) -> tuple[int, Any]:
    with httpx.Client(base_url=url, timeout=120) as c:
        r = c.get(f"/jobs/{job_id}", params={"wait_seconds": 300})
        return r.status_code, r.json()["status"]


class _SlowRequest:
    """An enqueue whose body is not sent yet: in flight at the server once it has said 100 Continue."""

    def __init__(self, port: int, queue: str, payload: Any) -> None:
        self.body = json.dumps({"payload": payload}).encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(
            f"POST /queues/{queue}/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(self.body)}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1024)
        assert head.startswith(b"HTTP/1.1 100"), head

    def finish(self) -> bytes:
        self.sock.sendall(self.body)
        answer = b""
        while chunk := self.sock.recv(65536):
            answer += chunk
        self.sock.close()
        return answer


def test_sigterm_drains_finishes_requests_and_stops_postgres(
    pg_data_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """At SIGTERM: waiting long-polls answer [] at once (they would wait 300 s, past the 30 s graceful
    timeout), so does a request waiting for a job's result (with the job as it is), a request in flight
    completes, claimers racing the shutdown never lose a job (every job left
    `running` was delivered to a client), the process exits 0 and its PostgreSQL is stopped. On Citus
    (JOBQ_TEST_CITUS_URL) the same against the test's distributed database (JOBQ_DATABASE_URL): all but the
    stop, which is the managed PostgreSQL's (`--data-dir`), plain PostgreSQL."""
    # The request in flight holds its body back on purpose across the shutdown: longer than a body may stall
    # by default (JOBQ_HEADER_TIMEOUT_SECONDS) on a slow machine.
    env = {"JOBQ_WAIT_MAX_SECONDS": "300", "JOBQ_POLL_INTERVAL_SECONDS": "60", "JOBQ_HEADER_TIMEOUT_SECONDS": "300"}
    citus_url: str | None = request.getfixturevalue("database_url") if os.environ.get(citus.URL_VARIABLE) else None
    if citus_url:
        env["JOBQ_DATABASE_URL"] = citus_url
    where = () if citus_url else ("--data-dir", str(pg_data_dir))
    srv = ServeProcess(*where, "--graceful-timeout", "30", log=tmp_path / "serve.log", env=env)
    try:
        srv.wait_ready()
        url = citus_url or embedded_url(pg_data_dir)
        for _ in range(3):
            r = srv.client.post("/queues/busy/jobs/batch", json={"jobs": [{"payload": i} for i in range(1000)]})
            assert r.status_code == 201, r.text

        awaited = srv.enqueue("awaited", "nobody will run it")["id"]
        announcements = Announcements(url)
        pool = ThreadPoolExecutor(max_workers=4)
        polls = [pool.submit(_long_poll, srv.url, f"idle-{i}") for i in range(3)]
        result = pool.submit(_wait_for_result, srv.url, awaited)
        announcements.wait_for({"idle-0", "idle-1", "idle-2", f"#{awaited}"})
        announcements.close()
        in_flight = _SlowRequest(srv.port, "late", "sent before SIGTERM, finished after")

        received: list[int] = []
        failures: list[str] = []

        def claimer() -> None:
            with httpx.Client(base_url=srv.url, timeout=60) as c:
                while True:
                    try:
                        r = c.post("/queues/busy/claim", json={"worker": "busy", "limit": 2})
                    except httpx.TransportError:
                        return  # the server closed its socket
                    if r.status_code != 200:
                        failures.append(r.text)
                        return
                    received.extend(j["id"] for j in r.json()["jobs"])

        claimers = [threading.Thread(target=claimer) for _ in range(4)]
        for t in claimers:
            t.start()
        wait_until(lambda: len(received) >= 50, what="claims flowing")

        srv.signal()

        assert [p.result(timeout=60) for p in polls] == [(200, {"jobs": [], "completed": []})] * 3
        assert result.result(timeout=60) == (200, "pending")
        answer = in_flight.finish()
        assert answer.startswith(b"HTTP/1.1 201"), answer
        assert srv.wait(60) == 0, srv.output()
        for t in claimers:
            t.join(60)
        pool.shutdown()
        assert not failures, failures
        if not citus_url:
            assert postgres_pids(pg_data_dir) == [], "the embedded PostgreSQL is still running"
            assert "embedded PostgreSQL stopped" in srv.output()
    finally:
        srv.close()

    with contextlib.ExitStack() as stack:
        conn = stack.enter_context(psycopg.connect(citus_url or stack.enter_context(LocalPostgres(pg_data_dir)).url))
        running = {r[0] for r in conn.execute("SELECT id FROM jobq.jobs WHERE status = 'running'")}
        late = conn.execute("SELECT status, payload FROM jobq.jobs WHERE queue_name = 'late'").fetchall()
    assert running == set(received), "a job was claimed for a client that never got it"
    assert len(received) == len(set(received))
    assert late == [("pending", "sent before SIGTERM, finished after")]
