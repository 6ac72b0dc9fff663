"""An answer's head and body in one write (app/runtime/connections.py OneWrite), with raw sockets: every answer
arrives whole and in order, whatever its shape, and every connection that should close does.

Unlike tests/test_connections.py this file runs on both CI runs: it is about the event loop's transport, which
differs between Python 3.11 (the PostgreSQL 15 run) and 3.12 (the PostgreSQL 18 run), and it is quick."""

from __future__ import annotations

import json
import socket

import httpx

from tests.rawhttp import connect, read_answer, read_head, read_response
from tests.support import LiveServer


def test_answers_come_whole_in_one_segment_and_in_order(server: LiveServer, sockets: list[socket.socket]) -> None:
    """An answer's head and body leave in one write (app/runtime/connections.py OneWrite), and nothing written is held
    back: an answer without a body (HEAD), a lone `100 Continue`, pipelined answers, and an answer before a close all
    arrive, in order, without the client sending anything more."""
    s = connect(server, sockets)
    # One write of a few hundred bytes on the loopback is one segment: the first read has all of it.
    for _ in range(3):
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = s.recv(65536)
        head, _, body = first.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and json.loads(body)["status"] == "ok", first
    # HEAD: a head and no body; what is held goes out at the end of the loop's turn.
    s.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = read_head(s)
    assert data.startswith(b"HTTP/1.1 ") and data.endswith(b"\r\n\r\n"), data
    # Two requests in one send: two answers, in order.
    s.sendall(
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /queues/q/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    assert b'"status":"ok"' in read_response(s)
    assert b'"queue":"q"' in read_response(s)
    # Expect: 100-continue: the interim answer comes alone, before the body is sent.
    body = json.dumps({"payload": {"n": 1}}).encode()
    s.sendall(b"POST /queues/q/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))  # fmt: skip
    interim = read_head(s)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
    s.sendall(body)
    assert read_response(s).startswith(b"HTTP/1.1 201")
    # The last answer before a close is all there.
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    head, _, body = read_answer(s).partition(b"\r\n\r\n")
    length = next(
        int(v) for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")) if k == b"content-length"
    )
    assert head.startswith(b"HTTP/1.1 200") and len(body) == length and json.loads(body)["status"] == "ok", body


def test_a_client_that_half_closes_after_its_request_gets_its_whole_answer(
    server: LiveServer, sockets: list[socket.socket]
) -> None:
    """A client may shut its side once its request is sent (`nc -N`, a probe): the server's side then closes itself
    on the end of file, and what the answer's last write left held must go out first (a HEAD's head, whose body is
    never written, is such a write)."""
    for method in (b"HEAD", b"GET"):
        s = connect(server, sockets)
        s.sendall(method + b" /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        answer = read_answer(s)
        head, sep, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 ") and sep, (method, answer)
        assert (body == b"") if method == b"HEAD" else (json.loads(body)["status"] == "ok"), (method, answer)


def test_an_answer_without_a_body_before_a_close_closes_the_connection(
    server: LiveServer, sockets: list[socket.socket]
) -> None:
    """A 204 has an empty body, which uvicorn still writes (b""). Passed on beside the head in one writelines,
    Python 3.12's transport kept an empty buffer it never sent and never finished the close it waited for: the
    client had its answer and then no end of file, and the server's shutdown waited on the connection."""
    for connection in (b"close", b"keep-alive"):
        r = server.client.put("/schedules/nightly", json={"queue": "q", "cron": "0 3 * * *", "payload": None})
        assert r.status_code in (200, 201), r.text
        s = connect(server, sockets)
        s.sendall(b"DELETE /schedules/nightly HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: " + connection + b"\r\n\r\n")
        if connection == b"close":
            answer = read_answer(s)  # to the end of file: none came before the fix (the read timed out)
            assert answer.startswith(b"HTTP/1.1 204 ") and answer.endswith(b"\r\n\r\n"), answer
            continue
        # Kept alive: the 204, then another answer on the same connection.
        head = read_head(s)
        assert head.startswith(b"HTTP/1.1 204 ") and head.endswith(b"\r\n\r\n"), head
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert b'"status":"ok"' in read_response(s)
    assert httpx.get(f"{server.url}/healthz").status_code == 200
