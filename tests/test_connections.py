"""Bounded connections, with raw sockets: a deadline for a request's headers however they trickle in, caps
on their size and number, and a cap on the connections one process holds (app/runtime/connections.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from typing import Any

import httpx
import pytest

from tests.rawhttp import connect, read_answer, read_response
from tests.support import LiveServer, wait_until

# Sockets against the HTTP server: nothing here depends on the major.
# CI runs this file on its first major only (JOBQ_SKIP_ONE_MAJOR).
pytestmark = pytest.mark.one_major

# A request whose 100-byte body has not come yet: in flight, its connection held.
BODY_PENDING = (
    b"POST /queues/q/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\nConnection: close\r\n\r\n"
)


def status_and_problem(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/problem+json" in head.lower(), head
    return status, json.loads(body)


def test_a_connection_that_sends_nothing_is_closed(server_factory: Any, sockets: list[socket.socket]) -> None:
    server: LiveServer = server_factory(header_timeout_seconds=0.5)
    s = connect(server, sockets)
    assert read_answer(s) == b""  # closed without a word: there was no request to answer


def test_headers_that_trickle_in_are_cut_off(server_factory: Any, sockets: list[socket.socket]) -> None:
    """One header line every 50 ms holds a connection for good unless the deadline counts from the start of the
    request, not from the last byte."""
    server: LiveServer = server_factory(header_timeout_seconds=1)
    s = connect(server, sockets)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    sent = 0
    try:
        while sent < 600:  # 30 s of trickling: far past the deadline
            s.sendall(b"X-Slow-%d: 1\r\n" % sent)
            sent += 1
            time.sleep(0.05)
    except OSError:  # the server closed the connection: the answer is waiting
        pass
    answer = read_answer(s)
    assert answer, f"the connection was still open after {sent} header lines"
    status, problem = status_and_problem(answer)
    assert (status, problem["type"]) == (408, "urn:jobq:problem:request-timeout")


def test_the_deadline_starts_again_after_each_answer(server_factory: Any, sockets: list[socket.socket]) -> None:
    """A kept-alive connection gets a fresh deadline for its next request, and a long request is never cut."""
    server: LiveServer = server_factory(header_timeout_seconds=1)
    s = connect(server, sockets)
    for _ in range(3):
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_response(s).startswith(b"HTTP/1.1 200")
    # A long-poll outlasts the header deadline by far, and still answers.
    body = json.dumps({"worker": "w", "wait_seconds": 3}).encode()
    s.sendall(b"POST /queues/q/claim HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    answer = read_response(s)
    assert answer.startswith(b"HTTP/1.1 200") and b'"jobs":[]' in answer, answer


def test_an_idle_kept_alive_connection_lasts_to_its_deadline_not_uvicorns_timer(
    server: LiveServer, sockets: list[socket.socket]
) -> None:
    """An idle kept-alive connection lasts until its next request's header deadline (JOBQ_HEADER_TIMEOUT_SECONDS,
    10 s by default), not uvicorn's keep-alive timer, 5 s by default: as long as httpx keeps an idle connection for
    reuse, so that a request sent as the server closed the connection was lost ("Server disconnected without
    sending a response", likely the two CI failures of tests/test_flow_limits.py). The timer is set to 0.2 s here
    so that the test need not idle 5 s: a connection idle five times that long still answers (before the change:
    closed, ConnectionError)."""
    server.server.config.timeout_keep_alive = 0.2  # read by each new connection's protocol
    s = connect(server, sockets)
    for _ in range(2):
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_response(s).startswith(b"HTTP/1.1 200")
        time.sleep(1.0)  # the idle time under test, not a wait for something to happen
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert read_response(s).startswith(b"HTTP/1.1 200")


def test_a_body_that_stalls_or_trickles_is_cut_off(server_factory: Any, sockets: list[socket.socket]) -> None:
    """Past its headers, a request's body must keep coming: at least 1 KiB of it (or its end) within each
    JOBQ_HEADER_TIMEOUT_SECONDS, or 408 and the connection is closed. Otherwise a client holds a connection
    for good by announcing a body and sending none of it, or a byte at a time."""
    server: LiveServer = server_factory(header_timeout_seconds=1)
    head = (b"POST /queues/q/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n")  # fmt: skip
    stalled = connect(server, sockets)
    stalled.sendall(head + b'{"payload": "')
    status, problem = status_and_problem(read_answer(stalled))
    assert (status, problem["type"]) == (408, "urn:jobq:problem:request-timeout")

    trickling = connect(server, sockets)
    trickling.sendall(head + b'{"payload": "')
    sent = 0
    try:
        while sent < 600:  # 30 s of trickling: far past the deadline
            trickling.sendall(b"x")
            sent += 1
            time.sleep(0.05)
    except OSError:  # the server closed the connection: the answer is waiting
        pass
    answer = read_answer(trickling)
    assert answer, f"the connection was still open after {sent} bytes of body"
    status, problem = status_and_problem(answer)
    assert (status, problem["type"]) == (408, "urn:jobq:problem:request-timeout")

    # A slow body that keeps coming is read whole, however long it takes.
    body = json.dumps({"payload": "x" * 30_000}).encode()
    steady = connect(server, sockets)
    steady.sendall(head.replace(b"100000", b"%d" % len(body)))
    for at in range(0, len(body), 2048):
        steady.sendall(body[at : at + 2048])
        time.sleep(0.2)  # 3 s in all, past the 1 s deadline, 2 KiB at a time
    assert read_response(steady).startswith(b"HTTP/1.1 201")


def head_of(size: int, lines: int = 2) -> bytes:
    """A request whose line and headers count exactly `size` bytes as the cap counts them (the target, and each
    header's name and value plus 4), in `lines` header lines (at least 2: Connection: close, and the padding)."""
    target = b"/healthz"
    fixed = [(b"Connection", b"close")] + [(b"X-%d" % i, b"y") for i in range(lines - 2)]
    used = len(target) + sum(len(n) + len(v) + 4 for n, v in fixed) + len(b"X-Pad") + 4
    assert size >= used
    headers = [*fixed, (b"X-Pad", b"p" * (size - used))]
    return b"GET " + target + b" HTTP/1.1\r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in headers) + b"\r\n"


def test_a_pipelined_request_whose_body_stalls_is_cut_off(server_factory: Any, sockets: list[socket.socket]) -> None:
    """A request pipelined behind a long one, its body announced and not sent: once the first is answered, the
    second's body deadline still holds (the first's answer had wiped it: the connection was then held for good)."""
    server: LiveServer = server_factory(header_timeout_seconds=1)
    poll = json.dumps({"worker": "w", "wait_seconds": 2}).encode()
    s = connect(server, sockets)
    s.sendall(b"POST /queues/q/claim HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(poll), poll)
              + b"POST /queues/q/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n")  # fmt: skip
    first = read_response(s)
    assert first.startswith(b"HTTP/1.1 200") and b'"jobs":[]' in first, first
    status, problem = status_and_problem(read_answer(s))  # to the end of file: none came before the fix
    assert (status, problem["type"]) == (408, "urn:jobq:problem:request-timeout")


def test_header_bytes_and_lines_are_capped(server_factory: Any, sockets: list[socket.socket]) -> None:
    """At each cap a request passes, one past it gets 431; a megabyte of headers or 20,000 lines too."""
    server: LiveServer = server_factory(max_header_bytes=4096, max_header_lines=20)
    for request, status in (
        (head_of(4096), 200),
        (head_of(4097), 431),
        (head_of(1000, lines=20), 200),
        (head_of(1000, lines=21), 431),
        (head_of(1_048_576), 431),
        (head_of(400_000, lines=20_000), 431),
    ):
        s = connect(server, sockets)
        with contextlib.suppress(OSError):  # refused before the whole megabyte went out
            s.sendall(request)
        answer = read_answer(s)
        assert answer.startswith(b"HTTP/1.1 %d" % status), (len(request), answer[:200])
        if status == 431:
            assert status_and_problem(answer)[1]["type"] == "urn:jobq:problem:headers-too-large"


def test_past_the_connection_cap_a_request_gets_503_at_once(server_factory: Any, sockets: list[socket.socket]) -> None:
    """Connections each with a request in flight (a body that has not come yet, as a slow client's would be) fill
    the cap; the next connection's request is answered 503 at once instead of waiting for a place, and served
    again once a place is free."""
    server: LiveServer = server_factory(max_connections=16, max_connections_per_client=16, header_timeout_seconds=60)
    state = server.server.server_state
    held = [connect(server, sockets) for _ in range(16)]
    for s in held:  # the request is in flight while the server waits for its body
        s.sendall(BODY_PENDING)
    wait_until(lambda: len(state.connections) == 16, what="16 connections held")
    wait_until(lambda: not any(c.waits_for_a_request for c in state.connections), what="16 requests in flight")
    s = connect(server, sockets)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = read_answer(s)  # and the server closes it
    status, problem = status_and_problem(answer)
    assert (status, problem["type"]) == (503, "urn:jobq:problem:too-many-connections")
    assert b"retry-after: 1" in answer.lower()
    held.pop().close()
    wait_until(lambda: len(state.connections) == 15, what="a place to free up")
    s = connect(server, sockets)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert read_answer(s).startswith(b"HTTP/1.1 200")
    # The connections that were already held are served as usual.
    held[0].sendall(b'{"payload": 1}' + b" " * 86)
    assert read_answer(held[0]).startswith(b"HTTP/1.1 201")


def test_idle_sockets_of_one_client_cannot_keep_another_out(server_factory: Any, sockets: list[socket.socket]) -> None:
    """The review's probe: with JOBQ_MAX_CONNECTIONS=16, 16 kept-alive sockets without a key, each sending
    `GET /healthz` every 4 s, kept a keyed `GET /queues` at 503 `too-many-connections`, 8 times out of 8. A
    newcomer at the cap now takes the place of a connection that waits for its next request, of the client
    holding the most: the keyed request is served, and the idle socket closed is one of the 16."""
    key = "connection-share-key-" + "c" * 32
    server: LiveServer = server_factory(max_connections=16, auth="on", api_key=key, header_timeout_seconds=60)
    state = server.server.server_state
    idle: list[socket.socket] = []
    for attempt in range(8):
        while len(idle) < 16:  # the probe's client keeps its 16 sockets, opening new ones as they are closed
            s = connect(server, sockets)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _answers(s)
            idle.append(s)
        wait_until(lambda: len(state.connections) == 16, what="16 connections held")
        with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {key}"}, timeout=30) as c:
            r = c.get("/queues")
            assert r.status_code == 200, (attempt, r.text)
        for s in idle:  # its healthz every 4 s: one socket of the 16 was closed to make room
            with contextlib.suppress(OSError):
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        idle = [s for s in idle if _answers(s)]
        assert len(idle) == 15, attempt


def _answers(s: socket.socket) -> bool:
    """Whether a kept-alive connection answered its healthz (False: the server closed it)."""
    try:
        return read_response(s).startswith(b"HTTP/1.1 200")
    except OSError:  # ConnectionError included: closed before a whole answer
        return False


def test_a_websocket_handshake_is_answered_as_plain_http(server_factory: Any, sockets: list[socket.socket]) -> None:
    """jobq serves no WebSocket (uvicorn runs with ws="none"): the handshake is the GET it also is, and the
    log says so once, without uvicorn's advice to install a WebSocket library."""
    server = server_factory()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(handler)
    try:
        s = connect(server, sockets)
        s.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        answer = read_response(s)
    finally:
        uvicorn_log.removeHandler(handler)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["status"] == "ok"
    assert [r.getMessage() for r in records] == ["Unsupported upgrade request."]
