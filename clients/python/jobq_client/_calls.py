"""The API calls as data (method, path, body, retry rule, parser), shared by Client and AsyncClient, and
the retry decision: which failures a call may be repeated after, and how long to wait first."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from jobq_client.errors import JobqError, RateLimited, ServerError
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

T = TypeVar("T")


class Safety(Enum):
    """When a call may be sent again."""

    # Repeating it changes nothing (reads; heartbeat, complete and fail with the same token; release,
    # whose repeat gets 409 claim-lost since the first ended the claim), or the worst a repeat does is
    # acceptable (claim: a lost answer leaves jobs claimed until their lease lapses, then the sweeper
    # hands them out again).
    REPEATABLE = "repeatable"
    # Only when the server cannot have acted on it: the connection was never made, or a 429, which
    # refuses the request before any work. (Enqueue without an idempotency key: a 503 may come after
    # the INSERT committed, and a repeat would create a second job.)
    UNSENT_ONLY = "unsent-only"


@dataclass(frozen=True)
class RetryPolicy:
    """Retries for connection errors, 429 and 502/503/504, on the calls where a retry is safe.

    `attempts` counts every try, the first included (1 = never retry). Without a Retry-After header
    the wait is exponential with full jitter: uniform(0, min(backoff_max, backoff_base * 2**n)).
    A Retry-After header is honoured, up to `retry_after_max` seconds."""

    attempts: int = 5
    backoff_base: float = 0.2
    backoff_max: float = 10.0
    retry_after_max: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts counts the first try too: it must be at least 1")

    def backoff(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after try number `attempt` (1-based) failed."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.retry_after_max)
        return random.uniform(0, min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1)))


NO_RETRY = RetryPolicy(attempts=1)

# Raised before the request left this host: a repeat cannot duplicate anything.
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class Call(Generic[T]):
    operation: str  # the OpenAPI operationId, for logs
    method: str
    path: str
    body: Any  # JSON document, or None for no body
    safety: Safety
    parse: Callable[[httpx.Response], T]
    long_poll: float = 0.0  # seconds the server may hold the request before it answers
    headers: Mapping[str, str] | None = None  # sent besides the client's own

    def content(self) -> bytes | None:
        if self.body is None:
            return None
        # Strict JSON: NaN and Infinity are refused here rather than by the server.
        return json.dumps(self.body, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode()

    def retry_after_error(self, policy: RetryPolicy, attempt: int, exc: httpx.TransportError) -> float | None:
        """Seconds to wait before repeating after no answer came, or None to give up."""
        if attempt >= policy.attempts:
            return None
        if self.safety is Safety.REPEATABLE or isinstance(exc, _UNSENT):
            return policy.backoff(attempt)
        return None

    def retry_after_answer(self, policy: RetryPolicy, attempt: int, error: JobqError) -> float | None:
        """Seconds to wait before repeating after an error answer, or None to give up."""
        if attempt >= policy.attempts:
            return None
        if isinstance(error, RateLimited):
            return policy.backoff(attempt, error.retry_after)
        if self.safety is Safety.REPEATABLE and isinstance(error, ServerError) and error.status in (502, 503, 504):
            return policy.backoff(attempt, error.retry_after)
        return None


def _q(queue: str) -> str:
    return quote(queue, safe=":")


def _drop_none(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if v is not None}


def _job(response: httpx.Response) -> Job:
    return Job.from_json(response.json())


def _enqueued(response: httpx.Response) -> Job:
    """An enqueue's job, with what the enqueue did (Jobq-Enqueued: created, existing or replaced)."""
    return replace(Job.from_json(response.json()), enqueued=response.headers.get("jobq-enqueued"))


def _enqueued_jobs(response: httpx.Response) -> list[Job]:
    doc = response.json()
    outcomes = doc.get("enqueued") or [None] * len(doc["jobs"])  # a server older than the field
    return [replace(Job.from_json(j), enqueued=e) for j, e in zip(doc["jobs"], outcomes, strict=True)]


def minimal(call: Call[Any], parse: Callable[[httpx.Response], T]) -> Call[T]:
    """The call with `Prefer: return=minimal` (RFC 7240), its answer read by `parse`: ids and states only,
    so the server skips building, encoding and sending the whole job. A server without minimal answers
    ignores the header and sends the job, which the same parsers read."""
    return Call(call.operation, call.method, call.path, call.body, call.safety, parse, call.long_poll, _MINIMAL)


_MINIMAL = {"prefer": "return=minimal"}


def state(response: httpx.Response) -> JobState:
    return JobState.from_json(response.json())


def enqueued(response: httpx.Response) -> Enqueued:
    return Enqueued.from_json(response.json(), created=response.status_code == 201)


def enqueued_many(response: httpx.Response) -> list[Enqueued]:
    return [Enqueued.from_json(j) for j in response.json()["jobs"]]


def _claims(response: httpx.Response) -> list[Claim]:
    return [Claim.from_json(j) for j in response.json()["jobs"]]


def _claimed(response: httpx.Response) -> Claimed:
    return Claimed.from_json(response.json())


def _heartbeat(response: httpx.Response) -> Heartbeat:
    return Heartbeat.from_json(response.json())


def _outcomes(response: httpx.Response) -> list[CompleteOutcome]:
    return [CompleteOutcome.from_json(o) for o in response.json()["results"]]


def _document(response: httpx.Response) -> dict[str, Any]:
    doc: dict[str, Any] = response.json()
    return doc


def enqueue(
    queue: str,
    payload: Any,
    *,
    priority: int | None,
    run_at: datetime | str | None,
    delay_seconds: float | None,
    max_attempts: int | None,
    idempotency_key: str | None,
    depends_on: Sequence[int] | None = None,
    on_dependency_failure: OnDependencyFailure | None = None,
    timeout_seconds: int | None = None,
    unique: Unique | Mapping[str, Any] | None = None,
    debounce: Debounce | Mapping[str, Any] | None = None,
) -> Call[Job]:
    job = NewJob(
        payload,
        priority,
        run_at,
        delay_seconds,
        max_attempts,
        idempotency_key,
        depends_on,
        on_dependency_failure,
        timeout_seconds=timeout_seconds,
        unique=unique,
        debounce=debounce,
    )
    # A unique job is not repeatable for sure: its holder may have failed, or its window ended, in between.
    safety = Safety.REPEATABLE if idempotency_key is not None else Safety.UNSENT_ONLY
    return Call("enqueueJob", "POST", f"/queues/{_q(queue)}/jobs", job.to_json(), safety, _enqueued)


def enqueue_batch(queue: str, jobs: Sequence[NewJob | Mapping[str, Any]]) -> Call[list[Job]]:
    docs = [j.to_json() if isinstance(j, NewJob) else dict(j) for j in jobs]
    # All or nothing: a repeat is harmless only when every job of it carries its own key.
    keyed = bool(docs) and all(d.get("idempotency_key") is not None for d in docs)
    safety = Safety.REPEATABLE if keyed else Safety.UNSENT_ONLY
    return Call("enqueueJobs", "POST", f"/queues/{_q(queue)}/jobs/batch", {"jobs": docs}, safety, _enqueued_jobs)


def claim(queue: str, worker: str, *, limit: int, lease_seconds: int | None, wait_seconds: float) -> Call[list[Claim]]:
    body = _drop_none({"worker": worker, "limit": limit, "lease_seconds": lease_seconds, "wait_seconds": wait_seconds})
    return Call(
        "claimJobs", "POST", f"/queues/{_q(queue)}/claim", body, Safety.REPEATABLE, _claims, long_poll=wait_seconds
    )


def complete_and_claim(
    queue: str,
    worker: str,
    done: Sequence[tuple[int, str, Any]],
    *,
    limit: int,
    lease_seconds: int | None,
    wait_seconds: float,
) -> Call[Claimed]:
    """Complete (id, claim_token, result) items, then claim, in one request. Repeatable: a complete
    repeated with the token that completed the job is "completed" again."""
    body = _drop_none({"worker": worker, "limit": limit, "lease_seconds": lease_seconds, "wait_seconds": wait_seconds})
    body["complete"] = [{"id": int(i), "claim_token": t, "result": r} for i, t, r in done]
    return Call(
        "claimJobs", "POST", f"/queues/{_q(queue)}/claim", body, Safety.REPEATABLE, _claimed, long_poll=wait_seconds
    )


class _Unset(Enum):
    UNSET = "unset"


UNSET = _Unset.UNSET  # an argument left out, where None means JSON null


def heartbeat(job_id: int, claim_token: str, lease_seconds: int | None, progress: Any = UNSET) -> Call[Heartbeat]:
    body = _drop_none({"claim_token": claim_token, "lease_seconds": lease_seconds})
    if progress is not UNSET:
        body["progress"] = progress
    return Call("heartbeatJob", "POST", f"/jobs/{int(job_id)}/heartbeat", body, Safety.REPEATABLE, _heartbeat)


def complete(job_id: int, claim_token: str, result: Any) -> Call[Job]:
    body = {"claim_token": claim_token, "result": result}
    return Call("completeJob", "POST", f"/jobs/{int(job_id)}/complete", body, Safety.REPEATABLE, _job)


def complete_many(items: Sequence[tuple[int, str, Any]]) -> Call[list[CompleteOutcome]]:
    body = {"jobs": [{"id": int(i), "claim_token": t, "result": r} for i, t, r in items]}
    return Call("completeJobs", "POST", "/jobs/complete", body, Safety.REPEATABLE, _outcomes)


def fail(job_id: int, claim_token: str, error: str, *, retry_in_seconds: float | None, retry: bool) -> Call[Job]:
    body: dict[str, Any] = _drop_none(
        {"claim_token": claim_token, "error": error, "retry_in_seconds": retry_in_seconds}
    )
    if not retry:
        body["retry"] = False
    return Call("failJob", "POST", f"/jobs/{int(job_id)}/fail", body, Safety.REPEATABLE, _job)


def release(job_id: int, claim_token: str, *, delay_seconds: float) -> Call[Job]:
    body = {"claim_token": claim_token, "delay_seconds": delay_seconds}
    return Call("releaseJob", "POST", f"/jobs/{int(job_id)}/release", body, Safety.REPEATABLE, _job)


def get_job(job_id: int, wait_seconds: float = 0) -> Call[Job]:
    """The job; with wait_seconds, once it has finished or else as it is when they have passed."""
    path = f"/jobs/{int(job_id)}" + (f"?wait_seconds={wait_seconds:g}" if wait_seconds > 0 else "")
    return Call("getJob", "GET", path, None, Safety.REPEATABLE, _job, long_poll=wait_seconds)


def stats(queue: str) -> Call[dict[str, Any]]:
    return Call("getQueueStats", "GET", f"/queues/{_q(queue)}/stats", None, Safety.REPEATABLE, _document)
