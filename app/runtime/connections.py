"""Bounded HTTP connections: uvicorn's httptools protocol with a deadline for a request's headers, caps on
their size and number, and a cap on the connections one process holds.

uvicorn alone keeps a connection that sends nothing open forever (its keep-alive timer starts only after a
first answer), restarts that timer on every byte (one header line every few seconds holds a connection
for good), reads headers of any size, and answers past `limit_concurrency` only once the request's headers
are in. Here:
  * the request line and headers must be complete within JOBQ_HEADER_TIMEOUT_SECONDS of the connection's
    start or of the previous answer, however the bytes trickle in; then 408 (or, with nothing received,
    the connection is just closed);
  * past its headers, a request's body must keep coming: at least BODY_PROGRESS_BYTES of it (or its end)
    within each JOBQ_HEADER_TIMEOUT_SECONDS, or 408 and the connection is closed, so that announcing a body
    and sending none of it, or a byte at a time, holds no connection for good (a body the server has not
    asked for yet, held back by flow control or `Expect: 100-continue`, is not waited on);
  * past JOBQ_MAX_HEADER_BYTES of request line and headers, or JOBQ_MAX_HEADER_LINES header lines: 431;
  * a connection that arrives while the process already holds JOBQ_MAX_CONNECTIONS takes the place of one
    that waits for its next request (kept alive and idle, or still sending its headers), of the client
    address that holds the most connections: that one is closed (answered 503 `too-many-connections` when
    part of a request had come). Keep-alive connections are a convenience a server may end at any time
    (uvicorn's own keep-alive timeout does); so one client's idle sockets cannot keep every other client
    out. Only when every connection has a request in flight is the newcomer answered 503
    `too-many-connections` as soon as its request's headers are in, and closed: it never waits for a place.
    How many requests in flight one client may hold is the ASGI layer's business (app/http/quotas.py).
Each refusal is problem+json, like every other answer. `jobq serve` and the tests' server use it
(app/runtime/server.py `server_config`); a uvicorn started by hand does not, and then none of these bounds
hold.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from starlette.types import Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from app.errors import AppError, HeadersTooLarge, RequestTimeout, TooManyConnections
from app.problems import problem_response
from app.settings import Settings

log = logging.getLogger("jobq.http")

# After a refusal sent while the client may still be sending (a megabyte of headers), the connection is
# half-closed and what still arrives is read and dropped for up to this long: closing at once would make
# the kernel answer the unread bytes with a reset, and the client would never see the refusal.
LINGER_SECONDS = 2.0
WATCH_INTERVAL = 0.25  # how often header deadlines are looked at: a deadline holds to within this
BODY_PROGRESS_BYTES = 1024  # of a body, that must arrive within each header timeout (or the body's end)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout: float
    max_header_bytes: int
    max_header_lines: int
    max_connections: int

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        return cls(
            settings.header_timeout_seconds,
            settings.max_header_bytes,
            settings.max_header_lines,
            settings.connection_cap,
        )


def _peer(conn: object) -> str:
    """A connection's client address (its peer: a proxy's connections all have the proxy's)."""
    client = getattr(conn, "client", None)
    return str(client[0]) if client else ""


class _HeadersOverCap(Exception):
    """Raised in a parser callback to stop reading a request whose headers passed a cap."""


async def _too_many_connections(scope: Scope, receive: Receive, send: Send) -> None:
    response = problem_response(TooManyConnections(), scope.get("path"))
    response.headers["connection"] = "close"
    await response(scope, receive, send)


def raw_problem(err: AppError) -> bytes:
    """A whole problem+json answer that closes the connection, for the refusals made before any ASGI app
    runs."""
    body = err.render()
    head = [STATUS_LINE[err.status], b"content-type: application/problem+json\r\n"]
    head += [f"{name}: {value}\r\n".encode("latin-1") for name, value in err.headers().items()]
    head += [b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n"]
    return b"".join(head) + body


class _Watchdog:
    """One per server while it has connections: every WATCH_INTERVAL it ends those whose header deadline has
    passed. A deadline is a number a connection sets and clears; no timer is made and cancelled per request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, state: ServerState) -> None:
        self.loop = loop
        self.state = state
        loop.call_later(WATCH_INTERVAL, self.tick)

    def tick(self) -> None:
        now = self.loop.time()
        for conn in list(self.state.connections):
            if not isinstance(conn, BoundedHttpToolsProtocol):
                continue
            if conn.head_deadline is not None and conn.head_deadline <= now:
                conn.headers_late()
            elif conn.body_deadline is not None and conn.body_deadline <= now:
                conn.body_late()
        if self.state.connections:
            self.loop.call_later(WATCH_INTERVAL, self.tick)
        else:  # no connection left: the next one starts another
            self.state.jobq_watchdog = None  # type: ignore[attr-defined]


class OneWrite:
    """The transport as the protocol and its requests' cycles write to it: a write is held until the next one, and
    both go to the socket in one system call, or until the end of the loop's turn (call_soon), whichever comes
    first. uvicorn writes an answer's status line and headers, then its body: two system calls a request, each a
    trip through the loopback's TCP stack (uvloop writes at once; measured here 9.7 µs of the sender's CPU for the
    two against 5.2 for one, BENCHMARKS.md "Stop 46"). Every write goes through here in order, and close and
    write_eof send what is held first, so the bytes on the wire are the same, only in fewer segments."""

    __slots__ = ("_held", "_loop", "_scheduled", "_vectored", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._scheduled = False
        self._vectored = type(transport).__module__.startswith("uvloop")

    def write(self, data: bytes) -> None:
        if not data:
            # Nothing to send (uvicorn writes an empty body as b""): asyncio's and uvloop's write drop it too.
            # Passed on in writelines it would be worse than nothing on Python 3.12 and 3.13's selector transport
            # (3.12.1 and 3.13.0 here): an empty buffer that sendmsg never takes off, the writer called again and
            # again, and a close that waits for it for good (tests/test_one_write.py: a 204 before a close).
            return
        held = self._held
        if held is not None:
            self._held = None
            transport = self.transport
            if self._vectored and not transport.is_closing():
                # uvloop (what `jobq serve` runs): writelines, not one write of the two joined, no copy of the body
                # (a batch's answer can be hundreds of KB); it sends both buffers at once, one writev.
                transport.writelines((held, data))
            else:
                # asyncio's transports: one write of the two joined, as Python 3.11's own writelines does. Python
                # 3.12's and 3.13's writelines raises once the transport is closing (a closing transport's write
                # drops the bytes, on every loop), and before 3.12.9 / 3.13.2 it skipped the writer's flow control
                # (CPython gh-127655: pause_writing never came for a slow reader).
                transport.write(held + data)
        else:
            self._held = data
            if not self._scheduled:
                self._scheduled = True
                self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        held = self._held
        if held is not None:
            self._held = None
            if not self.transport.is_closing():  # lost meanwhile: uvicorn writes nothing to a lost connection
                self.transport.write(held)

    def writelines(self, data: Any) -> None:
        self.write(b"".join(data))

    def write_eof(self) -> None:
        self.flush()
        self.transport.write_eof()

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        self._held = None
        self.transport.abort()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # get_extra_info, pause_reading, can_write_eof...
        return getattr(self.transport, name)


# BoundedHttpToolsProtocol.on_response_complete is uvicorn's own less one line: if uvicorn's changes, say so here
# at import (the tests import this) rather than serve a connection wrongly.
_UVICORN_NAMES = set(HttpToolsProtocol.on_response_complete.__code__.co_names)
_REPLICATED = {"total_requests", "resume_reading", "pipeline", "_start_asgi_task", "timeout_keep_alive_task"}
if not _REPLICATED <= _UVICORN_NAMES:
    raise ImportError("uvicorn's HttpToolsProtocol.on_response_complete changed: review BoundedHttpToolsProtocol's")


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, held to the ConnectionLimits that server_config() puts on the config
    (`config.jobq_limits`). It adds a few attribute updates per request: the request path is the hot path."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits: ConnectionLimits = config.jobq_limits  # type: ignore[attr-defined]
        self.limits = limits
        self._max_bytes = limits.max_header_bytes
        self._max_lines = limits.max_header_lines
        # loop.time() by which the next request's line and headers must be in; None while a request runs.
        self.head_deadline: float | None = None
        # loop.time() by which more of the request's body must be in; None when it is all in (or none is due).
        self.body_deadline: float | None = None
        self._body_progress = 0  # bytes of body since the body deadline was last set
        self._head_bytes = 0  # of the request being read: counted from its target and each header
        self._head_lines = 0
        self._over: AppError | None = None

    # -- the header deadline -------------------------------------------------------------------------------

    def _arm(self) -> None:
        self.head_deadline = self.loop.time() + self.limits.header_timeout
        if getattr(self.server_state, "jobq_watchdog", None) is None:
            self.server_state.jobq_watchdog = _Watchdog(self.loop, self.server_state)  # type: ignore[attr-defined]

    def headers_late(self) -> None:
        self.head_deadline = None
        if self.transport.is_closing():
            return
        if self._head_bytes:  # a request had begun: say why it ends
            self._refuse(RequestTimeout())
        else:
            self.transport.close()

    def body_late(self) -> None:
        self.body_deadline = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or cycle.response_complete or not cycle.more_body:
            return
        # We are not asking for more, or the request waits behind another (pipelined: its answer must come after
        # the one before, and a long-poll before it reads on to see a disconnect): wait.
        if self.flow.read_paused or cycle.waiting_for_100_continue or self.pipeline:
            self.body_deadline = self.loop.time() + self.limits.header_timeout
            return
        if cycle.response_started:
            self.transport.close()
        else:
            self._refuse(RequestTimeout("The request body stopped coming: send it at a steady pace."))
        # The application reading the body learns that the client is gone, and whatever it answers is dropped.
        cycle.disconnected = True
        cycle.message_event.set()

    def _refuse(self, err: AppError) -> None:
        """Answer `err` and close, letting the client read the answer (see LINGER_SECONDS)."""
        self._over = err
        self.head_deadline = None
        self.transport.write(raw_problem(err))
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)
        else:
            self.transport.close()

    # -- protocol callbacks -------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = OneWrite(transport, self.loop)  # type: ignore[assignment]
        if len(self.connections) > self.limits.max_connections:
            victim = self._waiting_connection()
            if victim is not None:
                victim.give_up_place()
            else:
                self.app = _too_many_connections  # this connection only
                log.warning("connection cap reached (%d): refusing a connection", self.limits.max_connections)
        self._arm()

    @property
    def waits_for_a_request(self) -> bool:
        """Between requests (kept alive), or still sending a request's line and headers: no request runs."""
        return self.head_deadline is not None and not self.transport.is_closing() and self._over is None

    def _waiting_connection(self) -> BoundedHttpToolsProtocol | None:
        """The connection to close for a newcomer at the cap: of those waiting for a request, one of the client
        address that holds the most connections; of its, one with nothing of a request yet, the longest idle."""
        held: dict[str, int] = {}
        for conn in self.connections:
            peer = _peer(conn)
            held[peer] = held.get(peer, 0) + 1
        best: BoundedHttpToolsProtocol | None = None
        best_key: tuple[int, bool, float] | None = None
        for conn in self.connections:
            if conn is self or not isinstance(conn, BoundedHttpToolsProtocol) or not conn.waits_for_a_request:
                continue
            key = (held[_peer(conn)], conn._head_bytes == 0, -(conn.head_deadline or 0.0))
            if best_key is None or key > best_key:
                best, best_key = conn, key
        return best

    def give_up_place(self) -> None:
        """Closed for a newcomer at the cap (see _waiting_connection)."""
        log.info(
            "connection cap reached (%d): closing a connection that waits for a request", self.limits.max_connections
        )
        if self._head_bytes:  # part of a request came: say why it ends
            self._refuse(TooManyConnections())
        else:
            self.head_deadline = None
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.head_deadline = self.body_deadline = None
        super().connection_lost(exc)

    def eof_received(self) -> None:
        # The client shut its side: the transport closes itself once this returns (None), and OneWrite's flush then
        # finds it closing. What is held (a HEAD's head, which no body write follows) goes out first.
        self.transport.flush()  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self._over is None:  # once refused, what still arrives is dropped
            HttpToolsProtocol.data_received(self, data)

    def send_400_response(self, msg: str) -> None:
        if self._over is not None:  # a cap stopped the parser, which uvicorn takes for a malformed request
            if not self.transport.is_closing():
                self._refuse(self._over)
            return
        super().send_400_response(msg)

    def _unsupported_upgrade_warning(self) -> None:
        # server_config turns WebSocket off on purpose, so uvicorn's advice to install a WebSocket library,
        # logged for every such request, is wrong here: the request is served as the plain HTTP request it
        # also is, with the one warning uvicorn gives any other upgrade.
        self.logger.warning("Unsupported upgrade request.")

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        if self._head_bytes > self._max_bytes:
            self._over_cap()
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        self._head_lines += 1
        if self._head_bytes > self._max_bytes or self._head_lines > self._max_lines:
            self._over_cap()
        HttpToolsProtocol.on_header(self, name, value)

    def _over_cap(self) -> None:
        self._over = HeadersTooLarge(
            f"Send at most {self._max_bytes} bytes of request line and headers, in at most {self._max_lines} "
            "header lines."
        )
        raise _HeadersOverCap

    def on_headers_complete(self) -> None:
        self.head_deadline = None
        self._head_bytes = self._head_lines = 0
        HttpToolsProtocol.on_headers_complete(self)
        # Cleared by on_message_complete when the body is all in (at once, for a request without one).
        self.body_deadline = self.loop.time() + self.limits.header_timeout
        self._body_progress = 0

    def on_body(self, body: bytes) -> None:
        self._body_progress += len(body)
        if self._body_progress >= BODY_PROGRESS_BYTES and self.body_deadline is not None:
            self.body_deadline = self.loop.time() + self.limits.header_timeout
            self._body_progress = 0
        HttpToolsProtocol.on_body(self, body)

    def on_message_complete(self) -> None:
        self.body_deadline = None
        HttpToolsProtocol.on_message_complete(self)

    def on_response_complete(self) -> None:
        # uvicorn's (HttpToolsProtocol.on_response_complete, as of 0.55; checked at import above) less its
        # keep-alive timer. uvicorn closes a connection idle for `timeout_keep_alive`, 5 s by default, which is
        # also how long httpx (and so the Python SDK) keeps an idle connection for reuse: a request sent on it
        # as the server closes it is lost ("Server disconnected without sending a response"; the likely cause
        # of two CI failures in tests/test_flow_limits.py, whose shared client posts after a test's few
        # seconds). Here an idle kept-alive connection lasts until its next request's header deadline,
        # JOBQ_HEADER_TIMEOUT_SECONDS (10 s) from the answer, as that setting says, longer than the common
        # clients keep one (httpx 5 s, Node's 4 s); the watchdog closes it then, and a newcomer at the
        # connection cap can take its place before. No timer is made and cancelled per request.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            # A request whose headers are already in starts now: no header deadline. The body deadline, if any,
            # is that of the newest request (self.cycle), whose body may still be coming: it stays.
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.body_deadline = None  # a body still coming is dropped; the next request's deadline covers it
            self._arm()
