"""ASGI layers in front of FastAPI: a request guard for every route, and a lean dispatcher for the hot
worker and producer routes.

Why a lean dispatcher: measured on the 2-core reference machine, a FastAPI route costs about 0.17 ms of
CPU per request before it runs any of our code, a plain ASGI handler about 0.04 ms (5.8k vs 25k
requests/s; see BENCHMARKS.md), and that overhead, not PostgreSQL, sets the throughput ceiling of
single-job requests. The dispatcher does not re-implement the endpoints: it matches the FastAPI route,
validates path parameters and body against the same pydantic types FastAPI would, and awaits the same
endpoint function. Everything else (docs, cold routes, errors) stays FastAPI. A route is served here when
its endpoint is marked `@hot` where it is declared; the dispatcher checks, when it is built, that it can
serve each such endpoint exactly as FastAPI would (path parameters, one body, the request; nothing else)
and refuses to start otherwise. Set JOBQ_FAST_PATH=false to serve every route through FastAPI; tests
check the two give equal answers.
"""

from __future__ import annotations

import inspect
import logging
import re
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import (
    AppError,
    InternalError,
    PayloadTooLarge,
    UnsupportedMediaType,
    ValidationFailed,
    validation_problem,
)
from app.problems import problem_response

log = logging.getLogger("jobq.http")

_JSON_TYPE = re.compile(rb"^application/(?:[\w.+-]+\+)?json\s*(?:;.*)?$", re.IGNORECASE)


async def send_problem(exc: AppError, scope: Scope, receive: Receive, send: Send) -> None:
    await problem_response(exc, scope.get("path"))(scope, receive, send)


class RequestGuard:
    """For every request: refuse a body over JOBQ_MAX_REQUEST_BYTES while it is read (a chunked body
    without Content-Length is cut off, never buffered whole), and hold every write (POST, PUT, PATCH) to
    the Content-Type rules, with 415 otherwise: a request with a body must say `application/json`; one
    without may say nothing, or JSON. A web page can send a cross-site request without asking first only
    with a form or text type (a CORS "simple request"): none of those is ever accepted."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        length: int | None = None
        content_type: bytes | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = int(value) if value.isdigit() else -1
            elif name == b"content-type":
                content_type = value
            elif name == b"transfer-encoding":
                chunked = chunked or b"chunked" in value.lower()
        if length is not None and (length < 0 or length > self.max_bytes):
            await send_problem(_too_large(self.max_bytes), scope, receive, send)
            return
        has_body = chunked or (length is not None and length > 0)
        if content_type is None:
            if has_body:
                await send_problem(UnsupportedMediaType(_NO_TYPE), scope, receive, send)
                return
        elif not _JSON_TYPE.match(content_type):
            detail = _NOT_JSON if has_body else _BODILESS
            await send_problem(UnsupportedMediaType(detail), scope, receive, send)
            return
        seen = 0
        limit = self.max_bytes

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _too_large(limit)
            return message

        await self.app(scope, limited, send)


_NO_TYPE = "This request has a body but no Content-Type: send it as JSON with `Content-Type: application/json`."
_NOT_JSON = "Send the body as JSON with `Content-Type: application/json`."
_BODILESS = "This request has no body: send no Content-Type, or `application/json`."


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is larger than {limit} bytes.")


@dataclass(frozen=True)
class _Hot:
    route: APIRoute
    endpoint: Callable[..., Awaitable[Response]]
    path_params: dict[str, TypeAdapter[Any]]
    body_param: str | None
    body_model: type[BaseModel] | None
    request_param: str | None
    fast_json: Callable[[bytes], Any] | None  # the body model's compiled decoder (app/models/fast.py), if any


E = TypeVar("E", bound=Callable[..., Awaitable[Response]])
_HOT = "__jobq_hot__"


def hot(endpoint: E) -> E:
    """Mark an endpoint to be served by the lean dispatcher (JOBQ_FAST_PATH)."""
    setattr(endpoint, _HOT, True)
    return endpoint


def is_hot(route: APIRoute) -> bool:
    return bool(getattr(route.endpoint, _HOT, False))


class NotServable(RuntimeError):
    """A @hot endpoint takes something the lean dispatcher does not provide."""


def _hot_route(route: APIRoute) -> _Hot:
    """How to call a hot endpoint, checked against what FastAPI itself would pass it (its dependant): path
    parameters, at most one body model, and the request; no query, header or cookie parameters, no
    dependencies."""
    d = route.dependant
    where = f"fast path: {route.operation_id} ({route.path})"
    if d.query_params or d.header_params or d.cookie_params or d.dependencies:
        raise NotServable(f"{where} takes query, header or cookie parameters or dependencies")
    if len(d.body_params) > 1:
        raise NotServable(f"{where} takes more than one body parameter")
    hints = typing.get_type_hints(route.endpoint, include_extras=True)
    path_params = {p.name: TypeAdapter(hints[p.name]) for p in d.path_params}
    body_param = body_model = None
    if d.body_params:
        body_param = d.body_params[0].name
        model = hints[body_param]
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise NotServable(f"{where}: its body is not a pydantic model")
        body_model = model
    served = {*path_params, body_param, d.request_param_name} - {None}
    if missing := set(inspect.signature(route.endpoint).parameters) - served:
        raise NotServable(f"{where} takes {sorted(missing)}, which the fast path does not provide")
    fast_json = getattr(body_model, "fast_json", None)
    return _Hot(route, route.endpoint, path_params, body_param, body_model, d.request_param_name, fast_json)


class FastPath:
    """Serves the routes whose endpoints are marked @hot; passes everything else to `app`."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.by_method: dict[str, list[_Hot]] = {}
        for route in app.routes:
            if isinstance(route, APIRoute) and is_hot(route):
                for method in route.methods or ():
                    self.by_method.setdefault(method, []).append(_hot_route(route))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for hot in self.by_method.get(scope["method"], ()):
                match = hot.route.path_regex.match(scope["path"])
                if match:
                    await self._serve(hot, match.groupdict(), scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _serve(self, hot: _Hot, raw_params: dict[str, str], scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self.app
        scope["route"] = hot.route  # for the request metrics and logs, as Starlette's router does
        try:
            kwargs: dict[str, Any] = {}
            errors: list[dict[str, Any]] = []
            for name, adapter in hot.path_params.items():
                try:
                    kwargs[name] = adapter.validate_python(raw_params[name])
                except ValidationError as exc:
                    errors.extend({**e, "loc": ("path", name, *e["loc"])} for e in exc.errors())
            if hot.body_model is not None and hot.body_param is not None:
                body = await _read_body(receive)
                if not body:
                    errors.append({"loc": ("body",), "msg": "Field required", "type": "missing"})
                else:  # even after a bad path parameter: FastAPI reports the body's errors (or 400) with it
                    try:  # the body's compiled decoder first, if it has one; the model for what it does not take
                        decoded = hot.fast_json(body) if hot.fast_json is not None else None
                        kwargs[hot.body_param] = (
                            hot.body_model.model_validate_json(body) if decoded is None else decoded
                        )
                    except ValidationError as exc:
                        errors.extend({**e, "loc": ("body", *e["loc"])} for e in exc.errors())
            if errors:
                raise validation_problem(errors)
            if hot.request_param is not None:
                kwargs[hot.request_param] = Request(scope, receive)
            response = await hot.endpoint(**kwargs)
        except AppError as exc:
            await send_problem(exc, scope, receive, send)
            return
        except Exception:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            await send_problem(InternalError(), scope, receive, send)
            return
        await response(scope, receive, send)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ValidationFailed("The client went away while sending the body.")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
