"""The operator dashboard: GET /ui and its two static files, shipped in app/http/ui/ as package data.

The page holds no data, so these routes are open (OPEN_OPERATIONS in app/auth/policy.py): everything it shows
comes from the JSON API, which its script calls with the operator's key. Each file is served from a
fixed table read once at start, never by joining a request path onto a directory, so no path can reach
another file. The routes stay out of the OpenAPI document: they are not part of the JSON contract."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import Response

# The script and the styles come from this origin only; no inline script, no eval, no plugins, never in
# a frame. Trusted Types make any assignment of a string to innerHTML (and the like) throw in browsers
# that support them: the script builds the page from text nodes only, and this keeps it so.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; "
    "require-trusted-types-for 'script'; trusted-types 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    # Small files: the browser keeps them but asks every time, and gets a 304 while they are unchanged,
    # so an upgraded server never runs with a stale script.
    "Cache-Control": "no-cache",
}

# path -> (file in app/http/ui/, media type, operation id listed in OPEN_OPERATIONS)
FILES = {
    "/ui": ("index.html", "text/html; charset=utf-8", "dashboard"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8", "dashboardScript"),
    "/ui/app.css": ("app.css", "text/css; charset=utf-8", "dashboardStyle"),
}


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    media_type: str
    etag: str

    def response(self, request: Request) -> Response:
        headers = {**SECURITY_HEADERS, "ETag": self.etag}
        if self.etag in (t.strip().removeprefix("W/") for t in request.headers.get("if-none-match", "").split(",")):
            return Response(status_code=304, headers=headers)
        return Response(self.body, media_type=self.media_type, headers=headers)


def load(name: str, media_type: str) -> StaticFile:
    body = (resources.files("app.http") / "ui" / name).read_bytes()
    return StaticFile(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')


def _endpoint(served: StaticFile) -> Callable[[Request], Awaitable[Response]]:
    async def serve(request: Request) -> Response:
        return served.response(request)

    return serve


def add_dashboard_routes(api: FastAPI) -> None:
    for path, (name, media_type, operation_id) in FILES.items():
        api.add_api_route(
            path,
            _endpoint(load(name, media_type)),
            methods=["GET"],
            operation_id=operation_id,
            include_in_schema=False,
        )
