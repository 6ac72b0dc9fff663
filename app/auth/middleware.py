"""The Authenticate ASGI layer: finds the caller before any route runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.keys import bearer_token
from app.auth.policy import OPEN, Principal
from app.errors import AppError, Unauthorized
from app.http.responses import problem_response

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
