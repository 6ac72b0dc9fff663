"""The browsable API description at /docs: Swagger UI, served from the swagger-ui-bundle package installed
with jobq, never from a CDN (a page that loads a third party's script could be made to send the
operator's key anywhere). ReDoc, which FastAPI would load from a CDN too, is not served.

The page runs no inline script (Swagger UI is started by a file of its own, /docs/init.js), so that its
Content-Security-Policy can allow scripts from this origin only: an operator pastes a key into this page,
and a script injected into it (through a description, an example) could send the key anywhere."""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

DOCS = "/docs"
ASSETS = {
    f"{DOCS}/swagger-ui-bundle.js": "swagger-ui-bundle.js",
    f"{DOCS}/swagger-ui.css": "swagger-ui.css",
    f"{DOCS}/favicon.png": "favicon-32x32.png",
}
# The page and its files say what they are, and may be framed or sniffed by nobody.
HEADERS = {"x-content-type-options": "nosniff", "x-frame-options": "DENY", "referrer-policy": "no-referrer"}
# Scripts, styles and fonts from this origin only; images too, and the data: URIs of Swagger UI's own icons;
# requests ("Try it out", the document) to this origin only. No inline script, no eval, never in a frame.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; object-src 'none'"
)
PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<link type="text/css" rel="stylesheet" href="/docs/swagger-ui.css">
<link rel="icon" href="/docs/favicon.png">
<title>{title}</title>
</head>
<body>
<div id="swagger-ui" data-url="{openapi_url}"></div>
<script src="/docs/swagger-ui-bundle.js"></script>
<script src="/docs/init.js"></script>
</body>
</html>
"""
# What FastAPI's page runs inline, as a file: the document's URL is read from the page.
INIT = b""""use strict";
window.ui = SwaggerUIBundle({
  url: document.getElementById("swagger-ui").dataset.url,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
"""


def add_docs_routes(api: FastAPI) -> set[str]:
    """Serve /docs and its files; returns their paths (open, like /openapi.json). Plain Starlette routes, as
    FastAPI's own /docs is: no operation, no scope."""
    folder = Path(swagger_ui_path)

    page = PAGE.format(
        title=html.escape(f"{api.title} API"), openapi_url=html.escape(api.openapi_url or "/openapi.json")
    )
    headers = {**HEADERS, "content-security-policy": CONTENT_SECURITY_POLICY}

    async def swagger_ui(request: Request) -> HTMLResponse:
        return HTMLResponse(page, headers=headers)

    async def init(request: Request) -> Response:
        return Response(INIT, media_type="text/javascript; charset=utf-8", headers=HEADERS)

    api.add_route(DOCS, swagger_ui, methods=["GET"], include_in_schema=False)
    api.add_route(f"{DOCS}/init.js", init, methods=["GET"], include_in_schema=False)
    for path, name in ASSETS.items():
        api.add_route(path, _file(folder / name), methods=["GET"], include_in_schema=False)
    return {DOCS, f"{DOCS}/init.js", *ASSETS}


def _file(path: Path) -> Callable[[Request], Awaitable[FileResponse]]:
    """An endpoint that reads nothing from the request and serves this one file."""

    async def serve(request: Request) -> FileResponse:
        return FileResponse(path, headers={**HEADERS, "cache-control": "public, max-age=86400"})

    return serve
