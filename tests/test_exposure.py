"""Who reaches a service that runs without keys: auth decided by the socket the service listens on, never
by a setting, and what an open service refuses (proxied requests, foreign Host names, foreign origins,
and the content types a web page can send across sites without asking)."""

from __future__ import annotations

import logging
import socket
from typing import Any

import httpx
import psycopg
import pytest

from tests.support import LiveServer, problem

ENV_KEY = "container-key-" + "k" * 40
JSON = {"content-type": "application/json"}


def jobs(db: psycopg.Connection) -> int:
    row = db.execute("SELECT count(*) FROM jobq.jobs").fetchone()
    assert row is not None
    return int(row[0])


# --- auth decided by the socket ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bind", "auth", "required"),
    [
        ("127.0.0.1", "auto", False),
        ("::1", "auto", False),  # IPv6 loopback is loopback
        ("0.0.0.0", "auto", True),  # reached through 127.0.0.1, but listening everywhere
        ("::", "auto", True),
        ("127.0.0.1", "on", True),
        ("0.0.0.0", "off", False),
    ],
)
def test_auth_is_decided_by_the_socket_the_service_listens_on(
    server_factory: Any, bind: str, auth: str, required: bool
) -> None:
    """JOBQ_HOST keeps its default (127.0.0.1) throughout: as with `uvicorn app.main:create_app --factory
    --host 0.0.0.0`, only the socket says where the service listens."""
    server: LiveServer = server_factory(bind=bind, auth=auth)
    assert server.settings.host == "127.0.0.1"
    r = server.client.post("/queues/q/jobs", json={"payload": 1})
    if required:
        problem(r, 401, "unauthorized")
    else:
        assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("auth", "warned"), [("auto", "authentication auto"), ("off", "authentication OFF"), ("on", None)]
)
def test_the_start_log_warns_whenever_auth_may_be_off(
    server_factory: Any, caplog: pytest.LogCaptureFixture, auth: str, warned: str | None
) -> None:
    caplog.set_level(logging.INFO, logger="jobq")
    server_factory(auth=auth, api_key=ENV_KEY)
    warnings = [r.getMessage() for r in caplog.records if r.name == "jobq" and r.levelno == logging.WARNING]
    if warned is None:
        assert not warnings
        assert any("authentication on" in r.getMessage() for r in caplog.records)
    else:
        assert any(warned in w and "JOBQ_AUTH=on" in w for w in warnings), warnings


# --- an open service behind a proxy ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header", [("forwarded", "for=203.0.113.7"), ("x-forwarded-for", "203.0.113.7"), ("x-real-ip", "203.0.113.7")]
)
def test_an_open_service_refuses_proxied_requests(
    shared_server: LiveServer, shared_db: psycopg.Connection, header: Any
) -> None:
    """A proxy on the same host forwarding the world to 127.0.0.1 would make an open service everyone's: its
    requests are refused, with how to turn keys on, and nothing is written."""
    r = shared_server.client.post("/queues/q/jobs", json={"payload": 1}, headers=[header])
    body = problem(r, 403, "proxy-without-keys")
    assert "JOBQ_AUTH=on" in body["detail"] and "jobq keys create" in body["detail"]
    problem(shared_server.client.get("/queues", headers=[header]), 403, "proxy-without-keys")
    assert jobs(shared_db) == 0


def test_jobq_auth_off_refuses_proxied_requests_too(server_factory: Any) -> None:
    """JOBQ_AUTH=off on a public address: whoever reaches the socket may use it, but a proxy that forwards
    the world still may not."""
    server: LiveServer = server_factory(bind="0.0.0.0", auth="off")
    problem(server.client.get("/queues", headers={"x-real-ip": "203.0.113.7"}), 403, "proxy-without-keys")
    assert server.client.get("/queues").status_code == 200


def test_with_keys_on_a_proxy_in_front_is_fine(server_factory: Any) -> None:
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY)
    headers = {"authorization": f"Bearer {ENV_KEY}", "x-forwarded-for": "203.0.113.7", "host": "jobq.example.com"}
    assert server.client.post("/queues/q/jobs", json={"payload": 1}, headers=headers).status_code == 201
    problem(server.client.post("/queues/q/jobs", json={"payload": 1}, headers={"x-forwarded-for": "1.2.3.4"}),
            401, "unauthorized")  # fmt: skip


# --- DNS rebinding and cross-site requests ---------------------------------------------------------------------


def test_an_open_service_answers_only_loopback_host_names(server: LiveServer, db: psycopg.Connection) -> None:
    """A page on rebind.example whose name is made to resolve to 127.0.0.1 reads nothing and writes nothing."""
    job = server.enqueue(payload="secret")
    for host in ("rebind.example", "rebind.example:8000", "10.0.0.5", "0.0.0.0", "localhost.example.com"):
        for r in (
            server.client.get(f"/jobs/{job['id']}", headers={"host": host}),
            server.client.post("/queues/q/jobs", json={"payload": 1}, headers={"host": host}),
            server.client.get("/healthz", headers={"host": host}),
        ):
            body = problem(r, 421, "host-not-allowed")
            assert "secret" not in r.text and "JOBQ_ALLOWED_HOSTS" in body["detail"]
    assert jobs(db) == 1
    for host in ("localhost", f"localhost:{server.port}", f"127.0.0.1:{server.port}", "127.9.9.9", "[::1]:80",
                 "[::1]", "ui.localhost", "LOCALHOST."):  # fmt: skip
        assert server.client.get(f"/jobs/{job['id']}", headers={"host": host}).status_code == 200, host


def test_more_host_names_can_be_allowed(server_factory: Any) -> None:
    server: LiveServer = server_factory(allowed_hosts="devbox, jobq.lan")
    assert server.client.get("/healthz", headers={"host": "devbox:8000"}).status_code == 200
    assert server.client.get("/healthz", headers={"host": "JOBQ.LAN"}).status_code == 200
    problem(server.client.get("/healthz", headers={"host": "other"}), 421, "host-not-allowed")
    anything: LiveServer = server_factory(allowed_hosts="*")
    assert anything.client.get("/healthz", headers={"host": "other"}).status_code == 200


def raw_status(server: LiveServer, head: bytes) -> int:
    """The status of a GET /healthz sent with exactly these header lines, on a socket of its own."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n" + head + b"Connection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_host_and_origin_are_read_strictly(server: LiveServer) -> None:
    """A Host value is a name or address and a port, nothing a lenient parse could make loopback out of,
    and a request with two Host or two Origin headers (no browser sends one) is refused, whichever comes
    first."""
    for host in (b"[::1]evil.example", b"[::1", b"[::1]@evil.example", b"localhost:1, evil.example",
                 b"localhost evil.example"):  # fmt: skip
        assert raw_status(server, b"Host: " + host + b"\r\n") == 421, host
    assert raw_status(server, b"Host: evil.example\r\nHost: localhost\r\n") == 421
    assert raw_status(server, b"Host: localhost\r\nHost: localhost\r\n") == 421
    two_origins = b"Host: localhost\r\nOrigin: http://evil.example\r\nOrigin: http://localhost\r\n"
    assert raw_status(server, two_origins) == 403
    for host in (b"localhost", b"[::1]:%d" % server.port, b"127.0.0.1:%d" % server.port, b"localhost.:80"):
        assert raw_status(server, b"Host: " + host + b"\r\n") == 200, host
    assert raw_status(server, b"Host: localhost\r\nOrigin: http://localhost\r\n") == 200


def test_an_open_service_refuses_a_foreign_origin(server: LiveServer, db: psycopg.Connection) -> None:
    """A page the operator visits cannot enqueue, pause or cancel through the browser; the dashboard, served
    by the service itself, can."""
    job = server.enqueue()
    for origin in ("http://evil.example", "null", f"http://localhost:{server.port + 1}", "https://127.0.0.1"):
        h = {"origin": origin}
        problem(server.client.post("/queues/q/jobs", json={"payload": 1}, headers=h), 403, "foreign-origin")
        problem(server.client.post("/queues/q/pause", headers=h), 403, "foreign-origin")
        problem(server.client.post(f"/jobs/{job['id']}/cancel", headers=h), 403, "foreign-origin")
    assert jobs(db) == 1 and server.job(job["id"])["status"] == "pending"
    assert db.execute("SELECT count(*) FROM jobq.queue_state").fetchone() == (0,)
    same = {"origin": server.url}
    assert server.client.post("/queues/q/jobs", json={"payload": 1}, headers=same).status_code == 201


# --- Content-Type on every write ----------------------------------------------------------------------------------

SIMPLE_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain")


def test_a_body_must_be_sent_as_json(server: LiveServer, db: psycopg.Connection) -> None:
    """A form can POST any of these across sites without asking; none of them is read, and neither is a body
    without a Content-Type."""
    for headers in ({}, *({"content-type": t} for t in SIMPLE_TYPES), {"content-type": "application/xml"}):
        for path in ("/queues/q/jobs", "/queues/q/jobs/batch", "/queues/q/claim"):
            r = server.client.post(path, content=b'{"payload": 1, "jobs": [{"payload": 1}], "worker": "w"}',
                                   headers=headers)  # fmt: skip
            body = problem(r, 415, "unsupported-media-type")
            assert "application/json" in body["detail"]
    assert jobs(db) == 0
    for json_type in ("application/json", "application/json; charset=utf-8", "application/merge-patch+json"):
        r = server.client.post("/queues/q/jobs", content=b'{"payload": 1}', headers={"content-type": json_type})
        assert r.status_code == 201, (json_type, r.text)


def test_bodiless_posts_refuse_form_and_text_types(server: LiveServer, db: psycopg.Connection) -> None:
    """pause, resume, cancel, retry and redrive take no body, so a page could send them as "simple" requests:
    with a form or text Content-Type they are refused and change nothing; without one, or with JSON, they
    work."""
    job = server.enqueue()
    actions = ["/queues/q/pause", "/queues/q/resume", f"/jobs/{job['id']}/cancel", "/queues/q/redrive"]
    for content_type in SIMPLE_TYPES:
        for path in actions:
            problem(server.client.post(path, headers={"content-type": content_type}), 415, "unsupported-media-type")
    assert server.job(job["id"])["status"] == "pending"
    assert db.execute("SELECT count(*) FROM jobq.queue_state").fetchone() == (0,)
    assert server.client.post("/queues/q/pause").status_code == 200
    assert server.client.post("/queues/q/resume", headers=JSON).status_code == 200
    assert server.client.post(f"/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    problem(server.client.post(f"/jobs/{job['id']}/retry", headers={"content-type": "text/plain"}),
            415, "unsupported-media-type")  # fmt: skip
    assert server.client.post(f"/jobs/{job['id']}/retry", headers=JSON).json()["status"] == "pending"


def test_a_chunked_body_needs_the_json_type_too(server: LiveServer) -> None:
    """A body sent in chunks, without Content-Length, is a body."""

    def chunks() -> Any:
        yield b'{"payload": '
        yield b"1}"

    assert httpx.post(f"{server.url}/queues/q/jobs", content=chunks(), headers=JSON).status_code == 201
    problem(httpx.post(f"{server.url}/queues/q/jobs", content=chunks()), 415, "unsupported-media-type")
