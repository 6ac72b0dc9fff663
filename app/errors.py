"""Every error the API can answer with, rendered as RFC 9457 application/problem+json.

AppError
 +-- BadRequest             400 malformed-request    body is not JSON / not decodable
 +-- ValidationFailed       422 validation-error     JSON that breaks the contract (with `errors`)
 +-- SearchTooBroad         422 search-too-broad     a search that did not finish in its time limit
 +-- UnsupportedMediaType   415 unsupported-media-type
 +-- PayloadTooLarge        413 payload-too-large
 +-- Unauthorized           401 unauthorized         no API key, or one that is unknown, revoked or malformed
 +-- Forbidden              403 forbidden            the key lacks the scope, or the queue is outside its patterns
 |    +-- ProxyWithoutKeys  403 proxy-without-keys   auth off, and the request came through a proxy
 |    +-- ForeignOrigin     403 foreign-origin       auth off, and a web page of another origin sent it
 +-- NotFound               404 not-found            no such route
 +-- JobNotFound            404 job-not-found
 +-- ScheduleNotFound       404 schedule-not-found
 +-- WorkerNotFound         404 worker-not-found     no worker of this name was seen (in the key's queues)
 +-- MethodNotAllowed       405 method-not-allowed
 +-- Conflict               409 (base of the lease and state conflicts)
 |    +-- ClaimLost         409 claim-lost           token stale: the lease lapsed or another worker holds it
 |    +-- JobCancelled      409 job-cancelled        an operator cancelled the job while this claim held it
 |    +-- JobTimedOut       409 job-timed-out        the job ran past its timeout_seconds and was failed
 |    +-- InvalidState      409 invalid-state        the job is not in a state that allows the action
 +-- RequestTimeout         408 request-timeout      the request's headers did not arrive in time
 +-- HostNotAllowed         421 host-not-allowed     auth off, and Host is not a loopback name (DNS rebinding)
 +-- HeadersTooLarge        431 headers-too-large    request line and headers over their caps
 +-- TooManyWaiters         429 too-many-waiters     long-poll cap of the process, or of the client, reached
 +-- KeyLookupsThrottled    429 key-lookups-throttled  too many unknown API keys tried at once
 +-- DatabaseUnavailable    503 database-unavailable (Retry-After)
 |    +-- StatementTimeout  503 database-unavailable a statement ran past its statement_timeout
 +-- ShuttingDown           503 shutting-down        (Retry-After)
 +-- TooManyConnections     503 too-many-connections connection cap of the process reached (Retry-After)
 +-- NotReady               503 not-ready            migrations pending (readyz)
 +-- InternalError          500 internal-error

The `type` of each is a stable URN: clients branch on it, never on `title` or `detail`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

PROBLEM_TYPE_PREFIX = "urn:jobq:problem:"
PROBLEM_MEDIA_TYPE = "application/problem+json"


class AppError(Exception):
    """Internal server error."""

    status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal-error"
    title: ClassVar[str] = "Internal server error"
    retry_after: ClassVar[int | None] = None

    def __init__(self, detail: str | None = None, **extra: Any) -> None:
        self.detail = detail or (type(self).__doc__ or self.title).strip()
        self.extra = extra
        super().__init__(self.detail)

    @property
    def type(self) -> str:
        return PROBLEM_TYPE_PREFIX + self.slug

    def body(self, instance: str | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {"type": self.type, "title": self.title, "status": self.status}
        doc["detail"] = self.detail
        if instance:
            doc["instance"] = instance
        doc.update(self.extra)
        return doc

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after)} if self.retry_after is not None else {}

    def render(self, instance: str | None = None) -> bytes:
        return orjson.dumps(self.body(instance))


class InternalError(AppError):
    """The server failed to handle the request; it was logged."""


class BadRequest(AppError):
    """The request body is not valid JSON."""

    status, slug, title = 400, "malformed-request", "Malformed request"


class ValidationFailed(AppError):
    """The request does not match the API contract; see `errors`."""

    status, slug, title = 422, "validation-error", "Validation failed"


class SearchTooBroad(AppError):
    """The search did not finish within its time limit: narrow it (a queue and a status, or a more specific
    filter)."""

    status, slug, title = 422, "search-too-broad", "Search too broad"


class UnsupportedMediaType(AppError):
    """Send the body as application/json."""

    status, slug, title = 415, "unsupported-media-type", "Unsupported media type"


class PayloadTooLarge(AppError):
    """The request body is larger than the service accepts."""

    status, slug, title = 413, "payload-too-large", "Payload too large"


class Unauthorized(AppError):
    """Send a valid API key: `Authorization: Bearer <key>`."""

    status, slug, title = 401, "unauthorized", "Unauthorized"

    def __init__(self, detail: str | None = None, *, invalid: bool = False) -> None:
        super().__init__(detail)
        # RFC 6750: a challenge always; error="invalid_token" only when a key was sent and refused.
        self.challenge = 'Bearer realm="jobq"' + (', error="invalid_token"' if invalid else "")

    def headers(self) -> dict[str, str]:
        return {"www-authenticate": self.challenge}


class Forbidden(AppError):
    """This API key may not do that."""

    status, slug, title = 403, "forbidden", "Forbidden"


class ProxyWithoutKeys(Forbidden):
    """This jobq runs without API keys, and this request came through a proxy; turn keys on (JOBQ_AUTH=on)."""

    slug, title = "proxy-without-keys", "API keys required behind a proxy"


class ForeignOrigin(Forbidden):
    """This jobq runs without API keys and refuses requests sent by web pages of another origin."""

    slug, title = "foreign-origin", "Cross-origin request refused"


class RequestTimeout(AppError):
    """The request line and headers, or the next part of its body, did not arrive in time; the connection is
    closed."""

    status, slug, title = 408, "request-timeout", "Request timeout"


class HostNotAllowed(AppError):
    """This jobq runs without API keys and answers only requests addressed to a loopback name or address."""

    status, slug, title = 421, "host-not-allowed", "Host not allowed"


class HeadersTooLarge(AppError):
    """The request line and headers are larger, or more numerous, than the server accepts."""

    status, slug, title = 431, "headers-too-large", "Request headers too large"


class NotFound(AppError):
    """No such resource."""

    status, slug, title = 404, "not-found", "Not found"


class JobNotFound(AppError):
    """No job has this id."""

    status, slug, title = 404, "job-not-found", "Job not found"


class WorkerNotFound(AppError):
    """No worker of this name was seen (or none in a queue this key may use)."""

    status, slug, title = 404, "worker-not-found", "Worker not found"


class ScheduleNotFound(AppError):
    """No schedule has this name (or none that this key may see)."""

    status, slug, title = 404, "schedule-not-found", "Schedule not found"


class MethodNotAllowed(AppError):
    """This resource does not accept that method."""

    status, slug, title = 405, "method-not-allowed", "Method not allowed"

    def __init__(self, allowed: list[str] | None = None) -> None:
        super().__init__()
        self.allowed = allowed or []

    def headers(self) -> dict[str, str]:
        # RFC 9110 15.5.6: a 405 must list the methods the resource does support.
        return {"allow": ", ".join(self.allowed)}


class Conflict(AppError):
    """The request conflicts with the job's current state."""

    status, slug, title = 409, "conflict", "Conflict"


class ClaimLost(Conflict):
    """This claim token no longer holds the job: its lease lapsed or another claim replaced it."""

    slug, title = "claim-lost", "Claim lost"


class JobCancelled(Conflict):
    """An operator cancelled this job while your claim held it; stop working on it."""

    slug, title = "job-cancelled", "Job cancelled"


class JobTimedOut(Conflict):
    """The job ran longer than its timeout_seconds since this claim and was failed (`last_error` "timeout");
    stop working on it and send nothing more for it."""

    slug, title = "job-timed-out", "Job timed out"


class InvalidState(Conflict):
    """The job is not in a state that allows this action."""

    slug, title = "invalid-state", "Invalid job state"


class TooManyWaiters(AppError):
    """Too many long-polls are waiting on this server; retry after a pause."""

    status, slug, title, retry_after = 429, "too-many-waiters", "Too many waiting claims", 1


class KeyLookupsThrottled(AppError):
    """Too many unknown API keys are being tried on this server; retry after a pause."""

    status, slug, title, retry_after = 429, "key-lookups-throttled", "Too many unknown keys", 1


class DatabaseUnavailable(AppError):
    """The database cannot be reached right now; retry after a pause."""

    status, slug, title, retry_after = 503, "database-unavailable", "Database unavailable", 2


class StatementTimeout(DatabaseUnavailable):
    """The database did not answer within the statement timeout; retry after a pause."""


class ShuttingDown(AppError):
    """This server is shutting down; retry on another replica or after a pause."""

    status, slug, title, retry_after = 503, "shutting-down", "Shutting down", 1


class TooManyConnections(AppError):
    """This server holds as many connections as it may; retry after a pause, or on another replica."""

    status, slug, title, retry_after = 503, "too-many-connections", "Too many connections", 1


class NotReady(AppError):
    """The database schema is behind this version of jobq; run `jobq migrate`."""

    status, slug, title, retry_after = 503, "not-ready", "Not ready", 5


def validation_problem(errors: list[dict[str, Any]]) -> AppError:
    """Turn pydantic error dicts (FastAPI's or our own) into one problem, JSON-syntax errors as 400."""
    cleaned = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in errors]
    if any(e["type"] == "json_invalid" for e in cleaned):
        first = next(e for e in cleaned if e["type"] == "json_invalid")
        return BadRequest(f"The request body is not valid JSON: {first['msg']}")
    summary = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in cleaned[:5])
    return ValidationFailed(summary or None, errors=cleaned)
