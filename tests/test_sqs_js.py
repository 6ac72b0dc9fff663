"""The AWS SDK for JavaScript v3 (`@aws-sdk/client-sqs`, pinned in tests/sqs_js/) against a live jobq: send,
receive, change visibility, delete and their batches (tests/sqs_js/sqs.mjs asserts each step), with keys off
and with keys on, where the SDK's own SigV4 signatures are verified with a key's pair."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import psycopg
import pytest

from app.auth.keys import new_key, sqs_access_key_id, sqs_secret
from app.db import keys as store_keys
from tests.node import ROOT, require_npm_packages, run
from tests.support import LiveServer

pytestmark = pytest.mark.skipif(importlib.util.find_spec("app.sqs") is None, reason="no SQS endpoint in this build")

SQS_JS = ROOT / "tests" / "sqs_js"
SERVER_SECRET = "sqs-server-secret-" + "j" * 30


def run_script(server: LiveServer, queue: str, access_key: str, secret: str) -> dict[str, object]:
    require_npm_packages(SQS_JS)
    node = shutil.which("node")
    assert node is not None
    env = {
        "PATH": os.environ["PATH"],
        "JOBQ_URL": server.url,
        "QUEUE": queue,
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret,
    }
    out = run([node, "sqs.mjs"], SQS_JS, timeout=120, env=env)
    # The output holds stderr too (the SDK warns that its releases after January 2027 want Node 22).
    [line] = [line for line in out.splitlines() if line.startswith('{"ok"')]
    summary: dict[str, object] = json.loads(line)
    return summary


def test_the_javascript_sdk_against_an_open_jobq(server: LiveServer) -> None:
    summary = run_script(server, "js-open", "AKIDEXAMPLE", "any-secret")
    assert summary == {"ok": True, "sent": 4, "received": 7}
    # A message sent over SQS is a job: the queue is jobq's, its jobs completed by the deletes.
    stats = server.client.get("/queues/js-open/stats").json()
    assert stats["counts"]["completed"] == 4, stats


def test_the_javascript_sdk_signs_with_a_keys_pair(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(auth="on", sqs_server_secret=SERVER_SECRET)
    _key, selector, key_hash = new_key()
    key_id = store_keys.api_key_insert(db, "js", selector, key_hash, ["admin"], ["js-*"])
    summary = run_script(server, "js-signed", sqs_access_key_id(selector), sqs_secret(SERVER_SECRET, selector, key_id))
    assert summary["ok"] is True
