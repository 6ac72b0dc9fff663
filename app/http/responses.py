"""JSON responses, shared by the FastAPI routes and the lean dispatcher (problem+json: app/problems.py)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

_JSON = b"application/json"


class JsonResponse(Response):
    """A JSON answer built with no more work than it needs: every hot request ends in one, and starlette's
    general constructor (header parsing, charset rules) and call (websocket denial) cost more than the
    two messages it sends."""

    media_type = "application/json"

    def __init__(self, body: bytes, status_code: int = 200, header: tuple[bytes, bytes] | None = None) -> None:
        self.status_code = status_code
        self.background = None
        self.body = body
        self.raw_headers = [(b"content-length", b"%d" % len(body)), (b"content-type", _JSON)]
        if header is not None:
            self.raw_headers.append(header)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body})


def json_response(doc: Any, status: int = 200, header: tuple[bytes, bytes] | None = None) -> Response:
    """`header`: one more response header, raw (a minimal answer's Preference-Applied, app/http/prefer.py)."""
    return JsonResponse(orjson.dumps(doc), status, header)
