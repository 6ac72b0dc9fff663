"""The published OpenAPI document: FastAPI's, with every error response as application/problem+json,
examples on every request body, success response and problem (app/http/examples.py), the bearer-key
security scheme on every operation that is not open, and the JsonValue schema of payloads."""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.http.examples import ONLY_ON, PROBLEMS, SCHEMAS
from app.models.jobs import JSON_VALUE_MARKER
from app.settings import Settings

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
JSON_VALUE_REF = "#/components/schemas/JsonValue"
SECURITY_SCHEME = "bearerKey"
# PostgreSQL text, and so jsonb, cannot hold U+0000; every other Unicode scalar value is fine.
_NO_NUL = "^[^\\u0000]*$"
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


def json_value_schema(s: Settings) -> dict[str, Any]:
    """Any JSON value that jsonb stores faithfully, as far as JSON Schema can say it; the rest in words."""
    ref = {"$ref": JSON_VALUE_REF}
    return {
        "description": (
            "Any JSON value, except that strings and object keys cannot contain NUL (\\u0000), which "
            f"PostgreSQL cannot store. Nested at most {s.max_json_depth} levels (JOBQ_MAX_JSON_DEPTH); at most "
            f"{s.max_payload_bytes} bytes of JSON as a payload (JOBQ_MAX_PAYLOAD_BYTES) and {s.max_result_bytes} "
            "as a result (JOBQ_MAX_RESULT_BYTES). Numbers must be finite."
        ),
        "anyOf": [
            {"type": "null"},
            {"type": "boolean"},
            {"type": "number"},
            {"type": "string", "pattern": _NO_NUL},
            {"type": "array", "items": ref},
            {"type": "object", "propertyNames": {"pattern": _NO_NUL}, "additionalProperties": ref},
        ],
    }


def _mark_json_values(node: Any) -> None:
    """Turn the models' JSON_VALUE_MARKER into references to the JsonValue schema."""
    if isinstance(node, dict):
        if node.pop(JSON_VALUE_MARKER, None):
            node["$ref"] = JSON_VALUE_REF
        for value in node.values():
            _mark_json_values(value)
    elif isinstance(node, list):
        for value in node:
            _mark_json_values(value)


def customise_openapi(api: FastAPI, settings: Settings) -> None:
    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            doc = get_openapi(
                title=api.title,
                version=api.version,
                summary=api.summary,
                description=api.description,
                routes=api.routes,
            )
            from app.auth.policy import OPEN_OPERATIONS

            components = doc.setdefault("components", {})
            schemas = components.setdefault("schemas", {})
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
                    # Open operations say so explicitly: no security requirement at all.
                    op["security"] = [] if op.get("operationId") in OPEN_OPERATIONS else [{SECURITY_SCHEME: []}]
            _mark_json_values(doc)
            schemas["JsonValue"] = json_value_schema(settings)
            components["securitySchemes"] = {
                SECURITY_SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": (
                        "An API key (`jobq keys create`, or JOBQ_API_KEY): `Authorization: Bearer jobq_...`. "
                        "Scopes: produce (enqueue), consume (claim, heartbeat, complete, fail), admin (all, "
                        "plus stats, listings, admin actions and /metrics), metrics (GET /metrics only), "
                        "optionally limited to queue-name patterns (not a key with metrics). "
                        "Required unless the server runs open on a loopback address."
                    ),
                }
            }
            api.openapi_schema = doc
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]


def published_document() -> dict[str, Any]:
    """The contract committed as openapi/openapi.json: the default configuration's document."""
    from app.main import create_app
    from app.settings import Settings

    return create_app(Settings.defaults(database_url="postgresql://unused")).api.openapi()
