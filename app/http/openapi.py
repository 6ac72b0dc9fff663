"""The published OpenAPI document: FastAPI's, with every error response as application/problem+json,
examples on every request body, success response (app/http/examples.py) and problem (app/http/problem_examples.py),
the bearer-key security scheme on every operation that is not open, and the JsonValue schema of payloads.

Client generators read it too (openapi-python-client, openapi-typescript: tests/test_generated_clients.py),
so it says things the way they understand: payloads as an unconstrained schema with the rules in words,
no null where null means nothing, no `default` in request bodies (openapi-typescript would make such a
field required), integer bounds as exact integers."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from app.http.examples import SCHEMAS
from app.http.jobs import _RETRY_AFTER, RATE_LIMIT_HEADERS, TOO_MANY_REQUESTS
from app.http.problem_examples import ONLY_ON, PROBLEMS
from app.models.answers import EnqueuedJob, JobState, MinimalEnqueuedJobs
from app.models.fields import INT64_MAX, JSON_VALUE_MARKER
from app.settings import Settings

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
JSON_VALUE_REF = "#/components/schemas/JsonValue"
SECURITY_SCHEME = "bearerKey"
# Relative: the API is at the root of wherever this document is served.
SERVERS = [
    {
        "url": "/",
        "description": "The jobq serving this document (e.g. http://127.0.0.1:8000 for `make run`).",
    }
]
_SCHEMA_REF = "#/components/schemas/"
# The minimal answers (Prefer: return=minimal): named by `x-jobq-minimal` on the answers they replace, not
# by any `content`, so FastAPI does not collect them.
_MINIMAL = (EnqueuedJob, MinimalEnqueuedJobs, JobState)


def _minimal_schemas() -> dict[str, Any]:
    _, top = models_json_schema([(m, "serialization") for m in _MINIMAL], ref_template=_SCHEMA_REF + "{model}")
    return dict(top["$defs"])


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


# Where the rule "no NUL in any string or key, however deep" is written as JSON Schema: a specification
# extension of `components`, which client generators skip (a recursive component schema defeats
# openapi-python-client, and openapi-typescript would type JsonValue by it), and which validators and
# fuzzers (schemathesis) follow through JsonValue's `not`.
JSON_RULES = "x-jobq-json-rules"
HOLDING_NUL_REF = f"#/components/{JSON_RULES}/holdingNul"


def holding_nul() -> dict[str, Any]:
    """A JSON value with NUL in some string or object key, at any depth."""
    return {
        "description": "A JSON value holding NUL (\\u0000) in a string or an object key, at any depth.",
        "anyOf": [
            {"type": "string", "pattern": "\\u0000"},
            {"type": "array", "contains": {"$ref": HOLDING_NUL_REF}},
            {
                "type": "object",
                "anyOf": [
                    {"not": {"propertyNames": {"not": {"pattern": "\\u0000"}}}},  # some key holds NUL
                    {"not": {"additionalProperties": {"not": {"$ref": HOLDING_NUL_REF}}}},  # or some value
                ],
            },
        ],
    }


def json_value_schema(s: Settings) -> dict[str, Any]:
    """Any JSON value that jsonb stores faithfully. No NUL in strings and keys: as JSON Schema, a `not` of
    holding_nul() (which generators ignore); depth and size, which JSON Schema cannot say, in words. The
    server checks every rule (app/models/json_values.py check_json_value)."""
    return {
        "description": (
            "Any JSON value (null, boolean, number, string, array or object), except that strings and object "
            "keys cannot contain NUL (\\u0000), which PostgreSQL cannot store, and numbers must be finite. "
            f"Nested at most {s.max_json_depth} levels (JOBQ_MAX_JSON_DEPTH); at most {s.max_payload_bytes} "
            f"bytes of JSON as a payload (JOBQ_MAX_PAYLOAD_BYTES), {s.max_result_bytes} as a result "
            f"(JOBQ_MAX_RESULT_BYTES) and {s.max_progress_bytes} as a heartbeat's progress (JOBQ_MAX_PROGRESS_BYTES). "
            "Anything else is refused with 422."
        ),
        "not": {"$ref": HOLDING_NUL_REF},
    }


def _exact_integer_bounds(node: Any) -> None:
    """FastAPI's OpenAPI models hold bounds as floats: 1.0, and 2**63-1 rounded up to 2**63 (one past
    int64). An integer's bounds are written as integers, an int64's maximum exactly."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                bound = node.get(key)
                if isinstance(bound, float) and bound.is_integer():
                    node[key] = INT64_MAX if bound >= INT64_MAX else int(bound)
        for value in node.values():
            _exact_integer_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _exact_integer_bounds(value)


def _no_null_in_query(parameter: dict[str, Any]) -> None:
    """A query string cannot carry null: an optional parameter is simply left out."""
    schema = parameter.get("schema", {})
    variants = [v for v in schema.get("anyOf", []) if v != {"type": "null"}]
    if "anyOf" in schema and len(variants) == 1:
        del schema["anyOf"]
        schema.update(variants[0])


def _request_schemas(doc: dict[str, Any], schemas: dict[str, Any]) -> set[str]:
    """Names of the component schemas that request bodies use, directly or inside another."""
    found: set[str] = set()
    todo = [
        media.get("schema", {})
        for ops in doc.get("paths", {}).values()
        for op in ops.values()
        for media in op.get("requestBody", {}).get("content", {}).values()
    ]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            name = ref.removeprefix(_SCHEMA_REF) if isinstance(ref, str) and ref.startswith(_SCHEMA_REF) else ""
            if name and name not in found and name in schemas:
                found.add(name)
                todo.append(schemas[name])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return found


def _defaults_in_words(schema: dict[str, Any]) -> None:
    """A request field's default goes into its description: openapi-typescript makes a property with a
    `default` required in the component's type, though the server fills it in when it is left out."""
    for prop in schema.get("properties", {}).values():
        if "default" in prop:
            default = prop.pop("default")
            if default is not None:
                text = prop.get("description", "").rstrip()
                prop["description"] = f"{text} Default: {json.dumps(default)}.".strip()


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
                servers=SERVERS,
            )
            from app.auth.policy import OPEN_OPERATIONS

            components = doc.setdefault("components", {})
            schemas = components.setdefault("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            for name, schema in _minimal_schemas().items():
                schemas.setdefault(name, schema)
            for name, examples in SCHEMAS.items():
                if name in schemas:
                    schemas[name]["examples"] = examples
            for path, ops in doc.get("paths", {}).items():
                for method, op in ops.items():
                    # Every request counts against its client's share and, with a key, the key's rate
                    # (app/http/quotas.py): any operation may answer 429.
                    if "429" not in op.setdefault("responses", {}):
                        op["responses"]["429"] = {
                            "description": TOO_MANY_REQUESTS,
                            "headers": {**_RETRY_AFTER, **RATE_LIMIT_HEADERS},
                        }
                    for parameter in op.get("parameters", []):
                        if parameter.get("in") == "query":
                            _no_null_in_query(parameter)
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
            for name in _request_schemas(doc, schemas):
                _defaults_in_words(schemas[name])
            _mark_json_values(doc)
            _exact_integer_bounds(doc)
            schemas["JsonValue"] = json_value_schema(settings)
            components[JSON_RULES] = {"holdingNul": holding_nul()}
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
