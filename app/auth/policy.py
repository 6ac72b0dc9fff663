"""Who may do what on which queue: scopes, queue patterns, the caller (Principal), and the declaration
each route makes of the scope it needs.

Every route that is not open declares its scope where it is defined, with `@requires(...)`:

    @requires("produce")   # enqueue: the key must hold `produce` and may use the path's {queue}
    @requires("consume")   # claim on {queue}; heartbeat, complete, fail, release addressed by job id
    @requires("admin")     # stats, listings, admin actions
    @requires("metrics")   # GET /metrics
    @requires(None)        # any key with a job scope (e.g. GET /jobs/{id})

The check runs before the endpoint's body on both HTTP paths (FastAPI and the lean dispatcher call the
same endpoint function) and raises 403 as problem+json. The endpoint reads the caller with
`principal(request)`.

Scopes: `produce` enqueues; `consume` claims, heartbeats, completes and fails; `admin` may do all of
that and also reach stats, listings, admin actions and /metrics. `metrics` reaches GET /metrics and the
same figures per queue, GET /queues/{queue}/scale, and nothing else (a scraper's or an autoscaler's
credential: least privilege), so `@requires(None)` still refuses a key that holds only `metrics`. A key
may be limited to queue-name patterns (`*` matches any run of characters):
a route with a {queue} path parameter refuses other queues with 403. A key holding `metrics` never is:
/metrics covers every queue (the CLI and the schema refuse such a key).

Routes addressed by job id do not know the queue before the database does, and must not read the job
first: they pass `who.queue_regex` (None: every queue) into the guarded SQL (`queue_allowed()`,
app/db/scope.py), and report a job outside it exactly like a missing one (404 job-not-found), so that a
key learns nothing about queues it cannot see. Listings across queues filter the same way in SQL, or row
by row with `who.allows(queue)`.

Authentication itself happens before any route, in the Authenticate ASGI layer
(app/auth/middleware.py, the outermost one, so a request without a valid key is refused before its body
is read); it leaves the Principal in scope["state"]["principal"]. With auth off (the loopback
quickstart, or JOBQ_AUTH=off) the principal is OPEN, which may do everything.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from starlette.requests import Request

from app.errors import Forbidden, Unauthorized

KeyScope = Literal["produce", "consume", "admin", "metrics"]
SCOPES: tuple[KeyScope, ...] = ("produce", "consume", "admin", "metrics")
# The scopes that reach jobs; a key holding none of them (only `metrics`) reaches GET /metrics and
# GET /queues/{queue}/scale alone.
JOB_SCOPES = frozenset({"produce", "consume", "admin"})
QUEUE_PATTERN_RE = re.compile(r"[A-Za-z0-9_.:*-]{1,128}")

# Operations anyone may call, with or without a key: health checks and the dashboard's page and files,
# which hold no data (its script calls the API with the operator's key). The API's own description
# (/openapi.json, /docs) is open too (app/main.py).
OPEN_OPERATIONS = frozenset({"healthz", "readyz", "dashboard", "dashboardScript", "dashboardStyle"})


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


def principal(request: Request) -> Principal:
    """The caller of this request, as the Authenticate layer found it."""
    found: Principal | None = request.scope.get("state", {}).get("principal")
    if found is None:
        # Only reachable if the Authenticate layer did not run for this request: fail closed.
        raise Unauthorized()
    return found


def client_identity(request: Request) -> str:
    """Who a request's share of shared resources (waiting places) is counted against: its API key, or with
    auth off, the address it came from (an open service refuses proxied requests, so that is the client)."""
    who = principal(request)
    if who is OPEN:
        client = request.scope.get("client")
        return f"address {client[0] if client else 'unknown'}"
    return f"key {who.key_id if who.key_id is not None else who.name}"


def authorize(who: Principal, scope: KeyScope | None, queue: str | None = None) -> None:
    """Raise 403 unless `who` holds `scope` (admin holds every scope; None: any scope that reaches jobs)
    and may use `queue`."""
    if scope is not None and not who.has(scope):
        raise Forbidden(f"This API key lacks the `{scope}` scope.")
    if scope is None and who.scopes.isdisjoint(JOB_SCOPES):
        raise Forbidden("This API key has only the `metrics` scope: it may read GET /metrics and nothing else.")
    if queue is not None and not who.allows(queue):
        raise Forbidden(f"This API key may not use queue `{queue}`.")


E = TypeVar("E", bound=Callable[..., Awaitable[Any]])
SCOPE_ATTRIBUTE = "__jobq_scope__"


def requires(scope: KeyScope | None) -> Callable[[E], E]:
    """Declare the scope an endpoint needs (None: any scope that reaches jobs). The endpoint takes the
    request as `request`; a `queue` parameter, when it has one, must be a queue the key may use."""

    def declare(endpoint: E) -> E:
        parameters = inspect.signature(endpoint).parameters
        if "request" not in parameters:
            raise TypeError(f"{endpoint.__name__}: an endpoint that @requires a scope takes `request`")
        with_queue = "queue" in parameters

        @functools.wraps(endpoint)
        async def checked(*args: Any, **kwargs: Any) -> Any:
            authorize(principal(kwargs["request"]), scope, kwargs["queue"] if with_queue else None)
            return await endpoint(*args, **kwargs)

        setattr(checked, SCOPE_ATTRIBUTE, scope)
        return checked  # type: ignore[return-value]

    return declare


def declared_scope(endpoint: Callable[..., Any]) -> tuple[bool, KeyScope | None]:
    """(declared, scope) of an endpoint: whether it went through @requires, and with which scope."""
    if not hasattr(endpoint, SCOPE_ATTRIBUTE):
        return False, None
    return True, getattr(endpoint, SCOPE_ATTRIBUTE)
