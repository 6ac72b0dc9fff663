"""The SQS endpoint: an ASGI layer that answers SQS requests (POST to `/` or to a queue URL) and passes
everything else on.

Why a layer of its own, in front of the request guard rather than a FastAPI route: SQS's bodies are
`application/x-amz-json-1.0` and form-encoded, which the guard refuses for jobq's own routes (its
Content-Type rules are what stops a web page's cross-site form), and SQS answers its errors in its own
shapes, never problem+json. Here the cross-site rule is kept by other means: on an open service a request
a browser marks as cross-site (a foreign `Origin`, refused by app/auth/exposure.py before this layer, or
`Sec-Fetch-Site` other than same-origin/none) is refused; the SDKs send neither. The body is read up to
JOBQ_MAX_REQUEST_BYTES."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.policy import OPEN, Principal
from app.core.sqs import NoSuchQueue
from app.errors import AppError, DatabaseUnavailable, ShuttingDown, TooManyWaiters, Unauthorized
from app.services import Services, services_of
from app.sqs import wire
from app.sqs.actions import ACTIONS, Call
from app.sqs.auth import RequestParts, SignerRecheck, SqsAuthenticator, refuse_unsigned
from app.sqs.errors import (
    AccessDenied,
    InternalFailure,
    InvalidAction,
    InvalidClientTokenId,
    InvalidParameterValue,
    QueueDoesNotExist,
    RequestThrottled,
    ServiceUnavailable,
    SqsError,
)

log = logging.getLogger("jobq.sqs")

# A queue URL's path as jobq writes it (`/<12-digit account>/<queue>`): SDKs may POST there.
_QUEUE_PATH = re.compile(r"/[0-9]{12}/([A-Za-z0-9_-]{1,80}(?:\.fifo)?)/?")
_SAME_SITE = frozenset({b"same-origin", b"none"})


def is_sqs_request(scope: Scope) -> bool:
    """A request this endpoint answers: a POST to `/` or to a queue URL."""
    return scope["method"] == "POST" and (scope["path"] == "/" or _QUEUE_PATH.fullmatch(scope["path"]) is not None)


@dataclass(frozen=True, slots=True)
class _Route:
    """What the access log and the request metrics name an SQS request by (its action)."""

    path_format: str


class SqsEndpoint:
    def __init__(
        self,
        app: ASGIApp,
        api: Starlette,
        max_bytes: int,
        authenticate: SqsAuthenticator | None = None,
        recheck: SignerRecheck | None = None,
    ) -> None:
        self.app = app
        self.api = api  # the FastAPI app, whose lifespan builds the services
        self.max_bytes = max_bytes
        self.authenticate = authenticate or refuse_unsigned
        self.recheck = recheck
        self._routes: dict[str, _Route] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_sqs_request(scope):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        target = headers.get(b"x-amz-target")
        rid = wire.request_id()
        action = "unknown"
        try:
            body = await self._body(receive)
            if target is not None:
                action, params = wire.read_json(target.decode("latin-1"), body)
            else:
                action, params = wire.read_query(body)
            scope["route"] = self._route(action)
            who = await self._caller(scope, headers, body)
            handler = ACTIONS.get(action)
            if handler is None:
                raise InvalidAction(f"The action {action} is not valid for this endpoint.")
            result = await handler(self._call(scope, receive, who, headers), params)
        except SqsError as err:
            await self._error(err, target is not None, rid, send)
            return
        except NoSuchQueue:
            await self._error(QueueDoesNotExist("The specified queue does not exist."), target is not None, rid, send)
            return
        except AppError as exc:
            await self._error(_translated(exc), target is not None, rid, send)
            return
        except ValidationError as exc:  # jobq's own request models, stricter than SQS under some settings
            refused = InvalidParameterValue(f"Refused by this service's limits: {exc.errors()[0]['msg']}.")
            await self._error(refused, target is not None, rid, send)
            return
        except Exception:
            log.exception("unhandled error in SQS action %s", action)
            await self._error(InternalFailure("The request processing has failed."), target is not None, rid, send)
            return
        if target is not None:
            await _respond(send, 200, wire.JSON_TYPE, wire.json_answer(result), rid)
        else:
            await _respond(send, 200, wire.XML_TYPE, wire.xml_answer(action, result, rid), rid)

    def _route(self, action: str) -> _Route:
        if action not in ACTIONS:
            action = "unknown"
        route = self._routes.get(action)
        if route is None:
            route = self._routes[action] = _Route(f"/ (SQS {action})")
        return route

    async def _body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise InvalidParameterValue("The client went away while sending the request.")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise InvalidParameterValue(f"The request is larger than {self.max_bytes} bytes.")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _caller(self, scope: Scope, headers: dict[bytes, bytes], body: bytes) -> Principal:
        found: Principal | None = scope.get("state", {}).get("principal")
        if found is OPEN:
            site = headers.get(b"sec-fetch-site")
            if site is not None and site.strip().lower() not in _SAME_SITE:
                raise AccessDenied(
                    "This jobq runs without API keys and refuses requests that a web page of another site sends."
                )
            return found
        if found is not None:
            return found  # a jobq key (Bearer), found by the Authenticate layer
        parts = RequestParts(scope["method"], scope["path"], scope.get("query_string", b""), scope["headers"], body)
        who = await self.authenticate(parts)
        # Where the rest of jobq reads the caller (policy.principal(): the per-client share of waiting places),
        # and what a long-poll asks again, before it hands out messages, whether its key is still live.
        recheck = self.recheck(parts, who) if self.recheck is not None else None
        scope["state"] = {**scope.get("state", {}), "principal": who, "recheck": recheck}
        return who

    def _call(self, scope: Scope, receive: Receive, who: Principal, headers: dict[bytes, bytes]) -> Call:
        services: Services = services_of(self.api)
        host = headers.get(b"host", b"").decode("latin-1") or _server(scope)
        match = _QUEUE_PATH.fullmatch(scope["path"]) if scope["path"] != "/" else None
        return Call(
            services.sqs,
            services.settings,
            who,
            f"{scope.get('scheme', 'http')}://{host}",
            match.group(1) if match else None,
            scope,
            receive,
            services.job_context,
        )

    async def _error(self, err: SqsError, json: bool, rid: str, send: Send) -> None:
        if json:
            body, extra = wire.json_error(err)
            await _respond(send, err.http_status, wire.JSON_TYPE, body, rid, extra)
        else:
            await _respond(send, err.http_status, wire.XML_TYPE, wire.xml_error(err, rid), rid)


def _translated(exc: AppError) -> SqsError:
    """A jobq error met on the way (limits, the database, a stop) as the SQS error an SDK retries or shows."""
    if isinstance(exc, TooManyWaiters) or exc.status == 429:  # waiting places, a full queue, a key's rate
        return RequestThrottled(exc.detail)
    if isinstance(exc, DatabaseUnavailable | ShuttingDown):
        return ServiceUnavailable(exc.detail)
    if isinstance(exc, Unauthorized):  # the key was revoked while its long-poll waited
        return InvalidClientTokenId(exc.detail)
    if exc.status == 403:
        return AccessDenied(exc.detail)
    if 400 <= exc.status < 500:
        return InvalidParameterValue(exc.detail)
    return InternalFailure(exc.detail)


def _server(scope: Scope) -> str:
    server = scope.get("server")
    return f"{server[0]}:{server[1]}" if server else "localhost"


async def _respond(
    send: Send, status: int, content_type: str, body: bytes, rid: str, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"x-amzn-requestid", rid.encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
