"""The committed openapi/openapi.json is the contract: it must be exactly what the app serves."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator

from app.main import published_document
from tests.support import LiveServer

COMMITTED = Path(__file__).parent.parent / "openapi" / "openapi.json"


def test_committed_openapi_matches_the_app() -> None:
    committed = json.loads(COMMITTED.read_text())
    assert committed == published_document(), "run `make openapi` and commit openapi/openapi.json"


def test_served_document_is_the_configured_contract(server: LiveServer) -> None:
    served = server.client.get("/openapi.json").json()
    assert served["paths"].keys() == json.loads(COMMITTED.read_text())["paths"].keys()


def test_every_operation_is_named_and_errors_are_problems() -> None:
    doc = published_document()
    ids = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            ids.append(op.get("operationId"))
            assert op.get("operationId"), f"{method} {path} has no operationId"
            for code, response in op["responses"].items():
                if code[0] in "45":
                    assert list(response["content"]) == ["application/problem+json"], (path, code)
    assert len(ids) == len(set(ids))


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = published_document()
    assert doc["openapi"].startswith("3.1")
    OpenAPIV31SpecValidator(doc).validate()


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, ops in doc["paths"].items() for method, op in ops.items()]


def _schema_validator(doc: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """A validator for a schema of the document, its $refs to #/components resolved in the document."""
    return Draft202012Validator({**schema, "components": doc["components"]})


def test_every_body_and_answer_has_an_example_that_fits_its_schema() -> None:
    """What client generators and API explorers show: a named schema and an example for each request
    body and success answer, and for each problem answer the problems it can be."""
    doc = published_document()
    for method, path, op in _operations(doc):
        where = f"{method.upper()} {path}"
        for media in op.get("requestBody", {}).get("content", {}).values():
            assert media["schema"].get("$ref"), f"{where}: request body without a named schema"
            assert "example" in media, f"{where}: request body without an example"
            _schema_validator(doc, media["schema"]).validate(media["example"])
        for code, response in op["responses"].items():
            for media_type, media in response.get("content", {}).items():
                if media_type.endswith("json"):  # JSON bodies are named schemas; /metrics is plain text
                    assert media["schema"].get("$ref"), f"{where} {code}: answer without a named schema"
                if code.startswith("2"):
                    assert "example" in media, f"{where} {code}: answer without an example"
                    _schema_validator(doc, media["schema"]).validate(media["example"])
                else:
                    assert media_type == "application/problem+json"
                    assert media.get("examples"), f"{where} {code}: problem without an example"
                    for example in media["examples"].values():
                        _schema_validator(doc, media["schema"]).validate(example["value"])
                        assert example["value"]["status"] == int(code)
                        assert example["value"]["type"].startswith("urn:jobq:problem:")
    for schema in doc["components"]["schemas"].values():
        for example in schema.get("examples", []):
            _schema_validator(doc, schema).validate(example)


def test_problem_answers_are_documented_per_operation() -> None:
    doc = published_document()
    ops = {op["operationId"]: op for _, _, op in _operations(doc)}
    writes = {"400", "413", "415", "422", "503"}
    hot = ("enqueueJob", "enqueueJobs", "claimJobs", "heartbeatJob", "completeJob", "failJob", "completeJobs")
    for op_id in (*hot, "releaseJob"):
        assert writes <= ops[op_id]["responses"].keys(), op_id
    for op_id in ("heartbeatJob", "completeJob", "failJob", "releaseJob"):
        examples = ops[op_id]["responses"]["409"]["content"]["application/problem+json"]["examples"]
        assert "claim-lost" in examples and {"404", "409"} <= ops[op_id]["responses"].keys()
    assert "429" in ops["claimJobs"]["responses"]
    assert "Retry-After" in ops["claimJobs"]["responses"]["429"]["headers"]
    assert {"404", "503"} <= ops["getJob"]["responses"].keys()
    assert "503" in ops["readyz"]["responses"]


def test_problem_examples_are_what_the_service_answers(server: LiveServer) -> None:
    doc = published_document()

    def example(path: str, method: str, code: int, name: str) -> dict[str, Any]:
        media = doc["paths"][path][method]["responses"][str(code)]["content"]["application/problem+json"]
        return media["examples"][name]["value"]  # type: ignore[no-any-return]

    server.enqueue(payload=1)
    job = server.claim_one()
    answers = {
        ("/jobs/{job_id}/complete", "post", 409, "claim-lost"): server.client.post(
            f"/jobs/{job['id']}/complete", json={"claim_token": "stale"}
        ),
        ("/jobs/{job_id}/heartbeat", "post", 404, "job-not-found"): server.client.post(
            "/jobs/42/heartbeat", json={"claim_token": "x"}
        ),
        ("/queues/{queue}/claim", "post", 422, "missing-body"): server.client.post("/queues/emails/claim"),
        ("/jobs/{job_id}", "get", 422, "bad-job-id"): server.client.get("/jobs/0"),
        ("/jobs/{job_id}", "get", 422, "bad-wait"): server.client.get("/jobs/42?wait_seconds=31"),
        ("/schedules/{name}", "put", 422, "bad-cron"): server.client.put(
            "/schedules/daily", json={"queue": "q", "cron": "61 * * * *", "payload": None}
        ),
        ("/schedules/{name}", "get", 404, "schedule-not-found"): server.client.get("/schedules/daily"),
        ("/schedules/{name}", "delete", 422, "bad-schedule-name"): server.client.delete("/schedules/a%20b"),
    }
    for (path, method, code, name), answer in answers.items():
        documented = example(path, method, code, name)
        got = answer.json()
        assert answer.status_code == code, got
        fields = ("type", "title", "status", "detail", "errors")
        assert {k: got.get(k) for k in fields} == {k: documented.get(k) for k in fields}, name


def test_every_operation_states_its_security() -> None:
    """Bearer keys everywhere but the health checks; 401 documented wherever a key is needed, 403 wherever a
    scope or queue can refuse. New routes must do the same (and declare their scope with @requires)."""
    doc = published_document()
    assert doc["components"]["securitySchemes"]["bearerKey"] == {**doc["components"]["securitySchemes"]["bearerKey"],
                                                                  "type": "http", "scheme": "bearer"}  # fmt: skip
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if op["operationId"] in ("healthz", "readyz"):
                assert op["security"] == [], path
                assert "401" not in op["responses"], path
                continue
            assert op["security"] == [{"bearerKey": []}], (method, path)
            assert "401" in op["responses"], (method, path)
            # getJob too: a key with only the `metrics` scope may not read jobs (one outside its queues is a 404)
            assert "403" in op["responses"], (method, path)


def test_payloads_and_results_state_what_jsonb_can_hold() -> None:
    """Payloads and results are any JSON value: an unconstrained schema (a recursive one defeats client
    generators) whose description states what the server enforces (tests/test_limits.py checks each)."""
    doc = published_document()
    schemas = doc["components"]["schemas"]
    value = schemas["JsonValue"]
    assert set(value) == {"description", "not"}
    for words in ("NUL", "JOBQ_MAX_JSON_DEPTH", "JOBQ_MAX_PAYLOAD_BYTES", "JOBQ_MAX_RESULT_BYTES", "finite"):
        assert words in value["description"]
    for name, prop in (("EnqueueRequest", "payload"), ("CompleteRequest", "result"), ("Job", "payload")):
        assert schemas[name]["properties"][prop]["$ref"] == "#/components/schemas/JsonValue", name
    assert "x-jobq-json-value" not in json.dumps(doc)


def test_the_document_states_that_no_string_or_key_of_a_json_value_holds_nul() -> None:
    """The review's only schemathesis failures: values the served document allowed (NUL in a nested string or
    key of a payload, a result, a progress) that the server refuses with 422. JsonValue now says it as JSON
    Schema, at any depth, which fuzzers and validators follow (client generators skip it: see
    tests/test_generated_clients.py)."""
    doc = published_document()
    value = _schema_validator(doc, {"$ref": "#/components/schemas/JsonValue"})
    for good in (None, 1.5, "text", [], {}, {"a": [1, {"b": "c"}]}, ["\u0001", {"tab\t": "é"}]):
        assert value.is_valid(good), good
    for bad in ("a\x00", ["x", "\x00"], {"k\x00": 1}, {"a": {"b": [{"c": "\x00"}]}}, [[[{"\x00": None}]]]):
        assert not value.is_valid(bad), bad


def test_every_route_that_is_not_open_declares_its_scope(server: LiveServer) -> None:
    """Who may call what is declared where each route is defined (app/auth/policy.py @requires), so no
    route can forget to check."""
    from fastapi.routing import APIRoute

    from app.auth.policy import OPEN_OPERATIONS, declared_scope

    undeclared = [
        r.path
        for r in server.app.api.routes
        if isinstance(r, APIRoute) and r.operation_id not in OPEN_OPERATIONS and not declared_scope(r.endpoint)[0]
    ]
    assert undeclared == []
    scopes = {r.operation_id: declared_scope(r.endpoint)[1] for r in server.app.api.routes if isinstance(r, APIRoute)}
    assert (scopes["enqueueJob"], scopes["claimJobs"], scopes["getJob"], scopes["metrics"]) == (
        "produce",
        "consume",
        None,
        "metrics",
    )


def _request_schemas(doc: dict[str, Any]) -> set[str]:
    text = json.dumps([op.get("requestBody", {}) for _, _, op in _operations(doc)])
    names = set(re.findall(r"#/components/schemas/(\w+)", text))
    for name in list(names):  # one level down: batch items
        names |= set(re.findall(r"#/components/schemas/(\w+)", json.dumps(doc["components"]["schemas"][name])))
    return names - {"JsonValue"}


NULL_CLEARS = {"QueueConfigPatch", "RetentionPatch"}


def test_what_client_generators_need() -> None:
    """openapi-python-client and openapi-typescript read the document (tests/test_generated_clients.py runs
    them); these are the rules that keep their clients exact."""
    doc = published_document()
    schemas = doc["components"]["schemas"]
    assert doc["servers"] and doc["servers"][0]["url"]
    # No null where null means nothing: optional request fields and query parameters are left out instead.
    requests = _request_schemas(doc)
    assert {"EnqueueRequest", "CompleteItem", "ClaimRequest", "CancelRequest"} <= requests
    for name in requests:
        for field, prop in schemas[name].get("properties", {}).items():  # (an enum has none)
            # Except in a PATCH, where null means something: clear the field (JSON Merge Patch).
            if name not in NULL_CLEARS:
                assert "null" not in json.dumps(prop.get("anyOf", [])), (name, field)
            # openapi-typescript makes a property with a default required: defaults are said in words.
            assert "default" not in prop, (name, field)
    for method, path, op in _operations(doc):
        for parameter in op.get("parameters", []):
            assert "anyOf" not in parameter["schema"], (method, path, parameter["name"])
    # Always sent means required; Problem.errors comes with validation errors only.
    for name, schema in schemas.items():
        if name in requests or "properties" not in schema:
            continue
        optional = set(schema["properties"]) - set(schema.get("required", []))
        assert optional == ({"errors"} if name == "Problem" else set()), name
    issue = schemas["ValidationIssue"]
    assert set(issue["required"]) == {"loc", "msg", "type"}
    assert issue["properties"]["loc"]["items"] == {"anyOf": [{"type": "string"}, {"type": "integer"}]}
    assert schemas["Problem"]["properties"]["errors"]["items"] == {"$ref": "#/components/schemas/ValidationIssue"}
    # int64 bounds exactly (FastAPI's models would write 2**63 as a float)
    assert schemas["CompleteItem"]["properties"]["id"]["maximum"] == 2**63 - 1
    assert "e+18" not in json.dumps(doc)


def test_worker_writes_describe_retries_and_conflicts() -> None:
    ops = {op["operationId"]: op for _, _, op in _operations(published_document())}
    for op_id in ("heartbeatJob", "completeJob", "failJob"):
        text = ops[op_id]["description"]
        assert "claim-lost" in text and ("200" in text or "harmless" in text), op_id
        assert ops[op_id]["responses"]["409"]["description"] in text, op_id
    for op_id in ("completeJob", "failJob"):
        assert "answers 200" in ops[op_id]["description"] and "job-cancelled" in ops[op_id]["description"]
        assert "job-cancelled" in ops[op_id]["responses"]["409"]["description"]
    assert "cancel_requested" in ops["heartbeatJob"]["description"]


def test_an_optional_field_sent_as_null_is_refused(server: LiveServer) -> None:
    """The schema has no null for these fields, so the server refuses one (it used to mean 'left out')."""
    for path, body in (
        ("/queues/q/jobs", {"payload": 1, "run_at": None}),
        ("/queues/q/claim", {"worker": "w", "lease_seconds": None}),
        ("/queues/q/redrive", {"limit": None}),
    ):
        answer = server.client.post(path, json=body)
        assert answer.status_code == 422, (path, answer.text)
        assert answer.json()["errors"][0]["type"] == "not_null"
    assert server.client.post("/queues/q/jobs", json={"payload": None}).status_code == 201  # a JSON value
    assert server.client.get("/queues/q/jobs", params={"status": "pending"}).status_code == 200
