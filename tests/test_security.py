"""API keys and what they may do: 401 and 403, scopes, queue patterns, object-level checks on jobs addressed
by id, revocation across processes, secure defaults, and secrets kept out of logs and error bodies."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from app.auth.keys import new_key, parse_key
from app.db import keys as store_keys
from app.runtime.cli import main as jobq
from tests.support import LiveServer, problem, wait_until

ENV_KEY = "container-key-" + "k" * 40
JSON = {"content-type": "application/json"}


def create_key(db: psycopg.Connection, name: str, scopes: list[str], queues: list[str] | None = None) -> str:
    key, selector, key_hash = new_key()
    store_keys.api_key_insert(db, name, selector, key_hash, scopes, queues)
    return key


_open: list[httpx.Client] = []


def as_key(server: LiveServer, key: str | None) -> httpx.Client:
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    client = httpx.Client(base_url=server.url, headers=headers, timeout=30)
    _open.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _open:
        _open.pop().close()


@pytest.fixture
def secured(server_factory) -> LiveServer:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY)
    # Listening: its start empties the key cache (a revocation may have gone by unheard), which must not
    # happen in the middle of a test that counts lookups.
    wait_until(lambda: server.services.wakeups.connected.is_set(), what="listening")
    return server


@pytest.fixture
def admin(secured: LiveServer) -> Iterator[httpx.Client]:
    with as_key(secured, ENV_KEY) as c:
        yield c


def enqueue(client: httpx.Client, queue: str, payload: Any = 1) -> dict[str, Any]:
    r = client.post(f"/queues/{queue}/jobs", json={"payload": payload})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def claim_one(client: httpx.Client, queue: str) -> dict[str, Any]:
    r = client.post(f"/queues/{queue}/claim", json={"worker": "w"})
    assert r.status_code == 200, r.text
    [job] = r.json()["jobs"]
    return job  # type: ignore[no-any-return]


# --- keys -------------------------------------------------------------------------------------------------


def test_keys_are_random_shown_once_and_stored_as_hashes(database_url: str, db: psycopg.Connection, capsys) -> None:  # type: ignore[no-untyped-def]
    assert jobq(["keys", "create", "--database-url", database_url, "--name", "mailer", "--scope", "produce",
                 "--queue", "emails", "--queue", "sms.*"]) == 0  # fmt: skip
    out = capsys.readouterr()
    key = out.out.strip()
    assert key not in out.err
    parsed = parse_key(key)
    assert parsed is not None
    selector, secret = parsed
    assert len(secret) == 43  # 32 random bytes, base64url
    row = db.execute(
        "SELECT name, selector, key_hash, scopes, queue_patterns, api_keys::text FROM jobq.api_keys"
    ).fetchone()
    assert row is not None
    assert row[:2] == ("mailer", selector)
    assert bytes(row[2]) == hashlib.sha256(secret.encode()).digest()
    assert (row[3], row[4]) == (["produce"], ["emails", "sms.*"])
    assert secret not in row[5]  # nothing but the hash of the secret is kept

    second = new_key()
    assert parse_key(second[0]) != parsed


def test_cli_lists_without_secrets_and_revokes_by_name_or_id(database_url: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert jobq(["keys", "create", "--database-url", database_url, "--name", "a", "--scope", "admin"]) == 0
    key_a = capsys.readouterr().out.strip()
    assert jobq(["keys", "create", "--database-url", database_url, "--name", "b", "--scope", "consume"]) == 0
    key_b = capsys.readouterr().out.strip()
    assert jobq(["keys", "create", "--database-url", database_url, "--name", "b", "--scope", "consume"]) == 2
    assert "already named" in capsys.readouterr().err
    assert jobq(["keys", "create", "--database-url", database_url, "--name", "c", "--scope", "consume",
                 "--queue", "bad/pattern"]) == 2  # fmt: skip
    capsys.readouterr()

    assert jobq(["keys", "list", "--database-url", database_url]) == 0
    listing = capsys.readouterr().out
    assert " a " in listing and " b " in listing
    for key in (key_a, key_b):
        assert key not in listing and parse_key(key)[1] not in listing  # type: ignore[index]
        assert f"jobq_{parse_key(key)[0]}_" in listing  # type: ignore[index]  # the prefix identifies it

    assert jobq(["keys", "revoke", "--database-url", database_url, "b"]) == 0
    assert jobq(["keys", "revoke", "--database-url", database_url, "1"]) == 0
    capsys.readouterr()
    assert jobq(["keys", "revoke", "--database-url", database_url, "b"]) == 1
    assert jobq(["keys", "list", "--database-url", database_url, "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert jobq(["keys", "list", "--database-url", database_url, "--json", "--all"]) == 0
    assert '"revoked_at": null' not in capsys.readouterr().out


# --- 401 ----------------------------------------------------------------------------------------------------


def test_no_key_or_a_bad_key_is_401(secured: LiveServer, db: psycopg.Connection) -> None:
    good = create_key(db, "good", ["admin"])
    revoked = create_key(db, "gone", ["admin"])
    store_keys.api_key_revoke(db, "gone")
    selector, _ = parse_key(good)  # type: ignore[misc]
    wrong_secret = f"jobq_{selector}_{'A' * 43}"
    for key in (None, "nonsense", wrong_secret, revoked, good + "x", ENV_KEY[:-1]):
        with as_key(secured, key) as c:
            r = c.post("/queues/q/jobs", json={"payload": 1})
            body = problem(r, 401, "unauthorized")
            assert r.headers["www-authenticate"].startswith('Bearer realm="jobq"')
            assert ("invalid_token" in r.headers["www-authenticate"]) == bool(key)
            assert (key or "@") not in r.text
    problem(httpx.post(f"{secured.url}/queues/q/jobs", json={"payload": 1}, headers={"authorization": "Bearer"}),
            401, "unauthorized")  # fmt: skip
    for scheme in ("Basic", "Token", "bearer"):
        r = httpx.post(f"{secured.url}/queues/q/jobs", json={"payload": 1},
                       headers={"authorization": f"{scheme} {good}"})  # fmt: skip
        assert r.status_code == (201 if scheme == "bearer" else 401), scheme
    assert body["detail"]
    row = db.execute("SELECT count(*) FROM jobq.jobs").fetchone()
    assert row == (1,)


def test_401_comes_before_the_body_is_read(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(auth="on", max_request_bytes=1024, max_payload_bytes=512)

    def endless() -> Iterator[bytes]:
        yield b'{"payload": "'
        yield b"x" * 1_000_000
        yield b'"}'

    r = httpx.post(f"{server.url}/queues/q/jobs", content=endless(), headers={"content-type": "application/json"})
    problem(r, 401, "unauthorized")
    problem(httpx.post(f"{server.url}/no/such/route"), 401, "unauthorized")


def test_health_and_docs_are_open(secured: LiveServer) -> None:
    with as_key(secured, None) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
        assert c.get("/openapi.json").status_code == 200
        assert c.get("/docs").status_code == 200
        assert c.get("/docs/swagger-ui-bundle.js").status_code == 200
    with as_key(secured, "not-a-key") as c:
        assert c.get("/healthz").status_code == 200


def test_the_docs_page_loads_nothing_from_another_site(server: LiveServer) -> None:
    """Swagger UI comes from the package installed with jobq: every script, style and image the page names is
    served by the service itself (a CDN's script would run with the operator's key in reach)."""
    page = server.client.get("/docs")
    assert page.status_code == 200 and page.headers["x-frame-options"] == "DENY"
    urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", page.text)
    assert urls and not [u for u in urls if "//" in u], urls
    for url in urls:
        r = server.client.get(url)
        assert r.status_code == 200, url
        assert url == "/openapi.json" or r.headers["x-content-type-options"] == "nosniff"
    assert server.client.get("/docs/swagger-ui-bundle.js").headers["content-type"].startswith("text/javascript")
    assert server.client.get("/redoc").status_code == 404
    assert server.client.get("/docs/swagger-ui.css?name=../../../../etc/passwd").text.startswith(".swagger-ui")


# --- scopes and queues (403) -----------------------------------------------------------------------------


def test_scopes_decide_what_a_key_may_do(secured: LiveServer, db: psycopg.Connection, admin: httpx.Client) -> None:
    producer = as_key(secured, create_key(db, "producer", ["produce"]))
    consumer = as_key(secured, create_key(db, "consumer", ["consume"]))
    job = enqueue(producer, "q")
    assert producer.post("/queues/q/jobs/batch", json={"jobs": [{"payload": 2}]}).status_code == 201
    body = problem(producer.post("/queues/q/claim", json={"worker": "w"}), 403, "forbidden")
    assert "consume" in body["detail"]
    problem(consumer.post("/queues/q/jobs", json={"payload": 1}), 403, "forbidden")
    problem(consumer.post("/queues/q/jobs/batch", json={"jobs": [{"payload": 1}]}), 403, "forbidden")

    c = claim_one(consumer, "q")
    token = {"claim_token": c["claim_token"]}
    for path, extra in (("heartbeat", {}), ("complete", {}), ("fail", {"error": "e"}), ("release", {})):
        problem(producer.post(f"/jobs/{c['id']}/{path}", json={**token, **extra}), 403, "forbidden")
    problem(producer.post("/jobs/complete", json={"jobs": [{"id": c["id"], **token}]}), 403, "forbidden")
    assert consumer.post(f"/jobs/{c['id']}/heartbeat", json=token).status_code == 200
    assert consumer.post(f"/jobs/{c['id']}/complete", json=token).status_code == 200

    # Any key reads the jobs of its queues; admin may do everything.
    assert producer.get(f"/jobs/{job['id']}").json()["status"] == "completed"
    assert consumer.get(f"/jobs/{job['id']}").status_code == 200
    enqueue(admin, "q")
    claimed = claim_one(admin, "q")
    assert (
        admin.post(f"/jobs/{claimed['id']}/complete", json={"claim_token": claimed["claim_token"]}).status_code == 200
    )


def test_queue_patterns_limit_a_key(secured: LiveServer, db: psycopg.Connection) -> None:
    key = create_key(db, "mail", ["produce", "consume"], ["emails", "sms.*"])
    with as_key(secured, key) as c:
        for queue in ("emails", "sms.eu", "sms."):
            enqueue(c, queue)
            assert claim_one(c, queue)["queue"] == queue
        for queue in ("emails2", "xemails", "sms", "smsXeu", "other"):
            body = problem(c.post(f"/queues/{queue}/jobs", json={"payload": 1}), 403, "forbidden")
            assert queue in body["detail"]
            problem(c.post(f"/queues/{queue}/claim", json={"worker": "w"}), 403, "forbidden")


def test_a_key_cannot_touch_or_see_jobs_of_other_queues(
    secured: LiveServer, db: psycopg.Connection, admin: httpx.Client
) -> None:
    """A consume key for queue A holding a valid token of a job in queue B gets exactly what it would get for
    a job that does not exist, and the job does not change."""
    enqueue(admin, "b", payload="secret-b")
    theirs = claim_one(admin, "b")
    token = theirs["claim_token"]
    before = db.execute("SELECT * FROM jobq.jobs WHERE id = %s", (theirs["id"],)).fetchone()
    missing = 987654321
    with as_key(secured, create_key(db, "a-only", ["consume", "produce"], ["a"])) as c:
        for path, body in (
            ("heartbeat", {"claim_token": token}),
            ("complete", {"claim_token": token, "result": 1}),
            ("fail", {"claim_token": token, "error": "e", "retry": False}),
            ("release", {"claim_token": token}),
        ):
            r_theirs = c.post(f"/jobs/{theirs['id']}/{path}", json=body)
            r_missing = c.post(f"/jobs/{missing}/{path}", json=body)
            a, b = problem(r_theirs, 404, "job-not-found"), problem(r_missing, 404, "job-not-found")
            assert {**a, "instance": None} == {**b, "instance": None}
            assert "secret-b" not in r_theirs.text
        r = c.post("/jobs/complete", json={"jobs": [{"id": theirs["id"], "claim_token": token}]})
        assert r.json()["results"] == [{"id": theirs["id"], "outcome": "not_found", "status": None}]
        a = problem(c.get(f"/jobs/{theirs['id']}"), 404, "job-not-found")
        b = problem(c.get(f"/jobs/{missing}"), 404, "job-not-found")
        assert {**a, "instance": None} == {**b, "instance": None}
        # Its own queue works as usual.
        enqueue(c, "a")
        mine = claim_one(c, "a")
        assert c.post(f"/jobs/{mine['id']}/complete", json={"claim_token": mine["claim_token"]}).status_code == 200
    assert db.execute("SELECT * FROM jobq.jobs WHERE id = %s", (theirs["id"],)).fetchone() == before


# --- operator routes: admin only -----------------------------------------------------------------------------

OPERATOR_CALLS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/queues", None),
    ("GET", "/queues/{q}/stats", None),
    ("GET", "/queues/{q}/jobs", None),
    ("POST", "/jobs/{job}/cancel", {"reason": "x"}),
    ("POST", "/jobs/{job}/retry", None),
    ("POST", "/queues/{q}/redrive", {"dry_run": True}),
    ("POST", "/queues/{q}/pause", None),
    ("POST", "/queues/{q}/resume", None),
    ("GET", "/workers", None),
    ("GET", "/metrics", None),
]


def test_only_admin_keys_reach_stats_listings_and_admin_actions(
    secured: LiveServer, db: psycopg.Connection, admin: httpx.Client
) -> None:
    job = enqueue(admin, "q")
    worker = as_key(secured, create_key(db, "worker", ["produce", "consume"]))
    for method, path, body in OPERATOR_CALLS:
        url = path.format(q="q", job=job["id"])
        problem(as_key(secured, None).request(method, url, json=body), 401, "unauthorized")
        problem(worker.request(method, url, json=body), 403, "forbidden")
        assert admin.request(method, url, json=body).status_code < 400 or path.endswith("retry"), (method, url)
    # retry of a pending job is a 409 for the admin: it reached the action
    problem(admin.post(f"/jobs/{job['id']}/retry"), 409, "invalid-state")


def test_an_admin_key_limited_to_queues_sees_and_acts_on_those_only(
    secured: LiveServer, db: psycopg.Connection, admin: httpx.Client
) -> None:
    mine, theirs = enqueue(admin, "team-a.emails"), enqueue(admin, "team-b.emails")
    with as_key(secured, create_key(db, "team-a-ops", ["admin"], ["team-a.*"])) as ops:
        assert [q["queue"] for q in ops.get("/queues").json()["queues"]] == ["team-a.emails"]
        assert {q["queue"] for q in admin.get("/queues").json()["queues"]} == {"team-a.emails", "team-b.emails"}
        assert ops.get("/queues/team-a.emails/stats").status_code == 200
        for method, path, body in OPERATOR_CALLS:
            if "{q}" in path:
                problem(ops.request(method, path.format(q="team-b.emails"), json=body), 403, "forbidden")
        for action in ("cancel", "retry"):
            a = problem(ops.post(f"/jobs/{theirs['id']}/{action}"), 404, "job-not-found")
            b = problem(ops.post(f"/jobs/987654321/{action}"), 404, "job-not-found")
            assert {**a, "instance": None} == {**b, "instance": None}
        assert ops.post(f"/jobs/{mine['id']}/cancel").json()["status"] == "cancelled"
        problem(ops.get("/metrics"), 403, "forbidden")  # covers every queue
    assert admin.get(f"/jobs/{theirs['id']}").json()["status"] == "pending"


# --- the metrics scope: GET /metrics and nothing else ----------------------------------------------------------


def test_a_metrics_key_reads_metrics_and_nothing_else(
    secured: LiveServer, db: psycopg.Connection, admin: httpx.Client
) -> None:
    """A scraper's key: /metrics, and 403 on every other route a key can reach, with nothing changed."""
    job = enqueue(admin, "q")
    enqueue(admin, "w")
    claimed = claim_one(admin, "w")
    token = {"claim_token": claimed["claim_token"]}
    before = db.execute("SELECT * FROM jobq.jobs ORDER BY id").fetchall()
    scraper = as_key(secured, create_key(db, "prometheus", ["metrics"]))

    r = scraper.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain") and "jobq_jobs_enqueued_total" in r.text

    denied: list[tuple[str, str, dict[str, Any] | None]] = [
        *((m, p.format(q="q", job=job["id"]), b) for m, p, b in OPERATOR_CALLS if p != "/metrics"),
        ("GET", f"/jobs/{job['id']}", None),
        ("POST", "/queues/q/jobs", {"payload": 1}),
        ("POST", "/queues/q/jobs/batch", {"jobs": [{"payload": 1}]}),
        ("POST", "/queues/q/claim", {"worker": "w"}),
        ("POST", f"/jobs/{claimed['id']}/heartbeat", token),
        ("POST", f"/jobs/{claimed['id']}/complete", token),
        ("POST", f"/jobs/{claimed['id']}/fail", {**token, "error": "e"}),
        ("POST", "/jobs/complete", {"jobs": [{"id": claimed["id"], **token}]}),
    ]
    for method, url, body in denied:
        problem(scraper.request(method, url, json=body), 403, "forbidden")
    assert "metrics" in problem(scraper.get(f"/jobs/{job['id']}"), 403, "forbidden")["detail"]
    assert db.execute("SELECT * FROM jobq.jobs ORDER BY id").fetchall() == before
    assert db.execute("SELECT count(*) FROM jobq.queue_state").fetchone() == (0,)  # the pause did not happen


def test_metrics_is_reached_by_metrics_and_admin_keys_only(
    secured: LiveServer, db: psycopg.Connection, admin: httpx.Client
) -> None:
    everything_but = as_key(secured, create_key(db, "worker", ["produce", "consume"]))
    problem(everything_but.get("/metrics"), 403, "forbidden")
    for scopes in (["produce"], ["consume"]):
        body = problem(as_key(secured, create_key(db, scopes[0], scopes)).get("/metrics"), 403, "forbidden")
        assert "metrics" in body["detail"]
    assert admin.get("/metrics").status_code == 200  # the environment's key, as before
    assert as_key(secured, create_key(db, "ops", ["admin"])).get("/metrics").status_code == 200
    assert as_key(secured, create_key(db, "scraper", ["metrics"])).get("/metrics").status_code == 200


def test_metrics_with_a_job_scope_reaches_both_and_no_more(
    secured: LiveServer, db: psycopg.Connection, admin: httpx.Client
) -> None:
    """A job scope beside `metrics` is what opens GET /jobs/{id}; `metrics` adds nothing but /metrics."""
    both = as_key(secured, create_key(db, "both", ["produce", "metrics"]))
    job = enqueue(both, "q")
    assert both.get(f"/jobs/{job['id']}").status_code == 200
    assert both.get("/metrics").status_code == 200
    problem(both.post("/queues/q/claim", json={"worker": "w"}), 403, "forbidden")
    problem(both.get("/queues"), 403, "forbidden")
    problem(both.get("/queues/q/stats"), 403, "forbidden")


def test_a_metrics_key_is_never_limited_to_queues(database_url: str, db: psycopg.Connection, capsys) -> None:  # type: ignore[no-untyped-def]
    """/metrics covers every queue, so a key holding `metrics` with queue patterns could do nothing: the CLI
    refuses to make one (exit 2, like any bad flag), and so does the schema."""
    for scopes in (["metrics"], ["metrics", "produce"], ["admin", "metrics"]):
        flags = [arg for scope in scopes for arg in ("--scope", scope)]
        assert jobq(["keys", "create", "--database-url", database_url, "--name", "m", *flags, "--queue", "q"]) == 2
        out = capsys.readouterr()
        assert out.out == "" and "--queue" in out.err and "every queue" in out.err
    assert db.execute("SELECT count(*) FROM jobq.api_keys").fetchone() == (0,)
    with pytest.raises(psycopg.errors.CheckViolation, match="api_keys_metrics_every_queue_check"):
        create_key(db, "m", ["metrics"], ["*"])
    # Queue patterns stay fine for every other scope, admin included.
    assert jobq(["keys", "create", "--database-url", database_url, "--name", "a", "--scope", "admin",
                 "--queue", "q"]) == 0  # fmt: skip


def test_cli_creates_and_lists_a_metrics_key_that_reads_metrics(  # type: ignore[no-untyped-def]
    server_factory, database_url: str, capsys
) -> None:
    assert jobq(["keys", "create", "--database-url", database_url, "--name", "prometheus", "--scope", "metrics"]) == 0
    out = capsys.readouterr()
    key = out.out.strip()
    assert "scopes metrics on every queue" in out.err
    assert jobq(["keys", "list", "--database-url", database_url]) == 0
    _header, row = capsys.readouterr().out.splitlines()
    assert row.split()[1:5] == ["prometheus", f"jobq_{parse_key(key)[0]}_", "metrics", "*"]  # type: ignore[index]
    assert jobq(["keys", "list", "--database-url", database_url, "--json"]) == 0
    [doc] = json.loads(capsys.readouterr().out)
    assert (doc["scopes"], doc["queues"]) == (["metrics"], None)

    server: LiveServer = server_factory(auth="on")
    with as_key(server, key) as c:
        assert c.get("/metrics").status_code == 200
        problem(c.get("/queues"), 403, "forbidden")


# --- caching and revocation ---------------------------------------------------------------------------------


def test_revocation_reaches_every_process_at_once(server_factory, database_url: str, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    # A cache TTL of an hour: only the notification can explain a refusal within the test.
    a: LiveServer = server_factory(auth="on", auth_cache_seconds=3600)
    b: LiveServer = server_factory(auth="on", auth_cache_seconds=3600)
    wait_until(
        lambda: a.services.wakeups.connected.is_set() and b.services.wakeups.connected.is_set(), what="listening"
    )
    generations = a.services.keys.generation, b.services.keys.generation
    key = create_key(db, "doomed", ["produce"])
    # The key's creation is notified too, and empties both caches when it arrives: only then count lookups.
    wait_until(lambda: a.services.keys.generation > generations[0] and b.services.keys.generation > generations[1],
               what="the creation heard")  # fmt: skip
    clients = [as_key(a, key), as_key(b, key)]
    for c in clients:
        for _ in range(3):
            enqueue(c, "q")
    lookups = a.services.keys.lookups + b.services.keys.lookups
    assert lookups == 2  # one per process, then from the cache: no database round trip per request

    # `jobq keys revoke` in a process of its own, as an operator would run it.
    env = {**os.environ, "JOBQ_DATABASE_URL": database_url}
    done = subprocess.run([sys.executable, "-m", "app.runtime.cli", "keys", "revoke", "doomed"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for c in clients:
        wait_until(lambda c=c: c.post("/queues/q/jobs", json={"payload": 1}).status_code == 401, what="refusal")
        c.close()


def test_a_missed_notification_is_bounded_by_the_cache_ttl(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(auth="on", auth_cache_seconds=0.2)
    key = create_key(db, "k", ["produce"])
    with as_key(server, key) as c:
        enqueue(c, "q")
        # Revoked behind the service's back: no NOTIFY is sent.
        db.execute("UPDATE jobq.api_keys SET revoked_at = now()")
        wait_until(lambda: c.post("/queues/q/jobs", json={"payload": 1}).status_code == 401, what="refusal")


def test_a_listener_that_reconnects_forgets_cached_keys(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """A revocation sent while a process was not listening is not lost: reconnecting drops the cache."""
    server: LiveServer = server_factory(auth="on", auth_cache_seconds=3600)
    wait_until(lambda: server.services.wakeups.connected.is_set(), what="listening")
    key = create_key(db, "k", ["produce"])
    with as_key(server, key) as c:
        enqueue(c, "q")
        db.execute("UPDATE jobq.api_keys SET revoked_at = now()")  # no NOTIFY: as if it went by unheard
        assert c.post("/queues/q/jobs", json={"payload": 1}).status_code == 201  # still cached
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'jobq-listener'"
        )
        wait_until(lambda: server.services.wakeups.connections == 2, what="the listener reconnecting")
        problem(c.post("/queues/q/jobs", json={"payload": 1}), 401, "unauthorized")


def test_last_use_is_recorded_lazily(secured: LiveServer, db: psycopg.Connection) -> None:
    key = create_key(db, "k", ["produce"])
    with as_key(secured, key) as c:
        for _ in range(5):
            enqueue(c, "q")
    assert db.execute("SELECT last_used_at FROM jobq.api_keys").fetchone() == (None,)  # no write per request
    secured.run(lambda: secured.services.keys.flush())
    row = db.execute("SELECT last_used_at IS NOT NULL FROM jobq.api_keys").fetchone()
    assert row == (True,)


def test_unknown_keys_cost_one_lookup_each(secured: LiveServer) -> None:
    bogus = f"jobq_{'0' * 12}_{'B' * 43}"
    with as_key(secured, bogus) as c:
        for _ in range(5):
            problem(c.post("/queues/q/jobs", json={"payload": 1}), 401, "unauthorized")
    assert secured.services.keys.lookups == 1


def made_up_key(i: int) -> str:
    return f"jobq_{i:012x}_{'B' * 43}"


def test_a_flood_of_made_up_keys_never_locks_out_a_real_key(secured: LiveServer, db: psycopg.Connection) -> None:
    """While made-up keys are throttled, a real key this process has not seen yet (after a start, or a key just
    created) is still looked up: whether a live key has its selector is read from the list of every live
    key's selector (at most once a second, and again after any key change), never from the rate of misses.
    Otherwise anyone could lock every new client out with a few hundred made-up keys a second."""
    ring = secured.services.keys

    async def flood_then(key: str) -> object:
        await asyncio.gather(*(ring.authenticate(made_up_key(i)) for i in range(200)), return_exceptions=True)
        return await ring.authenticate(key)

    fresh = create_key(db, "fresh", ["produce"])
    who = secured.run(lambda: flood_then(fresh))
    assert getattr(who, "name", None) == "fresh", who
    generation = ring.generation
    later = create_key(db, "later", ["produce"])  # its NOTIFY makes every process read the list again
    wait_until(lambda: ring.generation > generation, what="the key change heard")
    who = secured.run(lambda: flood_then(later))
    assert getattr(who, "name", None) == "later", who


def test_lookups_of_unknown_keys_are_rate_limited(secured: LiveServer, db: psycopg.Connection) -> None:
    """200 made-up keys in a row: past a burst of 50 lookups (20 more a second), a key never seen live here is
    answered 429 without a query. A live key is still looked up when its entry must be read again."""
    from app.errors import KeyLookupsThrottled

    live = create_key(db, "live", ["produce"])
    ring = secured.services.keys
    with as_key(secured, live) as c:
        enqueue(c, "q")

    async def flood() -> list[object]:
        return await asyncio.gather(*(ring.authenticate(made_up_key(i)) for i in range(200)), return_exceptions=True)

    outcomes = secured.run(flood)
    throttled = [o for o in outcomes if isinstance(o, KeyLookupsThrottled)]
    assert len(throttled) >= 100 and all(o is None or isinstance(o, KeyLookupsThrottled) for o in outcomes)
    assert ring.lookups <= 1 + 200 - len(throttled)
    # Over HTTP: 429 with Retry-After (the bucket refills at 20 a second: a few more lookups may pass first).
    with httpx.Client(base_url=secured.url, timeout=30) as c:
        for i in range(1000, 1200):
            r = c.post("/queues/q/jobs", json={"payload": 1}, headers={"authorization": f"Bearer {made_up_key(i)}"})
            if r.status_code == 429:
                break
    problem(r, 429, "key-lookups-throttled")
    assert r.headers["retry-after"] == "1"
    generation = ring.generation
    secured.loop.call_soon_threadsafe(ring.invalidate)  # as a NOTIFY about some key change would
    wait_until(lambda: ring.generation > generation, what="the cache emptied")
    with as_key(secured, live) as c:
        enqueue(c, "q")  # looked up again, however throttled the made-up keys are


def test_made_up_keys_never_push_a_live_key_out_of_the_cache(secured: LiveServer, db: psycopg.Connection) -> None:
    """Unknown selectors and live keys are cached apart: 500 made-up keys through a cache of 100 unknown ones
    leave the live key's entry where it was."""
    from app.auth.keyring import KeyRing

    live = create_key(db, "live", ["produce"])

    async def flood() -> tuple[int, int]:
        ring = KeyRing(secured.services.db, 3600, unknown_entries=100, miss_rate=1e6, miss_burst=1000)
        assert await ring.authenticate(live) is not None
        for i in range(500):
            assert await ring.authenticate(made_up_key(i)) is None
        before = ring.lookups
        assert await ring.authenticate(live) is not None
        return before, ring.lookups

    before, after = secured.run(flood)
    assert before == 501 and after == before  # the live key answered from the cache


# --- secure by default --------------------------------------------------------------------------------------


def test_a_key_from_the_environment_works_and_is_never_logged(server_factory, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY)
    assert ENV_KEY not in repr(server.settings) and ENV_KEY not in str(server.settings.model_dump())
    with as_key(server, ENV_KEY) as c:
        job = enqueue(c, "any.queue")
        claimed = claim_one(c, "any.queue")
        assert (
            c.post(f"/jobs/{claimed['id']}/complete", json={"claim_token": claimed["claim_token"]}).status_code == 200
        )
        assert c.get(f"/jobs/{job['id']}").status_code == 200
    assert all(ENV_KEY not in r.getMessage() for r in caplog.records)


def test_a_short_environment_key_is_refused_without_showing_it(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from app.runtime.cli import _settings

    monkeypatch.setenv("JOBQ_API_KEY", "short-secret-value")
    with pytest.raises(SystemExit):
        _settings()
    err = capsys.readouterr().err
    assert "JOBQ_API_KEY" in err and "short-secret-value" not in err


# --- secrets never logged or echoed -------------------------------------------------------------------------


def test_tokens_keys_payloads_and_results_stay_out_of_logs_and_errors(
    server_factory, db: psycopg.Connection, caplog
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    server: LiveServer = server_factory(auth="on", max_payload_bytes=200)
    access = io.BytesIO()
    server.services.access_log.stream = access
    key = create_key(db, "k", ["produce", "consume"])
    marker = "SECRET-MARKER-7f3a"
    bodies: list[str] = []
    with as_key(server, key) as c:
        enqueue(c, "q", payload={"card": marker})
        claimed = claim_one(c, "q")
        token = claimed["claim_token"]
        bodies += [
            c.post("/queues/q/jobs", json={"payload": marker + "\u0000"}).text,
            c.post("/queues/q/jobs", json={"payload": marker * 20}).text,
            c.post("/queues/q/jobs", json={"payload": 1, "status": marker}).text,  # names the field, not the value
            c.post("/queues/q/jobs", json={"payload": 1, "idempotency_key": marker + "\n"}).text,
            c.post("/queues/q/claim", json={"worker": marker + "\t"}).text,
            c.post(f"/jobs/{claimed['id']}/complete", json={"claim_token": token + "!", "result": marker}).text,
            c.post(f"/jobs/{claimed['id']}/complete", json={"claim_token": "x" * 200}).text,
            c.post(f"/jobs/{claimed['id']}/complete", json={"claim_token": token[::-1], "result": marker}).text,
            c.post(f"/jobs/{claimed['id']}/fail", json={"claim_token": token, "error": marker, "retry": "no"}).text,
            c.post("/queues/q/jobs", content=b'{"payload": "' + marker.encode() + b'"', headers=JSON).text,
        ]
        assert (
            c.post(f"/jobs/{claimed['id']}/complete", json={"claim_token": token, "result": marker}).status_code == 200
        )
    with as_key(server, key + "x") as c:
        bodies.append(c.post("/queues/q/jobs", json={"payload": marker}).text)
    secret = parse_key(key)[1]  # type: ignore[index]
    for text in bodies:
        assert marker not in text and token not in text and secret not in text, text
    # The server's records (this test's own HTTP client logs what it sends, which proves nothing).
    server_side = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    assert server_side

    # The access line is written after the answer went out: the client can hold its 401 before the line exists.
    def logged_401() -> bool:
        server.services.access_log.flush()
        return b'"status":401' in access.getvalue()

    wait_until(logged_401, what="the 401's access line")
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in server_side) + access.getvalue().decode()
    for value in (marker, token, secret, key):
        assert value not in logged


def test_the_documented_401_and_403_are_what_the_service_answers(secured: LiveServer, db: psycopg.Connection) -> None:
    from app.main import published_document

    responses = published_document()["paths"]["/queues/{queue}/claim"]["post"]["responses"]
    fields = ("type", "title", "status", "detail")
    for code, name, key in (("401", "unauthorized", None), ("403", "forbidden", create_key(db, "p", ["produce"]))):
        documented = responses[code]["content"]["application/problem+json"]["examples"][name]["value"]
        got = as_key(secured, key).post("/queues/emails/claim", json={"worker": "w"}).json()
        assert {k: got[k] for k in fields} == {k: documented[k] for k in fields}
