"""The published OpenAPI document: FastAPI's, with every error response as application/problem+json."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def customise_openapi(api: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            doc = get_openapi(
                title=api.title,
                version=api.version,
                summary=api.summary,
                description=api.description,
                routes=api.routes,
            )
            for path in doc.get("paths", {}).values():
                for op in path.values():
                    for code, response in op.get("responses", {}).items():
                        if code[0] in "45":
                            response["content"] = {"application/problem+json": {"schema": PROBLEM_REF}}
            schemas = doc.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            api.openapi_schema = doc
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]


def published_document() -> dict[str, Any]:
    """The contract committed as openapi/openapi.json: the default configuration's document."""
    from app.main import create_app
    from app.settings import Settings

    return create_app(Settings.defaults(database_url="postgresql://unused")).api.openapi()
