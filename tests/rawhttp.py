"""HTTP/1.1 by hand over raw sockets, for the tests that need to see what goes on the wire (how an answer is cut
into writes, when the server closes) where an HTTP client would hide it. The `sockets` fixture (tests/conftest.py)
closes what `connect` opened."""

from __future__ import annotations

import socket

from tests.support import LiveServer

READ_TIMEOUT = 30  # a socket read never waits longer: a server that holds on fails the test, never hangs it


def connect(server: LiveServer, opened: list[socket.socket]) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=READ_TIMEOUT)
    opened.append(s)
    return s


def read_answer(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def read_head(s: socket.socket) -> bytes:
    """What comes up to the end of an answer's head (a HEAD's or a 204's whole answer, or a 100 Continue), with any
    bytes already in after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += _more(s, data)
    return data


def read_response(s: socket.socket) -> bytes:
    """One answer on a kept-alive connection: its head, then Content-Length bytes of body."""
    data = read_head(s)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += _more(s, data + body)
    return head + b"\r\n\r\n" + body


def _more(s: socket.socket, so_far: bytes) -> bytes:
    chunk = s.recv(65536)
    if not chunk:
        raise ConnectionError(f"the server closed the connection before a whole answer; had {so_far!r}")
    return chunk
