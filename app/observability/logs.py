"""Logs: one line per request and per lifecycle event, JSON for machines or text for a person at a terminal
(JOBQ_LOG_FORMAT: `auto` picks text when stdout is a terminal), and the ASGI layer that times, counts and
logs every request under a request id.

Never logged: payloads, results, claim tokens, API keys, request bodies. A request line holds the
request id, the client's address (app/observability/clients.py), method, route template (not the raw path),
status and duration; lifecycle lines hold what
their message says. Access lines bypass the `logging` module's per-record machinery (about 10 µs a
line) and are written in batches: at thousands of requests a second that is a few percent of CPU."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import secrets
import sys
import time
from datetime import UTC, datetime
from typing import IO, Any, Literal

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.observability.clients import ClientAddress
from app.observability.metrics import Metrics
from app.observability.tracing import Tracing

REQUEST_ID_HEADER = b"x-request-id"
# The request metric's `method` label: anything else a client sends counts as OTHER (labels must be bounded).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_SAFE_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


_second = (-1, "")
# "000+00:00" to "999+00:00": the milliseconds and zone of _now(), made once.
_MILLIS = tuple(f"{ms:03d}+00:00" for ms in range(1000))


def _now() -> str:
    """RFC 3339 UTC time with milliseconds; the date and time part is formatted once a second (this
    runs for every request)."""
    global _second
    ms = int(time.time() * 1000)
    whole, frac = divmod(ms, 1000)
    if whole != _second[0]:
        _second = (whole, datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S."))
    return _second[1] + _MILLIS[frac]


LogFormat = Literal["json", "text"]


def resolve_format(setting: str, stream: IO[Any] | None = None) -> LogFormat:
    """JOBQ_LOG_FORMAT as used: `auto` is text when `stream` (stdout) is a terminal, JSON otherwise (a file,
    a pipe, a container's log driver)."""
    if setting in ("json", "text"):
        return setting  # type: ignore[return-value]
    stream = stream if stream is not None else sys.stdout
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # no stdout, or a closed one
        return "json"


def _text_time(rfc3339: str) -> str:
    return rfc3339[:10] + " " + rfc3339[11:23]  # 2026-11-29 23:59:00.123 (UTC, like the JSON lines)


_COLOURS = {"WARNING": "\x1b[33m", "ERROR": "\x1b[31m", "CRITICAL": "\x1b[31;1m"}


class TextFormatter(logging.Formatter):
    """`2026-11-29 23:59:00.123 INFO    jobq: message key=value`, times in UTC; the level coloured on a
    terminal unless NO_COLOR is set."""

    def __init__(self, colour: bool | None = None) -> None:
        super().__init__()
        if colour is None:
            colour = not os.environ.get("NO_COLOR") and resolve_format("auto") == "text"
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        level = f"{record.levelname:<7}"
        if self.colour and record.levelname in _COLOURS:
            level = f"{_COLOURS[record.levelname]}{level}\x1b[0m"
        line = f"{_text_time(when)} {level} {record.name}: {record.getMessage()}"
        extra = [f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD]
        if extra:
            line += "  " + " ".join(extra)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def dict_config(level: str = "info", fmt: LogFormat = "json") -> dict[str, Any]:
    """logging.config.dictConfig for `jobq serve`: lines on stdout for jobq's loggers and uvicorn's, JSON or
    text. Given to uvicorn as log_config, so that every worker process applies it too."""
    formatter = "app.observability.logs.TextFormatter" if fmt == "text" else "app.observability.logs.JsonFormatter"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"lines": {"()": formatter}},
        "handlers": {"stdout": {"class": "logging.StreamHandler", "formatter": "lines", "stream": "ext://sys.stdout"}},
        "root": {"handlers": ["stdout"], "level": level.upper()},
        "loggers": {
            "uvicorn": {"handlers": [], "propagate": True},
            "uvicorn.error": {"handlers": [], "propagate": True},
            # jobq writes its own request lines (Observability below)
            "uvicorn.access": {"handlers": [], "propagate": False, "level": "CRITICAL"},
        },
    }


class AccessLog:
    """Request lines, buffered and written at most every `interval` seconds (or every 64 KiB): JSON, or with
    `fmt="text"` `2026-11-29 23:59:00.123 INFO    POST /queues/{queue}/jobs 201 1.9ms id=...`."""

    def __init__(
        self, enabled: bool, stream: IO[bytes] | None = None, interval: float = 0.2, fmt: LogFormat = "json"
    ) -> None:
        self.enabled = enabled
        self.text = fmt == "text"
        self.stream = stream
        self.interval = interval
        self._buffer: list[bytes] = []
        self._size = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def write(self, doc: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self.text:
            line = (
                f"{_text_time(doc['ts'])} INFO    {doc['method']} {doc['route']} {doc['status']} "
                f"{doc['duration_ms']:.1f}ms id={doc['request_id']}\n"
            ).encode()
        else:
            line = orjson.dumps(doc) + b"\n"
        self._buffer.append(line)
        self._size += len(line)
        if self._size > 65536 or self._closed:
            self.flush()
        elif self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._later())

    async def _later(self) -> None:
        await asyncio.sleep(self.interval)
        self.flush()

    def close(self) -> None:
        """Write what is buffered; from now on every line is written at once (the loop is stopping)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        data, self._buffer, self._size = b"".join(self._buffer), [], 0
        stream = self.stream or sys.stdout.buffer
        try:
            stream.write(data)
            stream.flush()
        except (OSError, ValueError):  # a closed stdout must not take requests down
            pass


class Observability:
    """Outermost ASGI layer: request id (accepted from X-Request-ID when sane, else generated; always
    returned), duration, the request metric, the access line and, when tracing is on, the request's span.
    Works for both HTTP paths."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        access: AccessLog,
        tracing: Tracing | None = None,
        clients: ClientAddress | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.tally = metrics.tally
        self.access = access
        self.tracing = tracing
        self.clients = clients or ClientAddress(())
        self.pid = os.getpid()
        self._histograms: dict[tuple[str, str, int], Any] = {}
        # Request ids: unique, not secret. A random prefix per process and a counter; no syscall per request.
        self._id_prefix = secrets.token_hex(4)
        self._id_counter = itertools.count(1)

    def _next_id(self) -> bytes:
        return f"{self._id_prefix}{next(self._id_counter):08x}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = b""
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                request_id = value if _SAFE_ID.match(value) else b""
                break
        if not request_id:
            request_id = self._next_id()
        rid = request_id.decode()
        scope.setdefault("state", {})["request_id"] = rid
        status = 500
        tracing = self.tracing
        if tracing is not None:
            span, token = tracing.start(scope)

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (REQUEST_ID_HEADER, request_id)]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            duration = time.perf_counter() - start
            route = scope.get("route")
            # The template as the OpenAPI document writes it: /jobs/{job_id}, not /jobs/{job_id:int}.
            template = getattr(route, "path_format", None) or getattr(route, "path", None) or "unmatched"
            method = scope["method"]
            key = (template, method if method in METHODS else "OTHER", status)
            histogram = self._histograms.get(key)
            if histogram is None:  # labels() costs microseconds: look each child up once
                histogram = self._histograms[key] = self.metrics.http_requests.labels(key[0], key[1], str(status))
            self.tally.observe(histogram, duration)
            if self.access.enabled:
                self.access.write(
                    {
                        "ts": _now(),
                        "level": "info",
                        "logger": "jobq.access",
                        "request_id": rid,
                        "client": self.clients.of(scope),
                        "method": method,
                        "route": template,
                        "status": status,
                        "duration_ms": round(duration * 1000, 3),
                        "pid": self.pid,
                    }
                )
            if tracing is not None:
                tracing.finish(span, token, method, template, status, rid)
