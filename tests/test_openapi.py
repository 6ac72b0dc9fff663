"""The committed openapi/openapi.json is the contract: it must be exactly what the app serves."""

from __future__ import annotations

import json
from pathlib import Path

from app.openapi import published_document
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
