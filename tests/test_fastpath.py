"""The lean dispatcher (JOBQ_FAST_PATH, on by default) must answer exactly as FastAPI itself does."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from app.auth.keys import new_key
from app.db import keys as store_keys
from tests.support import LiveServer

JSON = {"content-type": "application/json"}

# (method, path, body bytes or None, headers)
CASES: list[tuple[str, str, bytes | None, dict[str, str]]] = [
    ("POST", "/queues/q/jobs", b'{"payload": {"a": [1, 2.5, "x"]}, "priority": 3}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1, "idempotency_key": "eq-1"}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1, "idempotency_key": "eq-1"}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1}', {}),  # a body without a content-type: 415
    ("POST", "/queues/q/jobs", b"", JSON),
    ("POST", "/queues/q/jobs", b"null", JSON),
    ("POST", "/queues/q/jobs", b"[]", JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": "\\ud800"}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": NaN}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": "a\\u0000"}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1, "priority": "2"}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1, "priority": 2.0}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1, "priority": 2.5}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": ' + b"[" * 100 + b"]" * 100 + b"}", JSON),
    ("POST", "/queues/q/jobs", b'{"payload": ' + b"[" * 5000 + b"]" * 5000 + b"}", JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1, "delay_seconds": 1, "run_at": "2030-01-01T00:00:00Z"}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1, "run_at": "yesterday"}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1, "status": "failed"}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1}', {"content-type": "text/plain"}),
    ("POST", "/queues/bad%20name/jobs", b'{"payload": 1}', JSON),
    ("POST", "/queues/" + "x" * 129 + "/jobs", b'{"payload": 1}', JSON),
    # A bad path parameter does not hide what is wrong with the body: FastAPI reads and checks both.
    ("POST", "/queues/bad%20name/jobs", b'{"payload": 1', JSON),
    ("POST", "/queues/bad%20name/jobs", b"{}", JSON),
    ("POST", "/jobs/0/complete", b"[", JSON),
    ("POST", "/jobs/0/complete", b'{"claim_token": 5}', JSON),
    ("POST", "/queues/q/jobs/batch", b'{"jobs": []}', JSON),
    ("POST", "/queues/q/jobs/batch", b'{"jobs": [{"payload": 1}, {"nope": 1}]}', JSON),
    ("POST", "/queues/q/claim", b'{"worker": "w", "limit": 0}', JSON),
    ("POST", "/queues/q/claim", b'{"worker": "w", "wait_seconds": 99}', JSON),
    ("POST", "/queues/q/claim", b'{"limit": 1}', JSON),
    ("POST", "/queues/empty/claim", b'{"worker": "w"}', JSON),
    ("POST", "/jobs/abc/complete", b'{"claim_token": "x"}', JSON),
    ("POST", "/jobs/0/complete", b'{"claim_token": "x"}', JSON),
    ("POST", "/jobs/99999999999999999999/complete", b'{"claim_token": "x"}', JSON),
    ("POST", "/jobs/777/complete", b'{"claim_token": "x"}', JSON),
    ("POST", "/jobs/777/complete", b'{"claim_token": "has space"}', JSON),
    ("POST", "/jobs/777/heartbeat", b'{"claim_token": "x", "lease_seconds": 0}', JSON),
    ("POST", "/jobs/777/fail", b'{"claim_token": "x"}', JSON),
    ("POST", "/jobs/777/fail", b'{"claim_token": "x", "error": "e"}', JSON),
    ("POST", "/jobs/complete", b'{"jobs": [{"id": 777, "claim_token": "x"}]}', JSON),
    ("POST", "/jobs/complete", b'{"jobs": [{"id": "a", "claim_token": "x"}]}', JSON),
    ("POST", "/jobs/complete", b'{"jobs": [{"id": 9223372036854775808, "claim_token": "x"}]}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1, "run_at": 0}', JSON),
    ("POST", "/queues/q/jobs", b'{"payload": 1, "run_at": "2030-01-01T00:00:00+00:00"}', JSON),
    ("PUT", "/queues/q/jobs", b"{}", JSON),
]

VOLATILE = {"id", "run_at", "created_at", "claim_token", "lease_expires_at", "claimed_at"}


def normalise(body: Any) -> Any:
    """What a client relies on. Problem details are worded by pydantic, which phrases a few messages
    differently when it validates JSON text (the fast path) than parsed objects (FastAPI): status, type
    and the location of each error must match, not the prose."""
    if isinstance(body, dict) and str(body.get("type", "")).startswith("urn:jobq:problem:"):
        locs = sorted(tuple(e["loc"]) for e in body.get("errors", []))
        return (body["type"], body["status"], body["title"], locs)
    if isinstance(body, dict):
        return {k: normalise(v) for k, v in body.items() if k not in VOLATILE}
    if isinstance(body, list):
        return [normalise(v) for v in body]
    return body


@pytest.fixture
def pair(server_factory, database_factory) -> tuple[LiveServer, LiveServer]:  # type: ignore[no-untyped-def]
    return server_factory(fast_path=True), server_factory(database_factory(), fast_path=False)


def test_both_paths_answer_alike(pair: tuple[LiveServer, LiveServer]) -> None:
    fast, plain = pair
    for method, path, body, headers in CASES:
        answers = []
        for server in (fast, plain):
            r = server.client.request(method, path, content=body, headers=headers)
            answers.append((r.status_code, r.headers.get("content-type"), r.headers.get("retry-after"),
                            r.headers.get("allow"), normalise(r.json())))  # fmt: skip
        assert answers[0] == answers[1], (method, path, body)
        assert answers[0][0] < 500, (method, path, body, answers[0])


# With auth on: (key, method, path, body). Keys: admin, a producer, a consumer limited to queue "a".
AUTH_CASES: list[tuple[str | None, str, str, bytes | None]] = [
    (None, "POST", "/queues/a/jobs", b'{"payload": 1}'),
    ("bogus", "POST", "/queues/a/jobs", b'{"payload": 1}'),
    (None, "POST", "/jobs/1/complete", b'{"claim_token": "x"}'),
    (None, "GET", "/jobs/1", None),
    (None, "GET", "/healthz", None),
    ("admin", "POST", "/queues/a/jobs", b'{"payload": "for a"}'),
    ("admin", "POST", "/queues/b/jobs", b'{"payload": "for b"}'),
    ("producer", "POST", "/queues/b/jobs", b'{"payload": 1}'),
    ("producer", "POST", "/queues/b/jobs/batch", b'{"jobs": [{"payload": 1}]}'),
    ("producer", "POST", "/queues/a/claim", b'{"worker": "w"}'),
    ("producer", "POST", "/jobs/1/heartbeat", b'{"claim_token": "x"}'),
    ("producer", "POST", "/jobs/complete", b'{"jobs": [{"id": 1, "claim_token": "x"}]}'),
    ("producer", "GET", "/jobs/1", None),
    ("consumer-a", "POST", "/queues/a/jobs", b'{"payload": 1}'),
    ("consumer-a", "POST", "/queues/b/claim", b'{"worker": "w"}'),
    ("consumer-a", "GET", "/jobs/1", None),
    ("consumer-a", "GET", "/jobs/2", None),  # queue b: not found, like a missing job
    ("consumer-a", "POST", "/jobs/2/complete", b'{"claim_token": "x"}'),
    ("consumer-a", "POST", "/jobs/2/fail", b'{"claim_token": "x", "error": "e"}'),
    ("consumer-a", "POST", "/jobs/complete", b'{"jobs": [{"id": 2, "claim_token": "x"}]}'),
    ("consumer-a", "POST", "/queues/a/claim", b'{"worker": "w"}'),
]


@pytest.fixture
def secured_pair(server_factory, database_factory) -> tuple[dict[str, str], LiveServer, LiveServer]:  # type: ignore[no-untyped-def]
    keys: dict[str, str] = {"bogus": "jobq_000000000000_" + "A" * 43}
    grants = {"admin": (["admin"], None), "producer": (["produce"], None), "consumer-a": (["consume"], ["a"])}
    made = {name: new_key() for name in grants}
    servers = []
    for fast_path in (True, False):
        url = database_factory()
        with psycopg.connect(url, autocommit=True) as conn:
            for name, (key, selector, key_hash) in made.items():
                store_keys.api_key_insert(conn, name, selector, key_hash, *grants[name])
                keys[name] = key
        servers.append(server_factory(url, fast_path=fast_path, auth="on"))
    return keys, servers[0], servers[1]


def test_both_paths_authorise_alike(secured_pair: tuple[dict[str, str], LiveServer, LiveServer]) -> None:
    keys, fast, plain = secured_pair
    for who, method, path, body in AUTH_CASES:
        headers = {**JSON, **({"authorization": f"Bearer {keys[who]}"} if who else {})}
        answers = []
        for server in (fast, plain):
            r = server.client.request(method, path, content=body, headers=headers)
            answers.append((r.status_code, r.headers.get("www-authenticate"), normalise(r.json())))
        assert answers[0] == answers[1], (who, method, path)
        assert answers[0][0] < 500, (who, method, path, answers[0])


def test_the_fast_path_is_really_taken(pair: tuple[LiveServer, LiveServer]) -> None:
    fast, plain = pair
    assert fast.app.guard.app.__class__.__name__ == "FastPath"
    assert plain.app.guard.app is plain.app.api
