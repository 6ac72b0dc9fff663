"""Claims and long-polls: every claim request of a queue, new or waiting, is served by one claim statement
at a time for that queue, and a waiting request holds no database connection.

Each queue with claim requests in this process has its own line of tickets. A request joins its queue's
line and kicks it; one `SKIP LOCKED` statement at a time claims jobs for all tickets in line (oldest
first) and hands each its rows. Tickets that got nothing either answer empty (no wait) or stay parked
until a wake-up (app/core/wakeups.py): a local enqueue, a NOTIFY from another process, the lease
rescuer, or the fallback poll (app/maintenance/poll.py). One statement per wake-up per process, however
many requests wait: no thundering herd, and under load concurrent claims share statements and commits.
What no wake-up names (the fallback poll, the look after a presence announcement or a listener reconnect)
is one statement for all waited queues (app/db/waiting.py) that says which have a job ready; only those
are claimed on, so a thousand parked claims on a thousand idle queues cost what a thousand on one do.

An enqueue in this process hands its jobs to the claims parked on their queue directly (take_parked, then
handed_off): the claim statement runs in the enqueue's own transaction (app/db/claim.py
jobs_insert_handing_off), so one flushed commit makes the job and its claim where two would, and the waiter
is answered as soon as the producer is. Only parked claims on a queue without limits or spread, with no claim
statement of the line under way; anything else is left to the line, as before.

Rows claimed for a ticket whose request has gone (timed out, disconnected, shutting down) are released
at once, so a job is never handed to a connection that is closing.

A queue with limits (app/core/flow.py, docs/flow-control.md) is claimed by app/db/claim.py's limited claim
instead, chosen by the process's cached configuration; the plain claim refuses a queue whose limits this
process has not heard of yet, and the line then claims again under them. Tickets held back by a limit
stay parked until a slot frees up (completes, fails, releases, cancels and rescues of a limited queue
go through app/core/effects.py) or, for a full rate window, until the moment it lets the next claim through.

Waiting is shared fairly: a process holds at most JOBQ_MAX_WAITERS parked requests, and one client (an API
key; with auth off, a client address) at most JOBQ_MAX_WAITERS_PER_CLIENT of them, so one key's fleet
cannot take every place. A statement that fails because the database went away (a terminated session, a
pooler restart, a failover) fails only the requests that would not wait: waiting ones stay parked and the
statement is tried again with backoff until their deadline; one that reaches its deadline with the last
try failed answers 503. A request that waited has its key checked again before it receives rows: a key
revoked while it waited gets 401, and the rows go back at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from app.core.effects import PENDING, RUNNING, Effects, Moves, Path
from app.core.flow import QueueConfigs
from app.core.wakeups import Wakeups
from app.db import claim as store_claim
from app.db import flow as store_flow
from app.db import waiting as store_waiting
from app.db import writes as store_writes
from app.db.claim import ClaimSlot
from app.db.pool import Database
from app.db.rows import ClaimRow
from app.db.spread import SEP, key_names, logical
from app.errors import AppError, DatabaseUnavailable, TooManyWaiters, Unauthorized
from app.observability.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("jobq.claims")

RETRY_FIRST_SECONDS = 0.05  # after a failed statement, waiting requests are tried again this soon, then
RETRY_MAX_SECONDS = 2.0  # doubling up to this (with jitter, so that replicas do not retry in step)
# A waiting claim that arrives within this of its queue's last claim statement finding no job, with claims
# already waiting there and no wake-up since, waits without a statement of its own (_QueueClaims.empty_until).
KNOWN_EMPTY_SECONDS = 0.05
MAX_FAIR_QUEUES = 10_000  # queues whose last served group a process remembers


class WaiterCap:
    """JOBQ_MAX_WAITERS: requests parked at once in this process, long-poll claims and waits for a job's
    result (app/core/results.py) together; and JOBQ_MAX_WAITERS_PER_CLIENT of them for one client (an API
    key, or with auth off a client address), when the request names its client. Past either, a request
    that would wait gets 429."""

    def __init__(self, limit: int, per_client: int | None = None) -> None:
        self.limit = limit
        self.per_client = per_client or limit
        self.taken = 0
        self.by_client: dict[str, int] = {}

    def take(self, client: str | None = None) -> bool:
        if self.taken >= self.limit:
            return False
        if client is not None:
            mine = self.by_client.get(client, 0)
            if mine >= self.per_client:
                return False
            self.by_client[client] = mine + 1
        self.taken += 1
        return True

    def give(self, client: str | None = None) -> None:
        self.taken -= 1
        if client is not None:
            left = self.by_client[client] - 1
            if left:
                self.by_client[client] = left
            else:
                del self.by_client[client]

    def refusal(self, client: str | None) -> TooManyWaiters:
        """The 429 for a request that take() refused."""
        if self.taken < self.limit and client is not None:
            return TooManyWaiters(
                f"This client already has {self.by_client.get(client, 0)} requests waiting on this server, its "
                "share; retry after a pause, or wait with fewer requests and a larger `limit`."
            )
        return TooManyWaiters()


class _Ticket:
    __slots__ = ("client", "error", "future", "parked", "slot", "wait")

    def __init__(self, slot: ClaimSlot, future: asyncio.Future[list[ClaimRow]], wait: bool, client: str | None) -> None:
        self.slot = slot
        self.future = future
        self.wait = wait
        self.client = client
        self.parked = False  # counted against the waiter caps
        self.error: AppError | None = None  # the last statement for it failed with this


class _QueueClaims:
    def __init__(self, owner: ClaimDispatcher, queue: str) -> None:
        self.owner = owner
        self.queue = queue
        self.tickets: list[_Ticket] = []
        self.task: asyncio.Task[None] | None = None
        self.again = False
        self.hint: set[str] = set()  # keys of a spread queue named by wake-ups since the last statement
        self.turn = 0  # a spread queue: the key its next claim starts from, when no wake-up names one
        self.failures = 0  # statements failed in a row (database unavailable)
        # Until when (loop time) the queue is known to have no job ready: the line's last statement found none it
        # could take, and nothing has woken the queue since (a plain queue: no limits, not spread). A waiting
        # claim that arrives before then, while others wait here, waits with them without a statement of its
        # own: the same wake-up comes for all of them. Short, because some jobs become ready with no wake-up (a
        # delayed job coming due, a lease recovered elsewhere): past it a new claim looks for itself again,
        # rather than wait for the fallback poll as the claims already waiting do.
        self.empty_until = 0.0
        self._retry: asyncio.TimerHandle | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def idle(self) -> bool:
        return not self.tickets and (self.task is None or self.task.done())

    def kick(self) -> None:
        self.empty_until = 0.0
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())
        else:
            self.again = True  # a wake-up during the statement: run once more after it

    async def _run(self) -> None:
        while True:
            self.again = False
            self.empty_until = 0.0
            self.tickets = [t for t in self.tickets if not t.future.done()]
            if not self.tickets:
                return
            batch: list[_Ticket] = []
            total = 0
            for t in self.tickets:
                if batch and total + t.slot.limit > self.owner.max_rows:
                    break
                batch.append(t)
                total += t.slot.limit
            slots = [t.slot for t in batch]
            held: list[str] = []
            found_none = False  # the statement left no job a claim could take
            try:
                cfg = self.owner.configs.cached(self.queue) or await self.owner.configs.get(self.queue)
                async with self.owner.db.connection() as conn:
                    if cfg.limited:
                        after = self.owner.fair_after.get(self.queue)
                        limited = await store_claim.jobs_claim_limited(conn, self.queue, slots, after)
                    elif len(cfg.keys) > 1:
                        result = await self._claim_keys(conn, cfg.keys, slots)
                    else:
                        result = await store_claim.jobs_claim(conn, self.queue, slots)
            except DatabaseUnavailable as exc:
                # Transient: the next statement, on a new connection, will likely succeed. Requests that
                # would not wait answer 503 now; waiting ones stay parked and are tried again later.
                for t in batch:
                    if t.future.done():
                        continue
                    if t.wait and not self.owner.closing:
                        t.error = exc
                        self.owner.park(self.queue, t)
                    else:
                        t.future.set_exception(exc)
                self._retry_later()
                return
            except AppError as exc:
                for t in batch:
                    if not t.future.done():
                        t.future.set_exception(exc)
                continue
            except Exception as exc:
                log.exception("claim statement failed on queue %s", self.queue)
                for t in batch:
                    if not t.future.done():
                        t.future.set_exception(exc)
                continue
            self.failures = 0
            for t in batch:
                t.error = None
            if cfg.limited:
                if not limited.limited:
                    self.owner.configs.invalidate(self.queue)  # the limits were lifted: cached ones are stale
                if limited.last_group is not None:
                    self.owner.remember_group(self.queue, limited.last_group)
                rows, held = limited.rows, limited.held
                self._wake_after(limited.wake_in)
            elif result.limited:
                # Limits this process had not heard of yet: read the configuration again, claim under them.
                self.owner.configs.invalidate(self.queue)
                self.again = True
                continue
            else:
                rows = result.rows
                # Fewer rows than asked for: none left that a claim could take. (Rows another claim's transaction
                # held were skipped: claimed by it, or, should it roll back, found by the next statement.) Not for
                # a spread queue, whose claim may have passed a key over.
                claimed_rows = sum(len(r) for r in rows)
                found_none = (
                    len(cfg.keys) <= 1
                    and claimed_rows < sum(s.limit for s in slots)
                    and not (claimed_rows == 0 and result.ready_left_behind)
                )
                self.owner.metrics.count("empty_claims", self.queue, len(batch) if result.ready_left_behind else 0)
            claimed = self._hand_out(batch, rows)
            if claimed:
                moves = Moves(Path.CLAIM)
                moves.add(self.queue, PENDING, RUNNING, n=claimed)
                self.owner.effects.apply(moves)
            if held:
                short = sum(1 for t, got in zip(batch, rows, strict=True) if len(got) < t.slot.limit)
                for limit in held:
                    self.owner.metrics.count(f"held_{limit}", self.queue, short)
            # Go again for tickets that did not fit in this statement, or after a wake-up during it.
            if not (self.again or len(batch) < len(self.tickets)):
                if found_none:
                    self.empty_until = asyncio.get_running_loop().time() + KNOWN_EMPTY_SECONDS
                return

    async def _claim_keys(self, conn: Any, keys: tuple[str, ...], slots: list[ClaimSlot]) -> store_claim.ClaimResult:
        """A spread queue (app/db/spread.py): claim from its keys in turn, one statement per key, each on the key's
        shard, until every request has its fill. Keys that wake-ups named since the last claim come first, then
        the others; both in turn from where the last claim started, plus one, so that every key is drained alike.
        A key found empty costs one statement, not a request answered empty while another key holds jobs. A key
        whose statement fails is passed over when others gave jobs (they are handed out, not lost with the
        error); the error stands when none did."""
        n = len(keys)
        start, self.turn = self.turn % n, self.turn + 1
        rotated = keys[start:] + keys[:start]
        hint, self.hint = self.hint, set()
        order = [k for k in rotated if k in hint] + [k for k in rotated if k not in hint]
        got: list[list[ClaimRow]] = [[] for _ in slots]
        left_behind = False
        for key in order:
            need = [(j, s.limit - len(got[j])) for j, s in enumerate(slots) if len(got[j]) < s.limit]
            if not need:
                break
            asked = [ClaimSlot(slots[j].worker, slots[j].lease_seconds, m) for j, m in need]
            try:
                result = await store_claim.jobs_claim(conn, key, asked)
            except Exception:
                if not any(got):
                    raise
                log.warning("claims on queue %s: key %s failed, handing out what the other keys gave", self.queue, key)
                break
            if result.limited:
                # A key's row has limits the queue's configuration does not (a spread queue refuses them: written
                # by a release before spread, or read mid-change): that key is passed over, and the configuration
                # read again for the next claim.
                self.owner.configs.invalidate(self.queue)
                continue
            for (j, _), rows in zip(need, result.rows, strict=True):
                got[j] += rows
            left_behind = left_behind or result.ready_left_behind
        return store_claim.ClaimResult(got, left_behind and not any(got))

    def _wake_after(self, seconds: float | None) -> None:
        """A rate limit is full: look again when its window lets the next claim through (no event says so)."""
        if seconds is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(max(seconds, 0.0) + 0.002, self._timed_kick)

    def _timed_kick(self) -> None:
        self._timer = None
        if any(not t.future.done() for t in self.tickets):
            self.kick()

    def _hand_out(self, batch: list[_Ticket], per_ticket: list[list[ClaimRow]]) -> int:
        undeliverable: list[ClaimRow] = []
        claimed = 0
        for t, rows in zip(batch, per_ticket, strict=True):
            claimed += len(rows)
            if rows:
                if t.future.done():
                    undeliverable.extend(rows)
                else:
                    t.future.set_result(rows)
            elif not t.future.done():
                if not t.wait or self.owner.closing:
                    t.future.set_result([])
                else:
                    self.owner.park(self.queue, t)
        if undeliverable:
            self.owner.release(undeliverable)
        return claimed

    def _retry_later(self) -> None:
        self.failures += 1
        delay = min(RETRY_FIRST_SECONDS * 2 ** (self.failures - 1), RETRY_MAX_SECONDS) * random.uniform(0.5, 1.0)
        if self.failures == 1 or self.failures % 10 == 0:
            log.warning("claims on queue %s: database unavailable, trying again in %.2fs", self.queue, delay)
        loop = asyncio.get_running_loop()
        if self._retry is None or self._retry.when() <= loop.time():  # none pending yet
            self._retry = loop.call_later(delay, self.kick)


class Handoff:
    """Parked claims of one queue, out of its line while an enqueue's transaction claims for them."""

    __slots__ = ("queue", "tickets")

    def __init__(self, queue: str, tickets: list[_Ticket]) -> None:
        self.queue = queue
        self.tickets = tickets

    @property
    def slots(self) -> list[ClaimSlot]:
        return [t.slot for t in self.tickets]


class ClaimDispatcher:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        wakeups: Wakeups,
        metrics: Metrics,
        configs: QueueConfigs,
        effects: Effects,
    ) -> None:
        self.settings = settings
        self.configs = configs  # which statement claims for a queue: with or without limits
        self.db = db
        self.wakeups = wakeups  # announces this process's waiters to the others
        self.metrics = metrics  # claims held back or answered empty: not moves of any job
        self.effects = effects
        self.max_rows = max(settings.max_claim_limit, 1000)
        self.cap = WaiterCap(settings.waiter_cap, settings.waiter_cap_per_client)
        self.parked = 0  # claims parked here (each holds one place of `cap`)
        self.handed = 0  # jobs claimed for parked claims by an enqueue's own transaction (handed_off)
        self.closing = False
        self._queues: dict[str, _QueueClaims] = {}
        # Fair queues: the group this process served last, per queue, where its next claim's round starts.
        # Kept apart from the queue's line of claims, which is forgotten whenever nobody waits on the queue.
        self.fair_after: dict[str, str] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._to_look: set[str] = set()
        self._look_all = False
        self._looking: asyncio.Task[None] | None = None

    def remember_group(self, queue: str, group: str) -> None:
        if queue not in self.fair_after and len(self.fair_after) >= MAX_FAIR_QUEUES:
            self.fair_after.clear()  # bounded: a round restarting from the first group is the worst of it
        self.fair_after[queue] = group

    # -- requests -----------------------------------------------------------------------------------------

    async def claim(
        self,
        queue: str,
        slot: ClaimSlot,
        wait_seconds: float,
        disconnected: Callable[[], Awaitable[Any]] | None = None,
        *,
        client: str | None = None,
        still_authorized: Callable[[], Awaitable[bool]] | None = None,
    ) -> list[ClaimRow]:
        """Jobs claimed for one request: at once when any are ready, else within wait_seconds, else []. `client`
        names whose share of the waiting places the request takes; `still_authorized`, when given, is asked
        before a request that waited receives rows."""
        if self.closing:
            return []
        loop = asyncio.get_running_loop()
        ticket = _Ticket(slot, loop.create_future(), wait_seconds > 0, client)
        claims = self._queues.get(queue)
        if claims is None:
            claims = self._queues[queue] = _QueueClaims(self, queue)
        claims.tickets.append(ticket)
        if ticket.wait and claims.empty_until > loop.time() and any(t.parked for t in claims.tickets):
            self.park(queue, ticket)  # the queue is known to have no job ready: wait with the others
        else:
            claims.kick()
        watch: asyncio.Future[Any] | None = None
        try:
            if not ticket.wait:
                # If this request is cancelled, so is its ticket: rows claimed for it are released.
                return await ticket.future
            waiters: set[asyncio.Future[Any]] = {ticket.future}
            if disconnected is not None:
                watch = asyncio.ensure_future(disconnected())
                waiters.add(watch)
            await asyncio.wait(waiters, timeout=wait_seconds, return_when=asyncio.FIRST_COMPLETED)
            if not ticket.future.done():
                if ticket.error is not None:
                    raise ticket.error  # the deadline came with the database still away
                return []  # deadline, or the client went away
            rows = ticket.future.result()
            if rows and ticket.parked and still_authorized is not None:
                await self._check_again(rows, still_authorized)
            return rows
        finally:
            if watch is not None:
                watch.cancel()
            if not ticket.future.done():
                ticket.future.cancel()  # rows still in flight for it will be released
            self.unpark(ticket)

    async def _check_again(self, rows: list[ClaimRow], still_authorized: Callable[[], Awaitable[bool]]) -> None:
        """The key of a request that waited may have been revoked meanwhile: then its rows go back."""
        try:
            allowed = await still_authorized()
        except BaseException:
            self.release(rows)
            raise
        if not allowed:
            self.release(rows)
            raise Unauthorized(
                "The API key was revoked while this claim waited; the jobs it would have received are back in the "
                "queue.",
                invalid=True,
            )

    # -- direct hand-off ------------------------------------------------------------------------------------

    def take_parked(self, queue: str, jobs: int) -> Handoff | None:
        """The claims parked on `queue` that `jobs` new jobs can serve, oldest first, taken out of its line for an
        enqueue's transaction to claim for (app/db/claim.py jobs_insert_handing_off); handed_off() gives each
        its rows or puts it back. The others stay in the line, where other wake-ups reach them. None when
        the line must do it: no parked claim, a claim statement of the line under way (its tickets may be in
        it), a queue with limits or spread (their claims are other statements), or a configuration this
        process has not read (the enqueue's own read of it comes first, so that is rare)."""
        if self.closing:
            return None
        claims = self._queues.get(queue)
        if claims is None or (claims.task is not None and not claims.task.done()):
            return None
        cfg = self.configs.cached(queue)
        if cfg is None or cfg.limited or len(cfg.keys) > 1:
            return None
        taken: list[_Ticket] = []
        rest: list[_Ticket] = []
        total = 0
        for t in claims.tickets:
            if total < jobs and t.parked and not t.future.done() and total + t.slot.limit <= self.max_rows:
                taken.append(t)
                total += t.slot.limit
            else:
                rest.append(t)
        if not taken:
            return None
        claims.tickets = rest
        return Handoff(queue, taken)

    def handed_off(self, handoff: Handoff, result: store_claim.ClaimResult | None) -> None:
        """After the enqueue's transaction (result None: it failed, or claimed nothing for them): each claim
        gets its rows; one that went away meanwhile has them released at once; the others go back to the
        front of their line, still parked. The moves (the claims) are the enqueue's to report
        (app/core/jobs.py handed_moves)."""
        claims = self._queues.get(handoff.queue)
        if claims is None:
            claims = self._queues[handoff.queue] = _QueueClaims(self, handoff.queue)
        if result is not None and result.limited:
            self.configs.invalidate(handoff.queue)  # limits this process had not heard of: the line claims
            result = None
        per_ticket = result.rows if result is not None else [[] for _ in handoff.tickets]
        undeliverable: list[ClaimRow] = []
        back: list[_Ticket] = []
        claimed = 0
        for t, rows in zip(handoff.tickets, per_ticket, strict=True):
            claimed += len(rows)
            if rows:
                if t.future.done() or self.closing:  # gone, or the process stopping: nothing is handed out
                    undeliverable.extend(rows)
                    if not t.future.done():
                        t.future.set_result([])
                else:
                    t.future.set_result(rows)
            elif not t.future.done():
                if self.closing:
                    t.future.set_result([])
                else:
                    back.append(t)
        if back:
            # Wake-ups that came while these claims were out of their line found nobody to wake: the line claims
            # once more for them (a statement that finds nothing, when none came).
            claims.tickets[:0] = back
            claims.kick()
        if undeliverable:
            self.release(undeliverable)
        self.handed += claimed

    # -- the waiter caps ----------------------------------------------------------------------------------

    def park(self, queue: str, ticket: _Ticket) -> None:
        """Count a waiting request against the caps, or answer it 429 when it would pass one."""
        if ticket.parked:
            return
        if not self.cap.take(ticket.client):
            ticket.future.set_exception(self.cap.refusal(ticket.client))
        else:
            ticket.parked = True
            self.parked += 1
            self.wakeups.waiter_parked(queue)

    def unpark(self, ticket: _Ticket) -> None:
        if not ticket.parked:
            return
        ticket.parked = False
        self.parked -= 1
        self.cap.give(ticket.client)

    # -- wake-ups -----------------------------------------------------------------------------------------

    def wake(self, queues: Iterable[str] | None = None) -> None:
        """Jobs may have become claimable on these queues (None: on any queue)."""
        if self.closing:
            return
        names = self._queues.keys() if queues is None else queues
        for name in list(names):
            if SEP in name:  # a key of a spread queue (app/db/spread.py): its queue's claims take from it first
                claims = self._queues.get(logical(name))
                if claims is not None and claims.tickets:
                    claims.hint.add(name)
                    claims.kick()
                continue
            claims = self._queues.get(name)
            if claims is not None and claims.tickets:
                claims.kick()

    def waiting_queues(self) -> list[str]:
        return [name for name, d in self._queues.items() if any(t.parked for t in d.tickets)]

    def settled(self, queue: str) -> bool:
        """A claim waits on `queue` here and no claim statement for it, nor a look for ready jobs, is under way."""
        claims = self._queues.get(queue)
        return (
            claims is not None
            and any(t.parked for t in claims.tickets)
            and (claims.task is None or claims.task.done())
            and (self._looking is None or self._looking.done())
        )

    async def poll_once(self) -> None:
        """The fallback (app/maintenance/poll.py runs it): delayed jobs coming due, leases recovered
        elsewhere, notifications lost. One statement asks which waited queues have a job ready, and only
        those are claimed on: a queue nobody enqueued to costs no claim statement. Queues nobody waits on
        any more are forgotten."""
        for name, claims in list(self._queues.items()):
            if claims.idle:
                del self._queues[name]
        await self._probe(self.waiting_queues())

    def look(self, queues: Iterable[str] | None = None) -> None:
        """Jobs may have become claimable on these queues (None: on any) with no wake-up to say so, as after
        a presence announcement or a reconnect of the listener: like poll_once, ask once, claim where ready.
        Looks asked for while one is under way are made together after it."""
        if self.closing:
            return
        if queues is None:
            self._look_all = True
        else:
            self._to_look.update(queues)
        if self._looking is None or self._looking.done():
            self._looking = asyncio.get_running_loop().create_task(self._look())

    async def _look(self) -> None:
        while self._look_all or self._to_look:
            names = self.waiting_queues() if self._look_all else [q for q in self._to_look if self._waits_on(q)]
            self._look_all, self._to_look = False, set()
            if not await self._probe(names) and not self.closing:
                # The database is not back yet (the listener reconnected before the pool did, after a
                # failover): what the look was for must not wait for the fallback poll.
                await asyncio.sleep(RETRY_MAX_SECONDS)
                self._to_look.update(names)

    def _waits_on(self, queue: str) -> bool:
        claims = self._queues.get(queue)
        return claims is not None and any(t.parked for t in claims.tickets)

    async def _probe(self, queues: list[str]) -> bool:
        """False when the database could not be asked."""
        if not queues or self.closing:
            return True
        # A spread queue is looked for under every key (as last read: app/core/flow.py keys_of; read here for the
        # queues this process holds no configuration of, as after a reconnect of its listener); a key found ready
        # wakes its queue's claims, which take from that key first.
        try:
            async with self.db.connection() as conn:
                unknown = [q for q in queues if self.configs.keys_of(q) is None]
                spread = await store_flow.queues_spread(conn, unknown) if unknown else {}
                names = [k for q in queues for k in (self.configs.keys_of(q) or key_names(q, spread.get(q, 1)))]
                ready = await store_waiting.queues_ready(conn, names)
        except DatabaseUnavailable:
            # A claim statement would fail too; the next pass asks again (and queues whose last claim
            # failed try again on their own, with backoff).
            log.warning("could not look for ready jobs on %d waited queue(s): database unavailable", len(queues))
            return False
        except Exception:
            # Not expected: then claim on every queue, as if the probe had named them all, rather than
            # let a job wait for a statement that keeps failing.
            log.exception("the look for ready jobs on %d waited queue(s) failed; claiming on all", len(queues))
            ready = list(queues)
        self.wake(ready)
        return True

    # -- undeliverable claims --------------------------------------------------------------------------------

    def release(self, rows: list[ClaimRow]) -> None:
        task = asyncio.get_running_loop().create_task(self._release(rows))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, rows: list[ClaimRow]) -> None:
        try:
            async with self.db.connection() as conn:
                await store_writes.jobs_release(conn, rows)
            log.info("released %d job(s) claimed for a request that went away", len(rows))
            # The rows it meant to hand back: one whose lease lapsed meanwhile moved nothing, and costs one
            # wake-up too many, no count.
            moves = Moves(Path.HAND_BACK)
            for r in rows:
                moves.add(r.queue, RUNNING, PENDING)
            self.effects.apply(moves)
        except Exception:
            # The lease will lapse and the sweeper will return them; nothing is lost.
            log.warning("could not release %d unanswered claim(s); the sweeper will", len(rows))

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def released(self) -> None:
        """Wait for the releases under way (rows claimed for requests that went away, as a hand-off's can be
        while the process stops: app/services.py waits for them after the enqueues' last statements)."""
        await asyncio.gather(*self._background, return_exceptions=True)

    async def drain(self) -> None:
        """Stop handing out jobs: waiting requests answer [] now, new ones at once; statements in flight
        finish and their rows for requests already answered are released."""
        self.closing = True
        for claims in self._queues.values():
            for t in claims.tickets:
                if not t.future.done():
                    t.future.set_result([])
        tasks = [d.task for d in self._queues.values() if d.task is not None]
        if self._looking is not None:
            tasks.append(self._looking)
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*self._background, return_exceptions=True)
