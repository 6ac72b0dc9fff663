"""A lean HTTP/1.1 keep-alive client for load generation (raw asyncio streams, no parsing beyond what a
job queue worker needs). httpx spends several times more CPU per request, and on a 2-core machine the
load generator's CPU is taken from the server under test."""

from __future__ import annotations

import asyncio
import contextlib
from typing import ClassVar


class HttpError(RuntimeError):
    pass


class Connection:
    # Sent with every request, e.g. b"Authorization: Bearer ...\r\n" (bench/run.py --auth).
    extra_headers: ClassVar[bytes] = b""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._head = f"Host: {host}:{port}\r\nContent-Type: application/json\r\n".encode() + self.extra_headers

    async def open(self) -> Connection:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()

    async def request(self, method: str, path: str, body: bytes = b"", headers: bytes = b"") -> tuple[int, bytes]:
        """`headers`: more header lines, each ending in CRLF (an SQS request's X-Amz-Target)."""
        assert self._reader is not None and self._writer is not None
        self._writer.write(
            b"%s %s HTTP/1.1\r\n%s%sContent-Length: %d\r\n\r\n%s"
            % (method.encode(), path.encode(), self._head, headers, len(body), body)
        )
        status_line = await self._reader.readline()
        if not status_line:
            raise HttpError("connection closed")
        status = int(status_line.split(b" ", 2)[1])
        length = 0
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        return status, await self._reader.readexactly(length)

    async def post(self, path: str, body: bytes, headers: bytes = b"") -> tuple[int, bytes]:
        return await self.request("POST", path, body, headers)

    async def get(self, path: str) -> tuple[int, bytes]:
        return await self.request("GET", path)
