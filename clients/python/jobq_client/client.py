"""Client and AsyncClient: one method per API call, typed answers, typed errors, safe retries."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import httpx

from jobq_client import _calls
from jobq_client._calls import Call, RetryPolicy
from jobq_client._tracing import inject
from jobq_client.errors import JobqError, TransportError, WaitTimeout, error_from_response
from jobq_client.models import (
    Claim,
    Claimed,
    CompleteOutcome,
    Debounce,
    Enqueued,
    Heartbeat,
    Job,
    JobState,
    NewJob,
    OnDependencyFailure,
    Unique,
)

__version__ = "0.1.0"

log = logging.getLogger("jobq_client")
T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
# How long one request of wait() waits on the server; the server's longest is JOBQ_WAIT_MAX_SECONDS (30 by
# default). Longer waits are several requests.
WAIT_CHUNK_SECONDS = 20.0


def _wait_step(deadline: float | None, chunk: float) -> float:
    return chunk if deadline is None else max(0.0, min(chunk, deadline - time.monotonic()))


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


# This machine's name as the User-Agent carries it: the characters a host name may hold, nothing else.
_HOST = re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname())[:255] or "unknown"


class _Base:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None,
        timeout: float,
        retry: RetryPolicy | None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.wait_chunk = WAIT_CHUNK_SECONDS
        self.retry = retry or RetryPolicy()
        self._headers = {
            "accept": "application/json, application/problem+json",
            "content-type": "application/json",
            # The host rides in a comment: jobq's worker registry shows it (GET /workers).
            "user-agent": f"jobq-client-python/{__version__} (host={_HOST})",
        }
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"

    def _request(self, call: Call[Any]) -> dict[str, Any]:
        headers = dict(self._headers)
        if call.body is None:
            del headers["content-type"]
        if call.headers:
            headers.update(call.headers)
        inject(headers)  # the current trace context, when OpenTelemetry is installed and a span is current
        return {
            "method": call.method,
            "url": self.base_url + call.path,
            "content": call.content(),
            "headers": headers,
            # The server may hold a long-poll for wait_seconds before it answers.
            "timeout": httpx.Timeout(self.timeout + call.long_poll, connect=self.timeout),
        }

    def _answer(self, call: Call[T], response: httpx.Response) -> T | JobqError:
        if not response.is_success:
            return error_from_response(response)
        try:
            return call.parse(response)
        except (ValueError, KeyError, TypeError) as exc:
            # A 2xx that is not jobq's answer: a proxy's page, or a server that speaks another contract.
            return JobqError(
                f"{call.operation}: unexpected answer ({exc!r}): {response.text[:200]}", status=response.status_code
            )

    def _no_answer(self, call: Call[Any], exc: httpx.TransportError, attempts: int) -> TransportError:
        what = type(exc).__name__
        return TransportError(
            f"{call.method} {call.path}: no answer after {attempts} attempt(s) ({what}: {exc})", type="about:blank"
        )

    @staticmethod
    def _log_retry(call: Call[Any], attempt: int, why: str, delay: float) -> None:
        log.info("retrying %s (attempt %d failed: %s) in %.2fs", call.operation, attempt, why, delay)


class Client(_Base):
    """A blocking client. Thread-safe; reuse one per process (it keeps connections open).

    `api_key` is sent as `Authorization: Bearer <key>`. `retry` says how often and how long to retry
    where that is safe (see RetryPolicy; `NO_RETRY` turns retries off). `http_client` lets you bring
    your own httpx.Client (proxies, TLS, event hooks); it is then yours to close."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(base_url, api_key=api_key, timeout=timeout, retry=retry)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(**self._request(call))
            except httpx.TransportError as exc:
                delay = call.retry_after_error(self.retry, attempt, exc)
                if delay is None:
                    raise self._no_answer(call, exc, attempt) from exc
                self._log_retry(call, attempt, type(exc).__name__, delay)
                time.sleep(delay)
                continue
            answer = self._answer(call, response)
            if not isinstance(answer, JobqError):
                return answer
            delay = call.retry_after_answer(self.retry, attempt, answer)
            if delay is None:
                raise answer
            self._log_retry(call, attempt, str(answer), delay)
            time.sleep(delay)

    # -- producers -----------------------------------------------------------------------------------

    @overload
    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int | None = ...,
        run_at: datetime | str | None = ...,
        delay_seconds: float | None = ...,
        max_attempts: int | None = ...,
        idempotency_key: str | None = ...,
        depends_on: Sequence[int] | None = ...,
        on_dependency_failure: OnDependencyFailure | None = ...,
        timeout_seconds: int | None = ...,
        unique: Unique | Mapping[str, Any] | None = ...,
        debounce: Debounce | Mapping[str, Any] | None = ...,
        minimal: Literal[False] = ...,
    ) -> Job: ...
    @overload
    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int | None = ...,
        run_at: datetime | str | None = ...,
        delay_seconds: float | None = ...,
        max_attempts: int | None = ...,
        idempotency_key: str | None = ...,
        depends_on: Sequence[int] | None = ...,
        on_dependency_failure: OnDependencyFailure | None = ...,
        timeout_seconds: int | None = ...,
        unique: Unique | Mapping[str, Any] | None = ...,
        debounce: Debounce | Mapping[str, Any] | None = ...,
        minimal: Literal[True],
    ) -> Enqueued: ...
    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int | None = None,
        run_at: datetime | str | None = None,
        delay_seconds: float | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        depends_on: Sequence[int] | None = None,
        on_dependency_failure: OnDependencyFailure | None = None,
        timeout_seconds: int | None = None,
        unique: Unique | Mapping[str, Any] | None = None,
        debounce: Debounce | Mapping[str, Any] | None = None,
        minimal: bool = False,
    ) -> Job | Enqueued:
        """Add a job. With an `idempotency_key`, a repeat returns the existing job, and this call is
        retried on any transient failure; without one it is retried only when it cannot have arrived.
        With `depends_on` (job ids), the job waits until those have completed; `on_dependency_failure`:
        "cancel" (default) or "run" when one of them fails or is cancelled. With `unique` (Unique, or its
        JSON: {"key", "for_seconds", "while"}), a job that holds the key is returned instead of a new one. With
        `debounce` (Debounce, or {"key", "seconds", "max_wait_seconds"}), the key's pending job is replaced.
        With `minimal=True` the answer is the job's id and status only (Enqueued; `created` is False for an
        idempotency or unique hit and a debounced replace): the server skips the whole job (Prefer:
        return=minimal)."""
        call = _calls.enqueue(
            queue,
            payload,
            priority=priority,
            run_at=run_at,
            delay_seconds=delay_seconds,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            depends_on=depends_on,
            on_dependency_failure=on_dependency_failure,
            timeout_seconds=timeout_seconds,
            unique=unique,
            debounce=debounce,
        )
        if minimal:
            return self._send(_calls.minimal(call, _calls.enqueued))
        return self._send(call)

    @overload
    def enqueue_batch(
        self, queue: str, jobs: Sequence[NewJob | Mapping[str, Any]], *, minimal: Literal[False] = ...
    ) -> list[Job]: ...
    @overload
    def enqueue_batch(
        self, queue: str, jobs: Sequence[NewJob | Mapping[str, Any]], *, minimal: Literal[True]
    ) -> list[Enqueued]: ...
    def enqueue_batch(
        self, queue: str, jobs: Sequence[NewJob | Mapping[str, Any]], *, minimal: bool = False
    ) -> list[Job] | list[Enqueued]:
        """Add several jobs, all or nothing, in order. Retried like enqueue when every job has a key. With
        `minimal=True`, each job's id and status only (Enqueued), in order."""
        call = _calls.enqueue_batch(queue, jobs)
        if minimal:
            return self._send(_calls.minimal(call, _calls.enqueued_many))
        return self._send(call)

    # -- workers ---------------------------------------------------------------------------------------

    def claim(
        self,
        queue: str,
        worker: str,
        *,
        limit: int = 1,
        lease_seconds: int | None = None,
        wait_seconds: float = 0,
    ) -> list[Claim]:
        """Claim up to `limit` jobs, waiting up to `wait_seconds` for one; [] when none came."""
        return self._send(
            _calls.claim(queue, worker, limit=limit, lease_seconds=lease_seconds, wait_seconds=wait_seconds)
        )

    def complete_and_claim(
        self,
        queue: str,
        worker: str,
        done: Sequence[tuple[int, str, Any]],
        *,
        limit: int = 1,
        lease_seconds: int | None = None,
        wait_seconds: float = 0,
    ) -> Claimed:
        """Complete the (id, claim_token, result) items, then claim up to `limit` jobs: one request where
        complete + claim take two. Each item gets its outcome in `completed`, in order."""
        return self._send(
            _calls.complete_and_claim(
                queue, worker, done, limit=limit, lease_seconds=lease_seconds, wait_seconds=wait_seconds
            )
        )

    def heartbeat(
        self, job_id: int, claim_token: str, *, lease_seconds: int | None = None, progress: Any = _calls.UNSET
    ) -> Heartbeat:
        """Extend the lease (by the claim's lease unless `lease_seconds`). ClaimLost: stop working.
        `progress` (any JSON value; None clears it) is shown on the job until the next claim."""
        return self._send(_calls.heartbeat(job_id, claim_token, lease_seconds, progress))

    @overload
    def complete(self, job_id: int, claim_token: str, result: Any = ..., *, minimal: Literal[False] = ...) -> Job: ...
    @overload
    def complete(self, job_id: int, claim_token: str, result: Any = ..., *, minimal: Literal[True]) -> JobState: ...
    def complete(self, job_id: int, claim_token: str, result: Any = None, *, minimal: bool = False) -> Job | JobState:
        """Complete the job with `result`. With `minimal=True`, its id and status only (JobState)."""
        call = _calls.complete(job_id, claim_token, result)
        if minimal:
            return self._send(_calls.minimal(call, _calls.state))
        return self._send(call)

    def complete_many(self, items: Sequence[tuple[int, str, Any]]) -> list[CompleteOutcome]:
        """Complete (id, claim_token, result) items in one request; each gets its own outcome."""
        return self._send(_calls.complete_many(items))

    @overload
    def fail(
        self,
        job_id: int,
        claim_token: str,
        error: str,
        *,
        retry_in_seconds: float | None = ...,
        retry: bool = ...,
        minimal: Literal[False] = ...,
    ) -> Job: ...
    @overload
    def fail(
        self,
        job_id: int,
        claim_token: str,
        error: str,
        *,
        retry_in_seconds: float | None = ...,
        retry: bool = ...,
        minimal: Literal[True],
    ) -> JobState: ...
    def fail(
        self,
        job_id: int,
        claim_token: str,
        error: str,
        *,
        retry_in_seconds: float | None = None,
        retry: bool = True,
        minimal: bool = False,
    ) -> Job | JobState:
        """Record a failed attempt: retried later (after `retry_in_seconds`, else the server's backoff)
        while attempts remain, or failed for good now with `retry=False`. With `minimal=True`, the job's
        id and status only (JobState): `pending` (to be retried) or `failed`."""
        call = _calls.fail(job_id, claim_token, error, retry_in_seconds=retry_in_seconds, retry=retry)
        if minimal:
            return self._send(_calls.minimal(call, _calls.state))
        return self._send(call)

    def release(self, job_id: int, claim_token: str, *, delay_seconds: float = 0) -> Job:
        """Hand a claimed job back untried (shutting down, a resource missing right now): pending again,
        claimable after `delay_seconds`, and the claim's attempt is not counted. Use fail() for a job that
        was tried. The claim ends: a repeat, like any later call with this token, raises ClaimLost."""
        return self._send(_calls.release(job_id, claim_token, delay_seconds=delay_seconds))

    # -- operators ----------------------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job:
        return self._send(_calls.get_job(job_id))

    def wait(self, job_id: int, *, timeout: float | None = None) -> Job:
        """The job once it has finished (completed, failed or cancelled: look at `status`, `result` and
        `last_error`). The server holds each request until the job finishes (up to `wait_chunk` seconds,
        holding no database connection meanwhile) and answers at once when it does. WaitTimeout, with the
        job as it was, when `timeout` seconds pass first; None waits as long as it takes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self._send(_calls.get_job(job_id, _wait_step(deadline, self.wait_chunk)))
            if job.finished:
                return job
            if _past(deadline):
                raise WaitTimeout(job)

    def enqueue_and_wait(
        self,
        queue: str,
        payload: Any,
        *,
        timeout: float | None = None,
        priority: int | None = None,
        run_at: datetime | str | None = None,
        delay_seconds: float | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        depends_on: Sequence[int] | None = None,
        on_dependency_failure: OnDependencyFailure | None = None,
        timeout_seconds: int | None = None,
        unique: Unique | Mapping[str, Any] | None = None,
        debounce: Debounce | Mapping[str, Any] | None = None,
    ) -> Job:
        """enqueue() then wait(): the job once a worker has finished it. With an `idempotency_key`, calling
        this again after a failure waits for the same job rather than making a second one."""
        job = self.enqueue(
            queue,
            payload,
            priority=priority,
            run_at=run_at,
            delay_seconds=delay_seconds,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            depends_on=depends_on,
            on_dependency_failure=on_dependency_failure,
            timeout_seconds=timeout_seconds,
            unique=unique,
            debounce=debounce,
            minimal=True,  # only its id is read
        )
        return self.wait(job.id, timeout=timeout)

    def stats(self, queue: str) -> dict[str, Any]:
        """`GET /queues/{queue}/stats`, as the server answers it."""
        return self._send(_calls.stats(queue))


class AsyncClient(_Base):
    """The asyncio twin of Client: the same methods, awaited. One per event loop."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        http_client: httpx.AsyncClient | None = None,
        max_connections: int = 100,
    ) -> None:
        super().__init__(base_url, api_key=api_key, timeout=timeout, retry=retry)
        self._owns_http = http_client is None
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = http_client or httpx.AsyncClient(limits=limits)

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(**self._request(call))
            except httpx.TransportError as exc:
                delay = call.retry_after_error(self.retry, attempt, exc)
                if delay is None:
                    raise self._no_answer(call, exc, attempt) from exc
                self._log_retry(call, attempt, type(exc).__name__, delay)
                await asyncio.sleep(delay)
                continue
            answer = self._answer(call, response)
            if not isinstance(answer, JobqError):
                return answer
            delay = call.retry_after_answer(self.retry, attempt, answer)
            if delay is None:
                raise answer
            self._log_retry(call, attempt, str(answer), delay)
            await asyncio.sleep(delay)

    @overload
    async def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int | None = ...,
        run_at: datetime | str | None = ...,
        delay_seconds: float | None = ...,
        max_attempts: int | None = ...,
        idempotency_key: str | None = ...,
        depends_on: Sequence[int] | None = ...,
        on_dependency_failure: OnDependencyFailure | None = ...,
        timeout_seconds: int | None = ...,
        unique: Unique | Mapping[str, Any] | None = ...,
        debounce: Debounce | Mapping[str, Any] | None = ...,
        minimal: Literal[False] = ...,
    ) -> Job: ...
    @overload
    async def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int | None = ...,
        run_at: datetime | str | None = ...,
        delay_seconds: float | None = ...,
        max_attempts: int | None = ...,
        idempotency_key: str | None = ...,
        depends_on: Sequence[int] | None = ...,
        on_dependency_failure: OnDependencyFailure | None = ...,
        timeout_seconds: int | None = ...,
        unique: Unique | Mapping[str, Any] | None = ...,
        debounce: Debounce | Mapping[str, Any] | None = ...,
        minimal: Literal[True],
    ) -> Enqueued: ...
    async def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int | None = None,
        run_at: datetime | str | None = None,
        delay_seconds: float | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        depends_on: Sequence[int] | None = None,
        on_dependency_failure: OnDependencyFailure | None = None,
        timeout_seconds: int | None = None,
        unique: Unique | Mapping[str, Any] | None = None,
        debounce: Debounce | Mapping[str, Any] | None = None,
        minimal: bool = False,
    ) -> Job | Enqueued:
        call = _calls.enqueue(
            queue,
            payload,
            priority=priority,
            run_at=run_at,
            delay_seconds=delay_seconds,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            depends_on=depends_on,
            on_dependency_failure=on_dependency_failure,
            timeout_seconds=timeout_seconds,
            unique=unique,
            debounce=debounce,
        )
        if minimal:
            return await self._send(_calls.minimal(call, _calls.enqueued))
        return await self._send(call)

    @overload
    async def enqueue_batch(
        self, queue: str, jobs: Sequence[NewJob | Mapping[str, Any]], *, minimal: Literal[False] = ...
    ) -> list[Job]: ...
    @overload
    async def enqueue_batch(
        self, queue: str, jobs: Sequence[NewJob | Mapping[str, Any]], *, minimal: Literal[True]
    ) -> list[Enqueued]: ...
    async def enqueue_batch(
        self, queue: str, jobs: Sequence[NewJob | Mapping[str, Any]], *, minimal: bool = False
    ) -> list[Job] | list[Enqueued]:
        call = _calls.enqueue_batch(queue, jobs)
        if minimal:
            return await self._send(_calls.minimal(call, _calls.enqueued_many))
        return await self._send(call)

    async def claim(
        self,
        queue: str,
        worker: str,
        *,
        limit: int = 1,
        lease_seconds: int | None = None,
        wait_seconds: float = 0,
    ) -> list[Claim]:
        return await self._send(
            _calls.claim(queue, worker, limit=limit, lease_seconds=lease_seconds, wait_seconds=wait_seconds)
        )

    async def complete_and_claim(
        self,
        queue: str,
        worker: str,
        done: Sequence[tuple[int, str, Any]],
        *,
        limit: int = 1,
        lease_seconds: int | None = None,
        wait_seconds: float = 0,
    ) -> Claimed:
        """Complete the (id, claim_token, result) items, then claim up to `limit` jobs: one request where
        complete + claim take two. Each item gets its outcome in `completed`, in order."""
        return await self._send(
            _calls.complete_and_claim(
                queue, worker, done, limit=limit, lease_seconds=lease_seconds, wait_seconds=wait_seconds
            )
        )

    async def heartbeat(
        self, job_id: int, claim_token: str, *, lease_seconds: int | None = None, progress: Any = _calls.UNSET
    ) -> Heartbeat:
        return await self._send(_calls.heartbeat(job_id, claim_token, lease_seconds, progress))

    @overload
    async def complete(
        self, job_id: int, claim_token: str, result: Any = ..., *, minimal: Literal[False] = ...
    ) -> Job: ...
    @overload
    async def complete(
        self, job_id: int, claim_token: str, result: Any = ..., *, minimal: Literal[True]
    ) -> JobState: ...
    async def complete(
        self, job_id: int, claim_token: str, result: Any = None, *, minimal: bool = False
    ) -> Job | JobState:
        call = _calls.complete(job_id, claim_token, result)
        if minimal:
            return await self._send(_calls.minimal(call, _calls.state))
        return await self._send(call)

    async def complete_many(self, items: Sequence[tuple[int, str, Any]]) -> list[CompleteOutcome]:
        return await self._send(_calls.complete_many(items))

    @overload
    async def fail(
        self,
        job_id: int,
        claim_token: str,
        error: str,
        *,
        retry_in_seconds: float | None = ...,
        retry: bool = ...,
        minimal: Literal[False] = ...,
    ) -> Job: ...
    @overload
    async def fail(
        self,
        job_id: int,
        claim_token: str,
        error: str,
        *,
        retry_in_seconds: float | None = ...,
        retry: bool = ...,
        minimal: Literal[True],
    ) -> JobState: ...
    async def fail(
        self,
        job_id: int,
        claim_token: str,
        error: str,
        *,
        retry_in_seconds: float | None = None,
        retry: bool = True,
        minimal: bool = False,
    ) -> Job | JobState:
        call = _calls.fail(job_id, claim_token, error, retry_in_seconds=retry_in_seconds, retry=retry)
        if minimal:
            return await self._send(_calls.minimal(call, _calls.state))
        return await self._send(call)

    async def release(self, job_id: int, claim_token: str, *, delay_seconds: float = 0) -> Job:
        return await self._send(_calls.release(job_id, claim_token, delay_seconds=delay_seconds))

    async def get_job(self, job_id: int) -> Job:
        return await self._send(_calls.get_job(job_id))

    async def wait(self, job_id: int, *, timeout: float | None = None) -> Job:
        """The job once it has finished; WaitTimeout when `timeout` seconds pass first (see Client.wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = await self._send(_calls.get_job(job_id, _wait_step(deadline, self.wait_chunk)))
            if job.finished:
                return job
            if _past(deadline):
                raise WaitTimeout(job)

    async def enqueue_and_wait(
        self,
        queue: str,
        payload: Any,
        *,
        timeout: float | None = None,
        priority: int | None = None,
        run_at: datetime | str | None = None,
        delay_seconds: float | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        depends_on: Sequence[int] | None = None,
        on_dependency_failure: OnDependencyFailure | None = None,
        timeout_seconds: int | None = None,
        unique: Unique | Mapping[str, Any] | None = None,
        debounce: Debounce | Mapping[str, Any] | None = None,
    ) -> Job:
        """enqueue() then wait() (see Client.enqueue_and_wait)."""
        job = await self.enqueue(
            queue,
            payload,
            priority=priority,
            run_at=run_at,
            delay_seconds=delay_seconds,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            depends_on=depends_on,
            on_dependency_failure=on_dependency_failure,
            timeout_seconds=timeout_seconds,
            unique=unique,
            debounce=debounce,
            minimal=True,  # only its id is read
        )
        return await self.wait(job.id, timeout=timeout)

    async def stats(self, queue: str) -> dict[str, Any]:
        return await self._send(_calls.stats(queue))
