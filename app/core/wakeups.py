"""Wake-ups: the one seam through which "jobs may be claimable on these queues" and "these jobs have
finished" travel, within this process and to the others.

Built once per process and shared: what a write moved decides which of `jobs_available()` and
`jobs_finished()` it calls, in one table (app/core/effects.py; a pause lifted and a configuration changed
call `jobs_available()` themselves: they move no job); the claim dispatcher calls `waiter_parked()` when
a claim starts waiting, and the result waiters (app/core/results.py) `job_waiter_parked()` when a request
starts waiting for a job; the LISTEN connection (app/maintenance/listener.py) hands every message it
receives to `received()`.

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

A wait for a job's result is a waiter like a claim, on the job rather than a queue: its presence is
announced under the name "#<id>" (no queue name holds "#"), and a finish sends a wake-up only to a
process that announced it. So a finished job costs a NOTIFY only when a request on another process is
waiting for exactly that job.

Messages on CHANNEL (its names: app/db/channels.py): "<sender> w q1 q2 ... #id ..." jobs arrived on
queues q1, q2, job id finished; "<sender> p q1 ... #id ..." I have waiters on these; "<sender> h" I
(re)started listening, tell me your presence; "keys k" API keys changed (sent by the SQL that changes
them, app/db/keys.py) and "config <queue>" a queue's configuration changed (app/db/flow.py), both
handled by the listener; "sql d <queue> id ..." jobs of <queue> that wait for others were committed by an
SQL enqueue (migrations/0045_sql_enqueue.sql), whose parents the dependency release marks
(app/core/dependencies.py enqueued). A process of a release before this one ignores "d" messages: the
periodic reconciliation then releases those jobs.

Every message but the SQL enqueue's ("sql w", "sql d", sent at its caller's commit) comes from a process's
own session: no statement of the service sends one (the dependency release, which once did from a trigger,
reports its moves through app/core/effects.py like every write path). A previous release's trigger sent
"db w ..."; it is taken like any other process's message.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

from app.db.channels import CHANNEL, JOB
from app.db.pool import Database
from app.db.spread import logical

log = logging.getLogger("jobq.wakeup")

PRESENCE_TTL = 6.0  # seconds a presence announcement counts for
RENEW_INTERVAL = PRESENCE_TTL / 3
_MAX_PAYLOAD = 7900  # PostgreSQL's NOTIFY payload limit is 8000 bytes


class LocalWaiters(Protocol):
    """What the seam needs from the claim dispatcher of this process."""

    def wake(self, queues: Iterable[str] | None = None) -> None: ...

    def look(self, queues: Iterable[str] | None = None) -> None: ...

    def waiting_queues(self) -> list[str]: ...


class LocalResultWaiters(Protocol):
    """What the seam needs from the requests waiting for jobs to finish in this process."""

    def wake_jobs(self, ids: Iterable[int] | None = None) -> None: ...

    def waited_jobs(self) -> list[int]: ...


class _Nobody:
    def wake(self, queues: Iterable[str] | None = None) -> None:
        pass

    def look(self, queues: Iterable[str] | None = None) -> None:
        pass

    def waiting_queues(self) -> list[str]:
        return []

    def wake_jobs(self, ids: Iterable[int] | None = None) -> None:
        pass

    def waited_jobs(self) -> list[int]:
        return []


class Wakeups:
    def __init__(self, db: Database, min_interval_ms: float) -> None:
        self.db = db
        self.sender = secrets.token_hex(6)
        self.min_interval = min_interval_ms / 1000
        self.local: LocalWaiters = _Nobody()
        self.results: LocalResultWaiters = _Nobody()
        # "d" messages: the dependency release's (app/core/dependencies.py enqueued), set when it is built.
        self.dependants_enqueued: Callable[[str, list[int]], None] = lambda queue, jobs: None
        self.connected = asyncio.Event()  # the LISTEN connection is up
        self.connections = 0  # LISTEN sessions opened so far (reconnects included)
        self.sent = 0
        self.received_count = 0
        self._remote: dict[str, dict[str, float]] = {}  # queue -> sender -> presence expiry (monotonic)
        self._remote_jobs: dict[int, dict[str, float]] = {}  # job id -> sender -> presence expiry
        self._announced: dict[str, float] = {}  # queue -> when this process last announced it
        self._wake: set[str] = set()
        self._present: set[str] = set()
        self._hello = False
        self._sender_task: asyncio.Task[None] | None = None
        self._last_send = 0.0

    def attach(self, local: LocalWaiters, results: LocalResultWaiters | None = None) -> None:
        """The claim dispatcher and the result waiters this process wakes (once, when it is wired)."""
        self.local = local
        if results is not None:
            self.results = results

    # -- outgoing -----------------------------------------------------------------------------------------

    def jobs_available(self, queues: Iterable[str]) -> None:
        """Jobs may have become claimable on these queues: wake waiting claims here, and in the processes
        that announced waiters on them."""
        queues = set(queues)
        self.local.wake(queues)  # a spread queue's keys by name: the dispatcher takes from those first
        now = time.monotonic()
        # Waiters wait on a queue, never on a key of a spread queue (app/db/spread.py): announced, and woken, by
        # the queue's name.
        for q in {logical(n) for n in queues}:
            waiting = self._remote.get(q)
            if waiting and any(expiry > now for expiry in waiting.values()):
                self._wake.add(q)
        self._kick()

    def jobs_finished(self, ids: Sequence[int]) -> None:
        """These jobs reached a final status (completed, failed or cancelled): wake the requests waiting for
        them here, and in the processes that announced waiters on them."""
        if not ids:
            return
        self.results.wake_jobs(ids)
        if self._remote_jobs:
            now = time.monotonic()
            for i in ids:
                waiting = self._remote_jobs.get(i)
                if waiting and any(expiry > now for expiry in waiting.values()):
                    self._wake.add(f"{JOB}{i}")
            self._kick()

    def job_waiter_parked(self, job_id: int) -> None:
        """A request started waiting for this job here; make sure the other processes know."""
        self.waiter_parked(f"{JOB}{job_id}")

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
                # Jobs enqueued (or finished) elsewhere before our announcement arrived got no wake-up:
                # look once more. For queues, one statement asks which have jobs ready (a renewal
                # re-announces every waited queue every RENEW_INTERVAL: a claim on each would cost one
                # statement per queue, however idle).
                queues, ids = _split(present)
                if queues:
                    self.local.look(queues)
                if ids:
                    self.results.wake_jobs(ids)

    def renew(self) -> None:
        """Every RENEW_INTERVAL: announce again the queues still waited on here, forget stale presence."""
        now = time.monotonic()
        for q in self._waited_here():
            if now - self._announced.get(q, -1e9) > RENEW_INTERVAL * 0.9:
                self._present.add(q)
        for q in [q for q, t in self._announced.items() if now - t > PRESENCE_TTL]:
            del self._announced[q]
        _forget_expired(self._remote, now)
        _forget_expired(self._remote_jobs, now)
        self._kick()

    def _waited_here(self) -> list[str]:
        """The names this process has waiters on: queues, and "#<id>" for jobs."""
        return [*self.local.waiting_queues(), *(f"{JOB}{i}" for i in self.results.waited_jobs())]

    def _wake_here(self, names: Iterable[str]) -> None:
        queues, ids = _split(names)
        if queues:
            self.local.wake(queues)
        if ids:
            self.results.wake_jobs(ids)

    # -- incoming ---------------------------------------------------------------------------------------------

    def listening(self) -> None:
        """The LISTEN connection is (again) up: ask the others for their presence, announce ours, and look
        at every queue once, for whatever was announced while we were not listening."""
        self.connections += 1
        self.connected.set()
        self._hello = True
        self._present.update(self._waited_here())
        self._kick()
        self.local.look(None)
        self.results.wake_jobs(None)

    def deaf(self) -> None:
        self.connected.clear()

    def received(self, payload: str) -> None:
        self.received_count += 1
        sender, _, rest = payload.partition(" ")
        if sender == self.sender:
            return
        kind, _, names = rest.partition(" ")
        listed = names.split(" ") if names else []
        if kind == "w":
            self._wake_here(listed)
        elif kind == "p":
            expiry = time.monotonic() + PRESENCE_TTL
            queues, ids = _split(listed)
            for q in queues:
                self._remote.setdefault(q, {})[sender] = expiry
            for i in ids:
                self._remote_jobs.setdefault(i, {})[sender] = expiry
        elif kind == "h":
            self._present.update(self._waited_here())
            self._kick()
        elif kind == "d" and listed:
            self.dependants_enqueued(listed[0], [int(i) for i in listed[1:] if _job_id(i)])

    async def aclose(self) -> None:
        if self._sender_task is not None:
            await asyncio.gather(self._sender_task, return_exceptions=True)


K = TypeVar("K")


def _forget_expired(presence: dict[K, dict[str, float]], now: float) -> None:
    for key in list(presence):
        live = {sender: expiry for sender, expiry in presence[key].items() if expiry > now}
        if live:
            presence[key] = live
        else:
            del presence[key]


def _split(names: Iterable[str]) -> tuple[list[str], list[int]]:
    """Names of a message: queue names, and the ids of the "#<id>" names (anything else under "#" is not
    ours and is dropped)."""
    queues: list[str] = []
    ids: list[int] = []
    for name in names:
        if not name.startswith(JOB):
            queues.append(name)
        elif _job_id(name[1:]):
            ids.append(int(name[1:]))
    return queues, ids


def _job_id(text: str) -> bool:
    """A job id as a message spells it: ASCII digits of a bigint. (str.isdigit() alone takes "²", which int()
    refuses: anyone who may connect may NOTIFY on the channel.)"""
    return 0 < len(text) <= 19 and text.isascii() and text.isdigit() and int(text) < 2**63


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
