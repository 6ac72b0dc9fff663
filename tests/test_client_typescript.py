"""The TypeScript SDK (clients/typescript, `@jobq/client`): its types are the committed contract, it builds
into a publishable package, and its test suite (node:test) passes against a live service: the client's
calls and typed errors, its retries, and the Worker (each job exactly once, heartbeats, stop releasing a
running job, cancel learned from a heartbeat, results riding on the next claim or completed by themselves)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from tests.node import TYPESCRIPT_SDK, require_npm_packages, run, typescript_sdk
from tests.support import LiveServer

SPEC = TYPESCRIPT_SDK.parent.parent / "openapi" / "openapi.json"


def test_its_types_are_generated_from_the_committed_openapi(tmp_path: Path) -> None:
    """src/openapi.ts is openapi-typescript's output for openapi/openapi.json: regenerate it (`npm run
    generate` in clients/typescript, or `make openapi`) whenever the contract changes."""
    modules = require_npm_packages(TYPESCRIPT_SDK)
    run([str(modules / ".bin" / "openapi-typescript"), str(SPEC), "--output", str(tmp_path / "openapi.ts")], tmp_path)
    committed = (TYPESCRIPT_SDK / "src" / "openapi.ts").read_text()
    assert (tmp_path / "openapi.ts").read_text() == committed, "run `make openapi` and commit clients/typescript"


def test_the_package_is_ready_to_publish() -> None:
    sdk = typescript_sdk()
    manifest = json.loads((sdk / "package.json").read_text())
    assert manifest["name"] == "@jobq/client" and re.fullmatch(r"\d+\.\d+\.\d+", manifest["version"])
    assert manifest["engines"]["node"] == ">=20" and not manifest.get("dependencies")
    packed = json.loads(run(["npm", "pack", "--dry-run", "--json", "--ignore-scripts"], sdk))[0]
    files = {f["path"] for f in packed["files"]}
    assert {"package.json", "README.md", "dist/index.js", "dist/index.d.ts", "dist/worker.js"} <= files
    assert manifest["exports"]["."]["types"].removeprefix("./") in files
    assert not any(f.startswith(("src/", "test/")) for f in files), files


@pytest.fixture
def quick_server(server_factory) -> LiveServer:  # type: ignore[no-untyped-def]
    # Lapsed leases come back within 0.1 s, so only heartbeats keep a slow job; short backoff and poll.
    return server_factory(  # type: ignore[no-any-return]
        sweep_interval_seconds=0.1,
        backoff_base_seconds=0.01,
        backoff_cap_seconds=0.05,
        poll_interval_seconds=0.05,
        access_log=False,
    )


def as_url(conninfo: str) -> str:
    """A postgresql:// URL for node-postgres, which reads no key=value connection string."""
    info = psycopg.conninfo.conninfo_to_dict(conninfo)
    user = quote(str(info.get("user", "postgres")), safe="")
    password = f":{quote(str(info['password']), safe='')}" if info.get("password") else ""
    host, port = info.get("host", "127.0.0.1"), info.get("port", 5432)
    return f"postgresql://{user}{password}@{host}:{port}/{quote(str(info['dbname']), safe='')}"


@pytest.mark.slow
def test_the_sdk_suite_passes_against_a_live_server(quick_server: LiveServer) -> None:
    sdk = typescript_sdk()
    env = {
        **os.environ,
        "JOBQ_URL": quick_server.url,
        "JOBQ_DATABASE_URL": as_url(str(quick_server.settings.database_url)),
    }
    output = run(["node", "--test", "--test-reporter=tap", "test/"], sdk, timeout=300, env=env)
    assert re.search(r"^# fail 0$", output, re.M) and re.search(r"^# pass [1-9]", output, re.M), output
