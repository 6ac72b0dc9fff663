"""Worker: long-polls the queues it has handlers for, runs each job's handler (async on the event loop,
sync in a thread of its own), heartbeats while it runs, then completes or fails the job. A finished job's
result rides on the next claim when one goes out at once (one request per job instead of two). Stops
cleanly on SIGTERM/SIGINT: no new claims, jobs in flight finish within a grace period or are released
(handed back without spending an attempt)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import logging
import math
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TypeVar, Union

from jobq_client import _calls
from jobq_client._calls import RetryPolicy
from jobq_client._tracing import JobSpans
from jobq_client.client import AsyncClient
from jobq_client.errors import (
    BadRequest,
    Conflict,
    JobNotFound,
    JobqError,
    JobTimedOut,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    TransportError,
    ValidationError,
)
from jobq_client.models import Claim, CompleteOutcome

log = logging.getLogger("jobq_client.worker")

MAX_ERROR_CHARS = 4000  # the server keeps JOBQ_MAX_ERROR_BYTES (2 KiB by default) of it anyway
MAX_CLAIM = 100  # jobs asked for in one claim: the server's default JOBQ_MAX_CLAIM_LIMIT
MAX_HAND_INS = 1000  # completes carried by one claim: the server's default JOBQ_MAX_BATCH_COMPLETE

# Why a handler was told to stop.
CLAIM_LOST = "claim lost"
CANCEL_REQUESTED = "cancel requested"
TIMED_OUT = "timed out"  # the job ran past its timeout_seconds: the server failed it
SHUTDOWN = "worker shutting down"
PROGRESS_INTERVAL = 1.0  # seconds: the most often a job's reported progress is sent


class RetryLater(Exception):
    """Raise from a handler to fail this attempt and have the job retried after `retry_in` seconds
    (None: after the server's backoff). Once the attempts are used up the job is failed all the same."""

    def __init__(self, message: str = "retry requested", *, retry_in: float | None = None) -> None:
        super().__init__(message)
        self.retry_in = retry_in


class PermanentFailure(Exception):
    """Raise from a handler to fail the job for good now, whatever attempts remain."""


class JobContext:
    """What a handler receives: the claimed job, and whether it should stop.

    `stopped` turns true when the claim is lost (lease lapsed, job reclaimed), when an operator cancels
    the job, when the job ran past its `timeout_seconds` (the server failed it; `stop_reason` is "timed
    out"), or when the worker stops before the handler finished. An async handler is cancelled at
    once; a sync handler cannot be interrupted, so a long one should look at `stopped` (or use
    `sleep()`) now and then. Whatever a stopped handler returns is not sent."""

    def __init__(self, claim: Claim, sync: bool = False) -> None:
        self.claim = claim
        # For sleep(): made up front for a sync handler, on first use otherwise (a threading.Event costs more
        # than the rest of a job's bookkeeping, and an async handler waits on the event loop instead).
        self._stopped: threading.Event | None = threading.Event() if sync else None
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] = self._loop.create_future()
        self.stop_reason: str | None = None
        self._span: Any = None  # the job's OpenTelemetry span, when it has one
        self._progress: Any = _calls.UNSET  # reported by the handler, not sent yet
        self._progress_ready = asyncio.Event()
        self._beat_now: Callable[[], None] | None = None  # starts the heartbeats early (Worker._run)

    @property
    def id(self) -> int:
        return self.claim.id

    @property
    def queue(self) -> str:
        return self.claim.queue

    @property
    def payload(self) -> Any:
        return self.claim.payload

    @property
    def attempts(self) -> int:
        return self.claim.attempts

    @property
    def max_attempts(self) -> int:
        return self.claim.max_attempts

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def sleep(self, seconds: float) -> bool:
        """For sync handlers: sleep, but wake at once when told to stop. True when stopped."""
        stopped = self._stopped
        if stopped is None:
            with _EVENT_MADE:
                stopped = self._stopped = self._stopped or threading.Event()
        if self.stop_reason is not None:  # _stop ran before the event was there to be set
            stopped.set()
        return stopped.wait(seconds)

    def progress(self, value: Any) -> None:
        """Report progress (any JSON value, e.g. {"done": 40, "total": 100}; None clears it): shown on the job
        (GET /jobs/{id}, the dashboard) until its next claim. Safe from sync and async handlers; it never
        blocks. Sent with the next heartbeat, which comes early for it but at most once a second, so a
        handler may call this as often as it likes: only the latest value is sent."""
        self._progress = value
        self._loop.call_soon_threadsafe(self._progress_reported)

    def _progress_reported(self) -> None:
        self._progress_ready.set()
        if self._beat_now is not None:
            self._beat_now()

    def _stop(self, reason: str) -> None:
        # Called on the event loop only.
        if self.stop_reason is None:
            self.stop_reason = reason  # before reading _stopped: sleep() makes the event, then reads this
            if self._stopped is not None:
                self._stopped.set()
            if not self._waiter.done():
                self._waiter.set_result(None)


_EVENT_MADE = threading.Lock()  # JobContext.sleep(): one event a job, whichever thread asks first

Handler = Callable[[JobContext], Union[Any, Awaitable[Any]]]  # noqa: UP007 (a runtime alias on 3.10)
H = TypeVar("H", bound=Handler)


@dataclass
class _HandIn:
    """A finished job's result, waiting to ride on the next claim; `answer` gets its outcome, or None when
    the claim could not carry it (the job is then completed by itself)."""

    id: int
    token: str
    result: Any
    answer: asyncio.Future[CompleteOutcome | None]


@dataclass
class _Queue:
    name: str
    handler: Handler
    concurrency: int
    is_async: bool
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    freed: asyncio.Event | None = None
    outbox: list[_HandIn] = field(default_factory=list)  # their jobs' slots are free: the work is done
    # A claim goes out within a round trip: the claim loop waits for a free slot (a finished job frees
    # one), or a claim that does not long-poll is on its way (the next one follows as soon as it answers).
    claim_soon: bool = False
    busy: bool = False  # the last claim came back full: the next one does not long-poll

    def free(self) -> int:
        return self.concurrency - len(self.tasks) + len(self.outbox)


def _is_async(fn: Callable[..., Any]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def _error_text(exc: BaseException) -> str:
    message = str(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    # A lone surrogate (a filename decoded with surrogateescape, say) cannot be sent as UTF-8: escape it.
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 12] + " [truncated]"


class _Escaped(Exception):
    """SystemExit or KeyboardInterrupt raised by an async handler, carried as an ordinary exception: raised
    out of a task, either would stop the event loop and abandon every job in flight."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


class Worker:
    """Runs handlers for jobs of one or more queues.

        worker = Worker("http://127.0.0.1:8000", concurrency=10)

        @worker.handler("emails")
        def send(job: JobContext) -> dict:
            return {"message_id": mail.send(**job.payload)}

        worker.run()  # until SIGTERM or SIGINT

    A handler gets a JobContext. Its return value (JSON) completes the job; an exception fails the
    attempt with the exception's type and message, and the server retries the job later while attempts
    remain (`RetryLater` chooses when, `PermanentFailure` stops the retries).

    `concurrency` is per queue: at most that many jobs of each queue run at once. `lease_seconds` is
    the lease each claim asks for; heartbeats renew it every `heartbeat_interval` (default a third of
    the lease) while the handler runs. A heartbeat or a complete that answers 409, or a heartbeat that
    says `cancel_requested`, means the job is no longer ours: the handler is told to stop and the job is
    neither completed nor failed. On stop (first SIGTERM/SIGINT, or `stop()`) the worker claims nothing
    more and waits up to `shutdown_grace` seconds for jobs in flight; jobs still running then (or at a
    second signal) are released: pending again at once for another worker, their attempt not counted and
    their `last_error` untouched (a server without the release call gets a fail with an immediate retry
    instead, which does count the attempt).

    A job's result is handed in on the next claim of its queue when that claim goes out at once (a slot is
    free and no claim is on its way): one request per job at full load. Otherwise, and against a server
    that does not take completes on a claim, the job is completed by a request of its own.

    With `opentelemetry-api` installed, each job runs in a span, `process <queue>`, the child of the
    trace context its enqueue stored (the claim's `traceparent`): the handler's own spans, its heartbeats
    and its complete or fail join the producer's trace. `tracer_provider` names the provider (default:
    the global one, which records nothing until the application configures an SDK)."""

    def __init__(
        self,
        client: AsyncClient | str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        name: str | None = None,
        concurrency: int = 10,
        lease_seconds: int = 30,
        wait_seconds: float = 20.0,
        heartbeat_interval: float | None = None,
        shutdown_grace: float = 30.0,
        retry: RetryPolicy | None = None,
        tracer_provider: Any = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease_seconds < 1:
            raise ValueError("lease_seconds must be at least 1")
        interval = heartbeat_interval if heartbeat_interval is not None else lease_seconds / 3
        if not 0 < interval < lease_seconds:
            raise ValueError("heartbeat_interval must be positive and shorter than the lease")
        if wait_seconds < 0 or shutdown_grace < 0:
            raise ValueError("wait_seconds and shutdown_grace cannot be negative")
        self._client = client if isinstance(client, AsyncClient) else None
        self._url = client if isinstance(client, str) else ""
        self._api_key = api_key
        self._retry = retry
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.wait_seconds = wait_seconds
        self.heartbeat_interval = interval
        self.shutdown_grace = shutdown_grace
        self._queues: dict[str, _Queue] = {}
        self._active: set[JobContext] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._forced: asyncio.Event | None = None
        self._lock = threading.Lock()  # stop() may come from another thread while run() starts
        self._early_stops = 0  # stop() calls before the loop started
        self._fatal: Exception | None = None
        self._hand_ins = True  # until a server says it does not take completes on a claim
        self._spans = JobSpans(tracer_provider)

    # -- registration -----------------------------------------------------------------------------------

    def register(self, queue: str, handler: Handler, *, concurrency: int | None = None) -> None:
        if queue in self._queues:
            raise ValueError(f"queue {queue!r} already has a handler")
        limit = concurrency if concurrency is not None else self.concurrency
        if limit < 1:
            raise ValueError("concurrency must be at least 1")
        self._queues[queue] = _Queue(queue, handler, limit, _is_async(handler))

    def handler(self, queue: str, *, concurrency: int | None = None) -> Callable[[H], H]:
        """Decorator form of register()."""

        def decorate(fn: H) -> H:
            self.register(queue, fn, concurrency=concurrency)
            return fn

        return decorate

    # -- running and stopping -------------------------------------------------------------------------------

    def run(self) -> None:
        """Run until stopped. In the main thread, SIGTERM and SIGINT stop it (twice: at once)."""
        asyncio.run(self.arun(handle_signals=threading.current_thread() is threading.main_thread()))

    def stop(self, *, now: bool = False) -> None:
        """Stop claiming and let jobs in flight finish (`now`: hand them back at once). Safe to call from
        any thread; a second call acts like `now`. Called before run(), run() returns at once."""
        with self._lock:
            loop = self._loop
            if loop is None:
                self._early_stops += 2 if now else 1
                return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to stop
            loop.call_soon_threadsafe(self._request_stop, now)

    def _request_stop(self, now: bool = False) -> None:
        assert self._stopping is not None and self._forced is not None
        if now or self._stopping.is_set():
            self._stopping.set()  # no new claims, also when the first request is already `now`
            if not self._forced.is_set():
                log.warning("stopping now: handing back %d job(s) still running", len(self._active))
                self._forced.set()
                for ctx in list(self._active):
                    ctx._stop(SHUTDOWN)
            return
        log.info("stopping: no new claims; finishing %d job(s) in flight", self._in_flight())
        self._stopping.set()

    def _in_flight(self) -> int:
        return sum(len(q.tasks) for q in self._queues.values())

    async def arun(self, *, handle_signals: bool = False) -> None:
        """Run on the current event loop until stopped. Raises the error that stopped it, if any
        (an answer that retrying cannot fix, such as 401 or 403 on claim)."""
        if not self._queues:
            raise ValueError("register a handler for at least one queue first")
        self._stopping, self._forced = asyncio.Event(), asyncio.Event()
        self._fatal = None
        for q in self._queues.values():
            q.freed = asyncio.Event()
        with self._lock:
            self._loop = asyncio.get_running_loop()
            early, self._early_stops = self._early_stops, 0
        for _ in range(early):
            self._request_stop()
        client = self._client or AsyncClient(
            self._url,
            api_key=self._api_key,
            retry=self._retry,
            max_connections=max(100, 2 * sum(q.concurrency for q in self._queues.values()) + len(self._queues)),
        )
        restore = self._install_signal_handlers() if handle_signals else {}
        pollers = [
            asyncio.create_task(self._guarded_poll(client, q), name=f"jobq-poll-{q.name}")
            for q in self._queues.values()
        ]
        try:
            await self._stopping.wait()
            await asyncio.gather(*pollers)
            await self._drain()
        finally:
            for p in pollers:
                p.cancel()
            if any(q.tasks for q in self._queues.values()):  # cancelled from outside: hand jobs back
                self._request_stop(now=True)
                await asyncio.gather(*(t for q in self._queues.values() for t in q.tasks), return_exceptions=True)
            for signum, previous in restore.items():
                signal.signal(signum, previous)
            if self._client is None:
                await client.aclose()
            with self._lock:
                self._loop = None
        if self._fatal is not None:
            raise self._fatal

    def _install_signal_handlers(self) -> dict[int, Any]:
        loop = asyncio.get_running_loop()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("received %s", signal.Signals(signum).name)
            loop.call_soon_threadsafe(self._request_stop)

        restore: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            restore[signum] = signal.getsignal(signum)
            signal.signal(signum, on_signal)
        return restore

    async def _drain(self) -> None:
        tasks = [t for q in self._queues.values() for t in q.tasks]
        if not tasks:
            return
        assert self._forced is not None
        forced = asyncio.ensure_future(self._forced.wait())
        everything = asyncio.ensure_future(asyncio.wait(tasks))
        try:
            await asyncio.wait({forced, everything}, timeout=self.shutdown_grace, return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()
        if not everything.done():
            self._request_stop(now=True)
            await everything

    async def _pause(self, seconds: float) -> None:
        """Sleep, but return early when the worker stops."""
        assert self._stopping is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    # -- claiming ---------------------------------------------------------------------------------------------

    async def _guarded_poll(self, client: AsyncClient, q: _Queue) -> None:
        try:
            await self._poll(client, q)
        except Exception as exc:  # a bug here must stop the worker, not leave it claiming nothing
            log.exception("claim loop of %s crashed; stopping the worker", q.name)
            self._fatal = self._fatal or exc
            self._request_stop()

    async def _poll(self, client: AsyncClient, q: _Queue) -> None:
        try:
            await self._claim_loop(client, q)
        finally:
            q.claim_soon = False
            _answer(q.outbox, None)  # stopping: results still waiting for a claim go by themselves
            q.outbox.clear()

    async def _claim_loop(self, client: AsyncClient, q: _Queue) -> None:
        """Claim for the queue while it has free slots, each claim carrying the results finished since the
        last. While jobs keep coming the claims do not wait (`busy`); once one comes back short, the next
        long-polls for wait_seconds."""
        assert self._stopping is not None and q.freed is not None
        failures = 0
        cap = MAX_CLAIM  # lowered when the server's JOBQ_MAX_CLAIM_LIMIT is lower
        while not self._stopping.is_set():
            q.freed.clear()
            free = q.free()
            if free <= 0:
                q.claim_soon = True
                try:
                    await _first(q.freed.wait(), self._stopping.wait())
                finally:
                    q.claim_soon = False
                continue
            limit = min(free, cap)
            wait = 0.0 if q.busy else self.wait_seconds
            hand_ins, q.outbox = q.outbox[:MAX_HAND_INS], q.outbox[MAX_HAND_INS:]
            if hand_ins:
                done = [(h.id, h.token, h.result) for h in hand_ins]
                call: Awaitable[Any] = client.complete_and_claim(
                    q.name, self.name, done, limit=limit, lease_seconds=self.lease_seconds, wait_seconds=wait
                )
            else:
                call = client.claim(q.name, self.name, limit=limit, lease_seconds=self.lease_seconds, wait_seconds=wait)
            claiming = asyncio.ensure_future(call)
            q.claim_soon = wait == 0
            try:
                stopping = asyncio.ensure_future(self._stopping.wait())
                await asyncio.wait({claiming, stopping}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if not claiming.done():
                    # The long-poll is abandoned; the server releases what it claims for a request that went
                    # away. Only an answer already on the wire when we hang up is lost, and its jobs come back
                    # when their lease lapses.
                    claiming.cancel()
                    await asyncio.wait({claiming})
            except BaseException:  # this loop itself cancelled: the results it carried go by themselves
                claiming.cancel()
                _answer(hand_ins, None)
                raise
            finally:
                q.claim_soon = False
            if claiming.cancelled():
                _answer(hand_ins, None)  # carried or not, the results go again by themselves
                return
            try:
                answer = claiming.result()
            except (TransportError, RateLimited, ServerError) as exc:
                _answer(hand_ins, None)  # carried or not, the results go again by themselves
                q.busy = False
                failures += 1
                delay = min(30.0, 0.5 * 2 ** min(failures, 6)) * random.uniform(0.5, 1)
                log.warning("claim on %s failed (%s); trying again in %.1fs", q.name, exc, delay)
                await self._pause(delay)
                continue
            except ValidationError as exc:
                _answer(hand_ins, None)
                if hand_ins and exc.errors and all(_about_hand_ins(e) for e in exc.errors):
                    if any(e.get("type") == "extra_forbidden" for e in exc.errors):
                        log.info("the server does not take completes on a claim; completing jobs by themselves")
                        self._hand_ins = False
                    continue  # a result it refused: each job's own complete will tell which
                if limit > 1 and exc.errors and all(_about_limit(e) for e in exc.errors):
                    cap = _lower_limit(exc.errors, limit)
                    log.warning("claim on %s: the server takes at most %d jobs a claim (%s)", q.name, cap, exc)
                    continue
                log.error("claim on %s refused, stopping the worker: %s", q.name, exc)
                self._fatal = self._fatal or exc
                self._request_stop()
                return
            except JobqError as exc:
                # 400/401/403/404/422: retrying will not help (bad key, bad queue name, older server).
                _answer(hand_ins, None)
                log.error("claim on %s refused, stopping the worker: %s", q.name, exc)
                self._fatal = self._fatal or exc
                self._request_stop()
                return
            failures = 0
            if hand_ins:
                for h, outcome in zip(hand_ins, answer.completed, strict=False):
                    if not h.answer.done():
                        h.answer.set_result(outcome)
                _answer(hand_ins, None)  # an answer short of outcomes: those go again by themselves
                claims = answer.jobs
            else:
                claims = answer
            q.busy = len(claims) == limit
            for c in claims:
                task = asyncio.create_task(self._process(client, q, c), name=f"jobq-job-{c.id}")
                q.tasks.add(task)
                task.add_done_callback(functools.partial(self._done, q))

    @staticmethod
    def _done(q: _Queue, task: asyncio.Task[None]) -> None:
        q.tasks.discard(task)
        if q.freed is not None:
            q.freed.set()
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("job task crashed", exc_info=exc)

    # -- one job -------------------------------------------------------------------------------------------------

    async def _process(self, client: AsyncClient, q: _Queue, claim: Claim) -> None:
        # This task's own context: the job's span is current for everything below, and only here.
        span = self._spans.start(claim, self.name)
        ctx = JobContext(claim, sync=not q.is_async)
        ctx._span = span
        try:
            await self._run(client, q, ctx)
        finally:
            self._spans.end(span)

    async def _run(self, client: AsyncClient, q: _Queue, ctx: JobContext) -> None:
        claim = ctx.claim
        assert self._forced is not None
        if self._forced.is_set():  # claimed as the worker was told to stop now: hand it straight back
            await self._hand_back(client, ctx, "before the handler started")
            return
        self._active.add(ctx)
        # The heartbeats start when the first is due, or when the handler reports progress: a job done sooner
        # costs a timer, not a task.
        started = time.monotonic()
        beating: list[asyncio.Task[None]] = []

        def beat_now() -> None:
            if not beating:
                beating.append(
                    asyncio.create_task(self._heartbeats(client, ctx, started), name=f"jobq-heartbeat-{claim.id}")
                )

        ctx._beat_now = beat_now
        first_beat = asyncio.get_running_loop().call_later(self.heartbeat_interval, beat_now)
        try:
            work: asyncio.Future[Any] = (
                asyncio.ensure_future(_call_async(q.handler, ctx)) if q.is_async else _in_thread(q.handler, ctx)
            )
            await asyncio.wait({work, ctx._waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                await self._abandon(client, q, ctx, work)
                return
        finally:
            ctx._beat_now = None
            first_beat.cancel()
            for task in beating:
                task.cancel()
            self._active.discard(ctx)
        if ctx.stop_reason in (CLAIM_LOST, CANCEL_REQUESTED, TIMED_OUT):
            log.info("job %s: %s while its handler finished; not completing it", claim.id, ctx.stop_reason)
            self._spans.note(ctx._span, "jobq.job.stopped", ctx.stop_reason)
            return
        await self._report(client, q, ctx, work)

    async def _abandon(self, client: AsyncClient, q: _Queue, ctx: JobContext, work: asyncio.Future[Any]) -> None:
        """The handler was told to stop before it finished."""
        log.warning("job %s: %s; stopping its handler", ctx.id, ctx.stop_reason)
        self._spans.note(ctx._span, "jobq.job.stopped", ctx.stop_reason or "")
        assert self._forced is not None
        work.add_done_callback(_discard_outcome)
        if q.is_async:
            work.cancel()
            await asyncio.wait({work}, timeout=5)  # a handler that ignores cancellation is left behind
        elif ctx.stop_reason != SHUTDOWN:
            # A thread cannot be interrupted: its slot stays taken until it returns (or we stop now).
            await _first(asyncio.wait({work}), self._forced.wait())
        if ctx.stop_reason == SHUTDOWN:
            await self._hand_back(client, ctx, "before the handler finished")

    async def _hand_back(self, client: AsyncClient, ctx: JobContext, when: str) -> None:
        """Release a job this worker will not finish: the attempt was not a real one, so it is given back."""
        log.info("job %s: %s, released %s", ctx.id, SHUTDOWN, when)
        try:
            await client.release(ctx.id, ctx.claim.claim_token)
        except NotFound as exc:
            if isinstance(exc, JobNotFound):
                _unrecorded(ctx, exc)
                return
            # No such route: a server older than the release call. Fail with an immediate retry instead.
            error = f"{SHUTDOWN}: handed back {when}"
            await self._send(ctx, client.fail(ctx.id, ctx.claim.claim_token, error, retry_in_seconds=0, minimal=True))
        except JobqError as exc:
            _unrecorded(ctx, exc)

    async def _hand_in(self, q: _Queue, ctx: JobContext, result: Any) -> CompleteOutcome | None:
        """Put a finished job's result on the next claim of its queue when that claim goes out within a
        round trip (see _Queue.claim_soon); its outcome, or None when it must be completed by itself (a
        long-poll is on its way, the loop backs off after a failure, or the worker stops)."""
        assert self._stopping is not None and q.freed is not None
        if not self._hand_ins or not q.claim_soon or self._stopping.is_set():
            return None
        answer: asyncio.Future[CompleteOutcome | None] = asyncio.get_running_loop().create_future()
        q.outbox.append(_HandIn(ctx.id, ctx.claim.claim_token, result, answer))
        q.freed.set()  # its slot is free: the claim goes out now
        return await answer

    async def _report(self, client: AsyncClient, q: _Queue, ctx: JobContext, work: asyncio.Future[Any]) -> None:
        token = ctx.claim.claim_token
        exc = work.exception() if not work.cancelled() else asyncio.CancelledError("the handler was cancelled")
        if isinstance(exc, _Escaped):
            exc = exc.exc
        if exc is None:
            result = work.result()
            try:
                # As the client encodes it: strict JSON, then UTF-8 (a lone surrogate fails only there).
                json.dumps(result, allow_nan=False, ensure_ascii=False).encode()
            except (TypeError, ValueError, RecursionError) as bad:
                exc = TypeError(f"the handler's result is not JSON: {bad}")
            else:
                handed_in = await self._hand_in(q, ctx, result)
                if handed_in is not None:
                    if handed_in.outcome != "completed":
                        log.warning("job %s: not completed (%s) when handed in", ctx.id, handed_in.outcome)
                    return
                try:
                    await client.complete(ctx.id, token, result, minimal=True)
                    return
                except (BadRequest, PayloadTooLarge, ValidationError) as refused:
                    # Another try with the same result gets the same answer: fail the attempt rather than
                    # leave the job running until its lease lapses.
                    exc = ValueError(f"the server refused the handler's result: {refused}")
                except JobqError as other:
                    _unrecorded(ctx, other)
                    return
        self._spans.failed(ctx._span, exc, retried=not isinstance(exc, PermanentFailure) and not ctx.claim.last_attempt)
        if isinstance(exc, RetryLater):
            log.info("job %s: retry requested (%s)", ctx.id, exc)
            await self._retry_later(client, ctx, exc)
        elif isinstance(exc, PermanentFailure):
            log.warning("job %s: failed for good: %s", ctx.id, exc)
            await self._send(ctx, client.fail(ctx.id, token, _error_text(exc), retry=False, minimal=True))
        else:
            log.warning("job %s: attempt %d failed", ctx.id, ctx.attempts, exc_info=exc)
            await self._send(ctx, client.fail(ctx.id, token, _error_text(exc), minimal=True))

    async def _retry_later(self, client: AsyncClient, ctx: JobContext, exc: RetryLater) -> None:
        """Fail the attempt with the handler's delay; a delay the server cannot take (negative, not a number,
        past its maximum) falls back to its backoff rather than leave the job running until its lease."""
        token, error, retry_in = ctx.claim.claim_token, _error_text(exc), exc.retry_in
        seconds = isinstance(retry_in, (int, float)) and not isinstance(retry_in, bool) and math.isfinite(retry_in)
        if retry_in is not None and not seconds:
            log.warning("job %s: retry_in=%r is not a number of seconds; using the backoff", ctx.id, retry_in)
            retry_in = None
        try:
            await client.fail(ctx.id, token, error, retry_in_seconds=retry_in, minimal=True)
        except (BadRequest, ValidationError) as refused:
            if retry_in is None:
                _unrecorded(ctx, refused)
                return
            log.warning("job %s: retry_in=%r refused (%s); using the backoff", ctx.id, retry_in, refused)
            await self._send(ctx, client.fail(ctx.id, token, error, minimal=True))
        except JobqError as other:
            _unrecorded(ctx, other)

    async def _send(self, ctx: JobContext, call: Awaitable[Any]) -> None:
        try:
            await call
        except JobqError as exc:
            _unrecorded(ctx, exc)

    async def _heartbeats(self, client: AsyncClient, ctx: JobContext, last: float) -> None:
        """`last`: when the job started (the lease was renewed by its claim then)."""
        while True:
            # Every heartbeat_interval, or earlier when the handler reported progress (but not more
            # often than PROGRESS_INTERVAL).
            due = last + self.heartbeat_interval - time.monotonic()
            if due > 0 and not ctx._progress_ready.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ctx._progress_ready.wait(), timeout=due)
            if ctx._progress_ready.is_set():
                await asyncio.sleep(max(0.0, last + min(PROGRESS_INTERVAL, self.heartbeat_interval) - time.monotonic()))
            ctx._progress_ready.clear()
            progress, ctx._progress = ctx._progress, _calls.UNSET
            last = time.monotonic()
            try:
                beat = await client.heartbeat(ctx.id, ctx.claim.claim_token, progress=progress)
            except (Conflict, NotFound) as exc:
                ctx._stop(TIMED_OUT if isinstance(exc, JobTimedOut) else CLAIM_LOST)
                log.warning("job %s: heartbeat refused (%s)", ctx.id, exc)
                return
            except JobqError as exc:
                # The lease may still hold; the next beat tells. If it lapsed, that beat gets 409.
                log.warning("job %s: heartbeat failed (%s); trying again", ctx.id, exc)
                continue
            if beat.cancel_requested:
                ctx._stop(CANCEL_REQUESTED)
                return


def _unrecorded(ctx: JobContext, exc: JobqError) -> None:
    """Log why a job's outcome (complete, fail, release) was not recorded."""
    if isinstance(exc, Conflict):
        log.warning("job %s: claim lost before the outcome was recorded (%s)", ctx.id, exc)
    elif isinstance(exc, NotFound):
        log.warning("job %s: gone before the outcome was recorded (%s)", ctx.id, exc)
    else:
        log.error("job %s: could not record the outcome (%s); it will run again after its lease", ctx.id, exc)


def _answer(hand_ins: list[_HandIn], outcome: CompleteOutcome | None) -> None:
    for h in hand_ins:
        if not h.answer.done():
            h.answer.set_result(outcome)


def _about_hand_ins(error: Any) -> bool:
    loc = error.get("loc") if isinstance(error, dict) else None
    return isinstance(loc, list) and loc[:2] == ["body", "complete"]


def _about_limit(error: Any) -> bool:
    loc = error.get("loc") if isinstance(error, dict) else None
    return isinstance(loc, list) and loc[-1:] == ["limit"]


def _lower_limit(errors: list[dict[str, Any]], sent: int) -> int:
    """The claim limit to try after `sent` was refused: the server's maximum when it says so, else half."""
    for e in errors:
        ctx = e.get("ctx")
        le = ctx.get("le") if isinstance(ctx, dict) else None
        if isinstance(le, int) and not isinstance(le, bool) and 1 <= le < sent:
            return le
    return max(1, sent // 2)


def _discard_outcome(future: asyncio.Future[Any]) -> None:
    # The outcome of an abandoned handler is not reported; reading it keeps asyncio from logging it.
    if not future.cancelled():
        future.exception()


async def _first(*waits: Awaitable[Any]) -> None:
    """Wait until one of these finishes; cancel the rest."""
    futures = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in futures:
            f.cancel()


async def _call_async(handler: Handler, ctx: JobContext) -> Any:
    try:
        return await handler(ctx)
    except (SystemExit, KeyboardInterrupt) as exc:  # it fails the job, as from a sync handler
        raise _Escaped(exc) from exc


def _in_thread(handler: Handler, ctx: JobContext) -> asyncio.Future[Any]:
    """Run a sync handler in a daemon thread of its own: a handler that never returns cannot keep the
    process from exiting after a stop (an executor's threads would be joined at exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def run() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = context.run(handler, ctx)
        except StopIteration as exc:  # a future refuses StopIteration: the job would never be settled
            error = RuntimeError(f"the handler raised {_error_text(exc)}")
        except BaseException as exc:  # reported as the job's failure, like any other
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: the worker stopped without us
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=f"jobq-job-{ctx.id}", daemon=True).start()
    return future
