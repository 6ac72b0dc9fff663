"""Who is calling and what it may do: API keys, scopes, queue patterns, and `require()` for routes.

Every route that is not open calls `require()` first; it raises 401 or 403 as problem+json:

    from app.auth.policy import require

    who = require(request, "produce", queue)  # enqueue on `queue`
    who = require(request, "consume", queue)  # claim on `queue`
    who = require(request, "consume")         # a worker write addressed by job id (see below)
    who = require(request, "admin")           # stats, listings, admin actions
    who = require(request, "metrics")         # GET /metrics
    who = require(request)                    # any key with a job scope (e.g. GET /jobs/{id})

Scopes: `produce` enqueues; `consume` claims, heartbeats, completes and fails; `admin` may do all of
that and also reach stats, listings, admin actions and /metrics. `metrics` reaches GET /metrics and
nothing else (a scraper's credential: least privilege), so `require(request)` without a scope still
refuses a key that holds only `metrics`. A key may be limited to queue-name patterns (`*` matches any
run of characters): `require(request, scope, queue)` refuses other queues with 403. A key holding
`metrics` never is: /metrics covers every queue (the CLI and the schema refuse such a key).

Routes addressed by job id do not know the queue before the database does, and must not read the job
first: they pass `who.queue_regex` (None: every queue) into the guarded SQL, as
`AND (allowed IS NULL OR j.queue_name ~ allowed)`, and report a job outside it exactly like a missing
one (404 job-not-found), so that a key learns nothing about queues it cannot see. Listings across queues
filter the same way in SQL, or row by row with `who.allows(queue)`.

Authentication itself happens before any route, in the `Authenticate` ASGI layer (the outermost one, so
a request without a valid key is refused before its body is read); it leaves the Principal in
scope["state"]["principal"], where both the lean dispatcher and FastAPI find it. With auth off (the
loopback quickstart, or JOBQ_AUTH=off) the principal is OPEN, which may do everything.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import AppError, Forbidden, Unauthorized
from app.http.responses import problem_response

KeyScope = Literal["produce", "consume", "admin", "metrics"]
SCOPES: tuple[KeyScope, ...] = ("produce", "consume", "admin", "metrics")
# The scopes that reach jobs; a key holding none of them (only `metrics`) reaches GET /metrics alone.
JOB_SCOPES = frozenset({"produce", "consume", "admin"})
QUEUE_PATTERN_RE = re.compile(r"[A-Za-z0-9_.:*-]{1,128}")

# jobq_<selector>_<secret>: the selector (48 bits, not secret) finds the row; the secret (256 bits) is
# checked against its SHA-256 in constant time. A fast hash suffices: the secret is random, not a password.
KEY_PREFIX = "jobq_"
_KEY = re.compile(r"jobq_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller."""

    name: str
    scopes: frozenset[str]
    # Anchored regex over queue names for SQL (`queue_name ~ queue_regex`); None: every queue.
    queue_regex: str | None = None
    key_id: int | None = None
    _match: Callable[[str], Any] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(
        cls, name: str, scopes: Iterable[str], patterns: Iterable[str] | None, key_id: int | None = None
    ) -> Principal:
        core = queue_alternation(patterns) if patterns is not None else None
        return cls(
            name,
            frozenset(scopes),
            None if core is None else f"^(?:{core})$",
            key_id,
            None if core is None else re.compile(core).fullmatch,
        )

    def has(self, scope: KeyScope) -> bool:
        return scope in self.scopes or "admin" in self.scopes

    def allows(self, queue: str) -> bool:
        return self._match is None or self._match(queue) is not None


OPEN = Principal.of("anonymous (auth off)", SCOPES, None)
ENV_KEY = Principal.of("JOBQ_API_KEY", SCOPES, None)


def queue_alternation(patterns: Iterable[str]) -> str:
    """Queue-name globs as one regex alternation that means the same to Python and PostgreSQL: queue names
    hold only [A-Za-z0-9_.:-], so escaping `.` and turning `*` into `.*` is the whole translation."""
    parts = []
    for p in patterns:
        if not QUEUE_PATTERN_RE.fullmatch(p):
            raise ValueError(f"queue pattern {p!r}: use [A-Za-z0-9_.:-] and `*`, 1-128 characters")
        parts.append(p.replace(".", r"\.").replace("*", ".*"))
    if not parts:
        raise ValueError("give at least one queue pattern, or none for every queue")
    return "|".join(parts)


def require(request: Request, scope: KeyScope | None = None, queue: str | None = None) -> Principal:
    """The caller, if it holds `scope` (admin holds every scope; no scope: any that reaches jobs) and may use
    `queue`; else 401 or 403."""
    principal: Principal | None = request.scope.get("state", {}).get("principal")
    if principal is None:
        # Only reachable if the Authenticate layer did not run for this request: fail closed.
        raise Unauthorized()
    if scope is not None and not principal.has(scope):
        raise Forbidden(f"This API key lacks the `{scope}` scope.")
    if scope is None and principal.scopes.isdisjoint(JOB_SCOPES):
        raise Forbidden("This API key has only the `metrics` scope: it may read GET /metrics and nothing else.")
    if queue is not None and not principal.allows(queue):
        raise Forbidden(f"This API key may not use queue `{queue}`.")
    return principal


# --- keys ---------------------------------------------------------------------------------------------------


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def new_key() -> tuple[str, str, bytes]:
    """(key, selector, SHA-256 of its secret). The key is shown once; only the selector and hash are kept."""
    selector = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return f"{KEY_PREFIX}{selector}_{secret}", selector, digest(secret)


def parse_key(token: str) -> tuple[str, str] | None:
    """(selector, secret) of a well-formed jobq key, else None."""
    m = _KEY.fullmatch(token)
    return (m.group(1), m.group(2)) if m else None


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of `Authorization: Bearer <token>` (scheme case-insensitive, RFC 6750); else None."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


# --- the ASGI layer -------------------------------------------------------------------------------------------

Authenticator = Callable[[str], Awaitable[Principal | None]]


class Authenticate:
    """Puts the caller's Principal in scope["state"]["principal"]. With auth on, a request to anything but
    an open path without a valid key gets 401 here, before its body is read or any route runs."""

    def __init__(self, app: ASGIApp, *, enabled: bool, keys: Callable[[], Authenticator], open_paths: Iterable[str]):
        self.app = app
        self.enabled = enabled
        self.keys = keys  # the process's KeyRing exists only once the lifespan has started
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        principal: Principal | None = OPEN
        if self.enabled:
            token = bearer_token(scope["headers"])
            try:
                principal = await self.keys()(token) if token is not None else None
            except AppError as exc:  # database unavailable while looking a key up
                await problem_response(exc, scope["path"])(scope, receive, send)
                return
            if principal is None and scope["path"] not in self.open_paths:
                if token is None:
                    err = Unauthorized("Send an API key: `Authorization: Bearer <key>`.")
                else:
                    err = Unauthorized("The API key is not valid: unknown, revoked or malformed.", invalid=True)
                await problem_response(err, scope["path"])(scope, receive, send)
                return
        # A new dict: the server's per-request state copy is never shared, but do not rely on it.
        scope["state"] = {**scope.get("state", {}), "principal": principal}
        await self.app(scope, receive, send)
