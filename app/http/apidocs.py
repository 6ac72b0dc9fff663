"""The browsable API description at /docs: Swagger UI, served from the swagger-ui-bundle package installed
with jobq, never from a CDN (a page that loads a third party's script could be made to send the
operator's key anywhere). ReDoc, which FastAPI would load from a CDN too, is not served."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

DOCS = "/docs"
ASSETS = {
    f"{DOCS}/swagger-ui-bundle.js": "swagger-ui-bundle.js",
    f"{DOCS}/swagger-ui.css": "swagger-ui.css",
    f"{DOCS}/favicon.png": "favicon-32x32.png",
}
# The page and its files say what they are, and may be framed or sniffed by nobody.
HEADERS = {"x-content-type-options": "nosniff", "x-frame-options": "DENY", "referrer-policy": "no-referrer"}


def add_docs_routes(api: FastAPI) -> set[str]:
    """Serve /docs and its files; returns their paths (open, like /openapi.json). Plain Starlette routes, as
    FastAPI's own /docs is: no operation, no scope."""
    folder = Path(swagger_ui_path)

    async def swagger_ui(request: Request) -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=api.openapi_url or "/openapi.json",
            title=f"{api.title} API",
            swagger_js_url=f"{DOCS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS}/favicon.png",
        )
        page.headers.update(HEADERS)
        return page

    api.add_route(DOCS, swagger_ui, methods=["GET"], include_in_schema=False)
    for path, name in ASSETS.items():
        api.add_route(path, _file(folder / name), methods=["GET"], include_in_schema=False)
    return {DOCS, *ASSETS}


def _file(path: Path) -> Callable[[Request], Awaitable[FileResponse]]:
    """An endpoint that reads nothing from the request and serves this one file."""

    async def serve(request: Request) -> FileResponse:
        return FileResponse(path, headers={**HEADERS, "cache-control": "public, max-age=86400"})

    return serve
