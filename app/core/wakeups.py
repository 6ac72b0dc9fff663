"""Wake-ups: the one seam through which "jobs may be claimable on these queues" travels, within this
process and to the others.

Built once per process and shared: the enqueue path, fails and releases, admin actions and the lease
rescuer call `jobs_available()`; the claim dispatcher calls `waiter_parked()` when a claim starts
waiting; the LISTEN connection (app/maintenance/listener.py) hands every message it receives to
`received()`.

An enqueue never carries a NOTIFY in its own transaction: NOTIFY takes a cluster-wide lock at commit,
which cost two thirds of enqueue capacity when measured on the reference machine (pgbench, 16 clients, one
listener: INSERT + COMMIT 5.2k tps, with pg_notify 1.7k). Three rules keep wake-ups off the hot path:
  * local waiters are woken in memory, with no NOTIFY at all;
  * a process sends a wake-up only for queues on which another process has announced waiters
    ("presence": announced when a queue gets its first parked claim, renewed while it has any, and
    forgotten after PRESENCE_TTL without renewal). Busy workers do not wait, so a loaded system sends
    no wake-ups;
  * wake-ups are sent after the enqueue has committed, at most one in flight per process and at least
    `notify_min_interval_ms` apart, each naming every queue marked since the last.
A wake-up lost anyway (a listener reconnecting, a presence announcement still in flight) costs at most
one fallback poll interval (app/core/dispatcher.py).

Messages on CHANNEL: "<sender> w q1 q2 ..." jobs arrived; "<sender> p q1 ..." I have waiters on these;
"<sender> h" I (re)started listening, tell me your presence; "keys k" API keys changed (sent by the SQL
that changes them, app/db/keys.py) and "config <queue>" a queue's configuration changed (app/db/flow.py),
both handled by the listener.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Iterable
from typing import Protocol

from app.db.pool import Database

log = logging.getLogger("jobq.wakeup")

CHANNEL = "jobq_wakeup"
PRESENCE_TTL = 6.0  # seconds a presence announcement counts for
RENEW_INTERVAL = PRESENCE_TTL / 3
_MAX_PAYLOAD = 7900  # PostgreSQL's NOTIFY payload limit is 8000 bytes
KEYS_CHANGED = "keys k"
CONFIG_CHANGED = "config"  # + " <queue>"


class LocalWaiters(Protocol):
    """What the seam needs from the claim dispatcher of this process."""

    def wake(self, queues: Iterable[str] | None = None) -> None: ...

    def waiting_queues(self) -> list[str]: ...


class _Nobody:
    def wake(self, queues: Iterable[str] | None = None) -> None:
        pass

    def waiting_queues(self) -> list[str]:
        return []


class Wakeups:
    def __init__(self, db: Database, min_interval_ms: float) -> None:
        self.db = db
        self.sender = secrets.token_hex(6)
        self.min_interval = min_interval_ms / 1000
        self.local: LocalWaiters = _Nobody()
        self.connected = asyncio.Event()  # the LISTEN connection is up
        self.connections = 0  # LISTEN sessions opened so far (reconnects included)
        self.sent = 0
        self.received_count = 0
        self._remote: dict[str, dict[str, float]] = {}  # queue -> sender -> presence expiry (monotonic)
        self._announced: dict[str, float] = {}  # queue -> when this process last announced it
        self._wake: set[str] = set()
        self._present: set[str] = set()
        self._hello = False
        self._sender_task: asyncio.Task[None] | None = None
        self._last_send = 0.0

    def attach(self, local: LocalWaiters) -> None:
        """The claim dispatcher whose waiters this process wakes (once, when the process is wired)."""
        self.local = local

    # -- outgoing -----------------------------------------------------------------------------------------

    def jobs_available(self, queues: Iterable[str]) -> None:
        """Jobs may have become claimable on these queues: wake waiting claims here, and in the processes
        that announced waiters on them."""
        queues = set(queues)
        self.local.wake(queues)
        now = time.monotonic()
        for q in queues:
            waiting = self._remote.get(q)
            if waiting and any(expiry > now for expiry in waiting.values()):
                self._wake.add(q)
        self._kick()

    def waiter_parked(self, queue: str) -> None:
        """A claim on `queue` started waiting here; make sure the other processes know."""
        if time.monotonic() - self._announced.get(queue, -1e9) > RENEW_INTERVAL:
            self._present.add(queue)
            self._kick()

    def remote_waiters(self, queue: str) -> bool:
        """Another process has announced waiters on `queue` (and the announcement has not expired)."""
        now = time.monotonic()
        return any(expiry > now for expiry in self._remote.get(queue, {}).values())

    def announced(self, queue: str) -> bool:
        """This process has told the others that it waits on `queue`."""
        return queue in self._announced

    def idle(self) -> bool:
        """Nothing queued to send and nothing on its way."""
        return not (self._hello or self._present or self._wake) and (
            self._sender_task is None or self._sender_task.done()
        )

    def _kick(self) -> None:
        if (self._wake or self._present or self._hello) and (self._sender_task is None or self._sender_task.done()):
            self._sender_task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while self._wake or self._present or self._hello:
            pause = self._last_send + self.min_interval - time.monotonic()
            if pause > 0 and self._wake and not (self._present or self._hello):
                await asyncio.sleep(pause)
            messages: list[str] = []
            if self._hello:
                messages.append(f"{self.sender} h")
                self._hello = False
            present, self._present = sorted(self._present), set()
            wake, self._wake = sorted(self._wake), set()
            messages += _payloads(f"{self.sender} p", present)
            messages += _payloads(f"{self.sender} w", wake)
            self._last_send = time.monotonic()
            try:
                async with self.db.connection() as conn:
                    for payload in messages:
                        await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
                        self.sent += 1
            except Exception:
                # Other processes fall back to their poll interval; nothing is lost.
                log.warning("could not send %d wake-up message(s)", len(messages), exc_info=True)
                continue
            now = time.monotonic()
            for q in present:
                self._announced[q] = now
            if present:
                # Jobs enqueued elsewhere before our announcement arrived got no wake-up: look once more.
                self.local.wake(present)

    def renew(self) -> None:
        """Every RENEW_INTERVAL: announce again the queues still waited on here, forget stale presence."""
        now = time.monotonic()
        for q in self.local.waiting_queues():
            if now - self._announced.get(q, -1e9) > RENEW_INTERVAL * 0.9:
                self._present.add(q)
        for q in [q for q, t in self._announced.items() if now - t > PRESENCE_TTL]:
            del self._announced[q]
        for q in list(self._remote):
            live = {s: e for s, e in self._remote[q].items() if e > now}
            if live:
                self._remote[q] = live
            else:
                del self._remote[q]
        self._kick()

    # -- incoming ---------------------------------------------------------------------------------------------

    def listening(self) -> None:
        """The LISTEN connection is (again) up: ask the others for their presence, announce ours, and look
        at every queue once, for whatever was announced while we were not listening."""
        self.connections += 1
        self.connected.set()
        self._hello = True
        self._present.update(self.local.waiting_queues())
        self._kick()
        self.local.wake(None)

    def deaf(self) -> None:
        self.connected.clear()

    def received(self, payload: str) -> None:
        self.received_count += 1
        sender, _, rest = payload.partition(" ")
        if sender == self.sender:
            return
        kind, _, names = rest.partition(" ")
        queues = names.split(" ") if names else []
        if kind == "w":
            self.local.wake(queues)
        elif kind == "p":
            expiry = time.monotonic() + PRESENCE_TTL
            for q in queues:
                self._remote.setdefault(q, {})[sender] = expiry
        elif kind == "h":
            self._present.update(self.local.waiting_queues())
            self._kick()

    async def aclose(self) -> None:
        if self._sender_task is not None:
            await asyncio.gather(self._sender_task, return_exceptions=True)


def _payloads(prefix: str, queues: list[str]) -> list[str]:
    """'<prefix> q1 q2 ...' split under the NOTIFY size limit (queue names hold no spaces)."""
    out: list[str] = []
    chunk = prefix
    for q in queues:
        if len(chunk) + 1 + len(q) > _MAX_PAYLOAD:
            out.append(chunk)
            chunk = prefix
        chunk += " " + q
    if chunk != prefix:
        out.append(chunk)
    return out
