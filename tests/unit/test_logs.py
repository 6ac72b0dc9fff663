"""Log lines (app/observability/logs.py): JSON for machines, text for a person at a terminal, and which one
JOBQ_LOG_FORMAT picks."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import sys

import orjson
import pytest

from app.observability.logs import AccessLog, JsonFormatter, TextFormatter, resolve_format

ACCESS = {
    "ts": "2026-11-29T23:59:00.123+00:00",
    "level": "info",
    "logger": "jobq.access",
    "request_id": "abc123",
    "method": "POST",
    "route": "/queues/{queue}/jobs",
    "status": 201,
    "duration_ms": 1.94,
    "pid": 7,
}


def record(msg: str = "moved %d jobs", *args: object, level: int = logging.INFO, **extra: object) -> logging.LogRecord:
    r = logging.LogRecord("jobq.rescuer", level, __file__, 1, msg, args or (3,), None)
    r.__dict__.update(extra)
    return r


def test_auto_is_text_on_a_terminal_and_json_elsewhere() -> None:
    leader, follower = os.openpty()
    with open(follower, "w") as terminal, open(os.devnull, "w") as file:
        assert resolve_format("auto", terminal) == "text"
        assert resolve_format("auto", file) == "json"
        assert resolve_format("json", terminal) == "json"  # forced either way
        assert resolve_format("text", file) == "text"
    os.close(leader)
    closed = io.StringIO()
    closed.close()
    assert resolve_format("auto", closed) == "json"


def test_text_lines_read_as_a_sentence_with_the_extras_after() -> None:
    line = TextFormatter(colour=False).format(record(queue="emails"))
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} INFO    jobq\.rescuer: moved 3 jobs  queue=emails", line
    )
    warning = TextFormatter(colour=True).format(record(level=logging.WARNING))
    assert "\x1b[33mWARNING\x1b[0m jobq.rescuer: moved 3 jobs" in warning
    try:
        raise ValueError("boom")
    except ValueError:
        failed = record(level=logging.ERROR)
        failed.exc_info = sys.exc_info()
    assert TextFormatter(colour=False).format(failed).splitlines()[-1] == "ValueError: boom"


def test_json_lines_carry_the_same_fields() -> None:
    doc = orjson.loads(JsonFormatter().format(record(queue="emails")))
    assert doc["level"] == "info" and doc["logger"] == "jobq.rescuer" and doc["msg"] == "moved 3 jobs"
    assert doc["queue"] == "emails" and doc["ts"].endswith("+00:00")


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_access_lines_in_either_format(fmt: str) -> None:
    stream = io.BytesIO()
    log = AccessLog(True, stream, fmt=fmt)  # type: ignore[arg-type]

    async def write() -> None:
        log.write(dict(ACCESS))
        log.close()

    asyncio.run(write())
    line = stream.getvalue().decode()
    if fmt == "json":
        assert orjson.loads(line) == ACCESS
    else:
        assert line == "2026-11-29 23:59:00.123 INFO    POST /queues/{queue}/jobs 201 1.9ms id=abc123\n"
