"""The published OpenAPI document: FastAPI's, with every error response as application/problem+json,
and examples on every request body, success response and problem (app/examples.py)."""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.examples import ONLY_ON, PROBLEMS, SCHEMAS

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
_SCHEMA_REF = "#/components/schemas/"
# Values for path parameters in the `instance` of problem examples.
_PATH_EXAMPLES = {"job_id": "42", "queue": "emails"}


def _example_path(template: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: _PATH_EXAMPLES.get(m.group(1), "x"), template)


def _media_example(media: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Give a media type the first example of the component schema it refers to."""
    ref = media.get("schema", {}).get("$ref", "")
    examples = schemas.get(ref.removeprefix(_SCHEMA_REF), {}).get("examples") if ref.startswith(_SCHEMA_REF) else None
    if examples:
        media["example"] = examples[0]


def _optional_body(body: dict[str, Any], media: dict[str, Any]) -> None:
    """FastAPI writes an optional body as anyOf [model, null]; OpenAPI says it with required: false."""
    variants = media.get("schema", {}).get("anyOf", [])
    refs = [v for v in variants if "$ref" in v]
    if len(refs) == 1 and len(variants) == 2 and {"type": "null"} in variants:
        media["schema"] = refs[0]
        body["required"] = False


def _problem_content(method: str, operation_id: str, path: str, status: int) -> dict[str, Any]:
    examples = {
        name: {"summary": err.title, "value": err.body(_example_path(path))}
        for name, err in PROBLEMS.get(status, {}).items()
        if name not in ONLY_ON or ONLY_ON[name] & {method, operation_id}
    }
    media: dict[str, Any] = {"schema": PROBLEM_REF}
    if examples:
        media["examples"] = examples
    return {"application/problem+json": media}


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
            schemas = doc.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            for name, examples in SCHEMAS.items():
                if name in schemas:
                    schemas[name]["examples"] = examples
            for path, ops in doc.get("paths", {}).items():
                for method, op in ops.items():
                    for media in op.get("requestBody", {}).get("content", {}).values():
                        _optional_body(op["requestBody"], media)
                        _media_example(media, schemas)
                    for code, response in op.get("responses", {}).items():
                        if code[0] in "45":
                            response["content"] = _problem_content(method, op["operationId"], path, int(code))
                        else:
                            for media in response.get("content", {}).values():
                                _media_example(media, schemas)
            api.openapi_schema = doc
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]


def published_document() -> dict[str, Any]:
    """The contract committed as openapi/openapi.json: the default configuration's document."""
    from app.main import create_app
    from app.settings import Settings

    return create_app(Settings.defaults(database_url="postgresql://unused")).api.openapi()
