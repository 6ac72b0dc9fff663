"""Wake-ups across processes: one LISTEN connection per process, and NOTIFY sent off the hot path.

An enqueue never carries a NOTIFY in its own transaction: NOTIFY takes a cluster-wide lock at commit,
which measured here cost two thirds of enqueue capacity (DESIGN.md). Instead, after the enqueue has
committed, the queue name is handed to the publisher. It sends one NOTIFY naming every queue marked
since the last one, with at most one in flight and at least `notify_min_interval_ms` between two, so an
idle system wakes a remote waiter within one round trip while a busy one sends a few hundred small
NOTIFYs a second however many jobs it enqueues. Local waiters are woken in memory, without NOTIFY.
A lost notification costs at most one fallback poll interval (app/broker.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Iterable

import psycopg

from app.db import Database

log = logging.getLogger("jobq.wakeup")

CHANNEL = "jobq_wakeup"
_MAX_PAYLOAD = 7900  # PostgreSQL's NOTIFY payload limit is 8000 bytes


class Publisher:
    """Coalesces "jobs arrived on queue X" into few NOTIFYs for the other jobq processes."""

    def __init__(self, db: Database, sender: str, min_interval_ms: float) -> None:
        self.db = db
        self.sender = sender
        self.min_interval = min_interval_ms / 1000
        self.sent = 0
        self._marked: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._last = 0.0

    def publish(self, queues: Iterable[str]) -> None:
        self._marked.update(queues)
        if self._marked and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while self._marked:
            pause = self._last + self.min_interval - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            queues, self._marked = sorted(self._marked), set()
            self._last = time.monotonic()
            try:
                async with self.db.connection() as conn:
                    for payload in _payloads(self.sender, queues):
                        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
                        self.sent += 1
            except Exception:
                # Other processes fall back to their poll interval; nothing is lost.
                log.warning("could not send wake-up NOTIFY for %d queue(s)", len(queues), exc_info=True)

    async def aclose(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


def _payloads(sender: str, queues: list[str]) -> Iterable[str]:
    """'<sender> q1 q2 ...' split under the NOTIFY size limit (queue names hold no spaces)."""
    chunk = sender
    for q in queues:
        if len(chunk) + 1 + len(q) > _MAX_PAYLOAD:
            yield chunk
            chunk = sender
        chunk += " " + q
    if chunk != sender:
        yield chunk


class Listener:
    """Holds the process's LISTEN connection; reconnects by itself and, after any gap, wakes every
    queue (notifications sent during the gap are lost)."""

    def __init__(self, url: str, sender: str, on_wake: Callable[[list[str] | None], None]) -> None:
        self.url = url
        self.sender = sender
        self.on_wake = on_wake
        self.connected = asyncio.Event()
        self.received = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=5,
                    application_name="jobq-listener",
                    keepalives=1,
                    keepalives_idle=10,
                    keepalives_interval=5,
                    keepalives_count=3,
                )
            except Exception as exc:
                log.warning("listener cannot connect (%s); retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.connected.set()
                    backoff = 0.1
                    self.on_wake(None)  # whatever was announced while we were not listening
                    async for note in conn.notifies():
                        self.received += 1
                        sender, _, rest = note.payload.partition(" ")
                        if sender != self.sender and rest:
                            self.on_wake(rest.split(" "))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("listener connection lost (%s); reconnecting", exc)
            finally:
                self.connected.clear()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def new_sender_id() -> str:
    return secrets.token_hex(6)
