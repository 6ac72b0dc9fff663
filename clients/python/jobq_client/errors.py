"""Error answers as typed exceptions, chosen by the problem+json `type` (RFC 9457), never by its text.

JobqError                          every failure of a call: status, type, title, detail, problem
 +-- TransportError                no answer at all (connection refused or reset, timeout), after retries
 +-- WaitTimeout                   wait()/enqueue_and_wait(): the job had not finished in time (`.job`)
 +-- BadRequest              400   malformed-request
 +-- Unauthorized            401   unauthorized           missing or unknown API key
 +-- Forbidden               403   forbidden              the key may not do this
 +-- NotFound                404   not-found              no such route (an older server?)
 |    +-- JobNotFound        404   job-not-found
 +-- Conflict                409   any other conflict
 |    +-- ClaimLost          409   claim-lost             the token no longer holds the job
 |    +-- InvalidState       409   invalid-state          the job was cancelled under this claim
 |    +-- JobCancelled       409   job-cancelled          an operator cancelled the running job
 |    +-- JobTimedOut        409   job-timed-out          the job ran past its timeout_seconds and was failed
 +-- PayloadTooLarge         413   payload-too-large
 +-- UnsupportedMediaType    415   unsupported-media-type
 +-- ValidationError         422   validation-error       `.errors` lists each problem
 +-- RateLimited             429   too-many-waiters, rate-limited   `.retry_after`
 +-- ServerError             5xx   internal-error, and a proxy's 502/504
      +-- ServiceUnavailable 503   database-unavailable, shutting-down, not-ready   `.retry_after`

A type this client does not know maps to the class of its status (a new 409 is still a Conflict), and
to JobqError itself when the status has no class here. For a worker, every Conflict means "claim lost":
stop working on the job and do not complete it.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import httpx

if TYPE_CHECKING:
    from jobq_client.models import Job

PROBLEM_PREFIX = "urn:jobq:problem:"


class JobqError(Exception):
    """A call to jobq failed."""

    status_code: ClassVar[int | None] = None  # the status this class stands for
    slugs: ClassVar[tuple[str, ...]] = ()  # the problem types it stands for, without the prefix

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        type: str = "about:blank",
        title: str = "",
        problem: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status if status is not None else self.status_code
        self.type = type
        self.title = title
        self.detail = detail
        self.problem: dict[str, Any] = dict(problem or {})
        self.retry_after = retry_after
        super().__init__(detail)

    @property
    def slug(self) -> str:
        """The problem type without `urn:jobq:problem:` (empty for a type from elsewhere)."""
        return self.type.removeprefix(PROBLEM_PREFIX) if self.type.startswith(PROBLEM_PREFIX) else ""

    def __str__(self) -> str:
        head = " ".join(p for p in (str(self.status) if self.status else "", self.slug or self.title) if p)
        return f"{head}: {self.detail}" if head else self.detail


class TransportError(JobqError):
    """No answer from the server (connection refused or reset, timeout); the retries, if any, ran out."""


class WaitTimeout(JobqError, TimeoutError):
    """The job had not finished when the wait's timeout passed; `.job` is the job as it was then."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.id} is still {job.status} after the wait's timeout", type="about:blank")
        self.job = job


class BadRequest(JobqError):
    status_code = 400
    slugs = ("malformed-request",)


class Unauthorized(JobqError):
    status_code = 401
    slugs = ("unauthorized",)


class Forbidden(JobqError):
    status_code = 403
    slugs = ("forbidden",)


class NotFound(JobqError):
    status_code = 404
    slugs: ClassVar[tuple[str, ...]] = ("not-found",)


class JobNotFound(NotFound):
    slugs = ("job-not-found",)


class Conflict(JobqError):
    """The job is no longer held by this claim, or is in a state that refuses the call."""

    status_code = 409
    slugs: ClassVar[tuple[str, ...]] = ("conflict",)


class ClaimLost(Conflict):
    slugs = ("claim-lost",)


class InvalidState(Conflict):
    slugs = ("invalid-state",)


class JobCancelled(Conflict):
    slugs = ("job-cancelled",)


class JobTimedOut(Conflict):
    """The job ran longer than its `timeout_seconds` since this claim: the server failed it (`last_error`
    "timeout") and will retry it or not as after any failure. Stop working on it."""

    slugs = ("job-timed-out",)


class PayloadTooLarge(JobqError):
    status_code = 413
    slugs = ("payload-too-large",)


class UnsupportedMediaType(JobqError):
    status_code = 415
    slugs = ("unsupported-media-type",)


class ValidationError(JobqError):
    status_code = 422
    slugs = ("validation-error",)

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Each problem with its location (`loc`), message (`msg`) and kind (`type`)."""
        found = self.problem.get("errors")
        return list(found) if isinstance(found, list) else []


class RateLimited(JobqError):
    status_code = 429
    slugs = ("too-many-waiters", "rate-limited", "too-many-requests")


class ServerError(JobqError):
    status_code = 500
    slugs: ClassVar[tuple[str, ...]] = ("internal-error",)


class ServiceUnavailable(ServerError):
    status_code = 503
    slugs = ("database-unavailable", "shutting-down", "not-ready")


def _classes(base: type[JobqError]) -> list[type[JobqError]]:
    found = []
    for sub in base.__subclasses__():
        found.append(sub)
        found.extend(_classes(sub))
    return found


_BY_SLUG: dict[str, type[JobqError]] = {}
_BY_STATUS: dict[int, type[JobqError]] = {}
for _cls in _classes(JobqError):
    for _slug in _cls.slugs:
        _BY_SLUG[_slug] = _cls
    if _cls.status_code is not None:
        _BY_STATUS.setdefault(_cls.status_code, _cls)  # the family's base class comes first


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_from_response(response: httpx.Response) -> JobqError:
    """The exception for an error answer: by problem type, else by status, else JobqError."""
    status = response.status_code
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    problem: dict[str, Any] = {}
    try:
        doc = response.json()
        if isinstance(doc, dict):
            problem = doc
    except ValueError:
        pass
    type_ = str(problem.get("type") or "about:blank")
    title = str(problem.get("title") or response.reason_phrase or "")
    detail = problem.get("detail")
    if not isinstance(detail, str) or not detail:
        text = response.text.strip() if not problem else ""
        detail = text[:500] or title or f"HTTP {status}"
    slug = type_.removeprefix(PROBLEM_PREFIX) if type_.startswith(PROBLEM_PREFIX) else ""
    cls = _BY_SLUG.get(slug) if slug else None
    if cls is None or cls.status_code != status:  # unknown, or a type at an unexpected status
        cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else JobqError)
    return cls(detail, status=status, type=type_, title=title, problem=problem, retry_after=retry_after)
