"""The Authenticate ASGI layer: finds the caller before any route runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.exposure import Exposure
from app.auth.keys import bearer_token
from app.auth.policy import OPEN, Principal
from app.errors import AppError, Unauthorized
from app.problems import problem_response

Authenticator = Callable[[str], Awaitable[Principal | None]]
# Asks again whether the request's key is still valid (a long-poll before it hands out jobs).
Recheck = Callable[[], Awaitable[bool]]


class Authenticate:
    """Puts the caller's Principal in scope["state"]["principal"]. Whether this request needs a key is the
    Exposure's call (app/auth/exposure.py), made from the socket it arrived on. With keys required, a
    request to anything but an open path without a valid key gets 401 here, before its body is read or any
    route runs. Without, the request is refused if it looks like it came from further than this machine.

    scope["state"]["recheck"] is a Recheck for the request's key (None when no key was used)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        exposure: Exposure,
        keys: Callable[[], Authenticator],
        open_paths: Iterable[str],
        authenticates_itself: Callable[[Scope], bool] = lambda scope: False,
    ):
        self.app = app
        # Requests that carry their own credentials (SQS's signatures, app/sqs/auth.py): without a valid jobq
        # key they pass with no principal, and the endpoint authenticates them or refuses in its own terms.
        self.authenticates_itself = authenticates_itself
        self.exposure = exposure
        self.keys = keys  # the process's KeyRing exists only once the lifespan has started
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        principal: Principal | None = OPEN
        recheck: Recheck | None = None
        if self.exposure.keys_required(scope):
            token = bearer_token(scope["headers"])
            try:
                principal = await self.keys()(token) if token is not None else None
            except AppError as exc:  # database unavailable while looking a key up, or lookups throttled
                await problem_response(exc, scope["path"])(scope, receive, send)
                return
            if principal is None and scope["path"] not in self.open_paths and not self.authenticates_itself(scope):
                if token is None:
                    err = Unauthorized("Send an API key: `Authorization: Bearer <key>`.")
                else:
                    err = Unauthorized("The API key is not valid: unknown, revoked or malformed.", invalid=True)
                await problem_response(err, scope["path"])(scope, receive, send)
                return
            if principal is not None and token is not None:
                recheck = _recheck(self.keys(), token, principal)
        elif refused := self.exposure.refusal(scope):
            await problem_response(refused, scope["path"])(scope, receive, send)
            return
        # A new dict: the server's per-request state copy is never shared, but do not rely on it.
        scope["state"] = {**scope.get("state", {}), "principal": principal, "recheck": recheck}
        await self.app(scope, receive, send)


def _recheck(keys: Authenticator, token: str, principal: Principal) -> Recheck:
    async def still_valid() -> bool:
        # From the cache while nothing changed; after a revocation's NOTIFY emptied it, from the database.
        return await keys(token) == principal

    return still_valid
