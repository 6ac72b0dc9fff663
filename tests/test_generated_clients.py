"""Client generators work from the committed openapi/openapi.json: openapi-python-client and
openapi-typescript each make a client with every operation, the client type-checks (mypy --strict, tsc
--strict), and the README's API tour runs through it against a live service (tests/generated_clients/).

The generators are pinned and installed before the tests, never fetched by them: openapi-python-client as
a test extra (pyproject.toml), openapi-typescript, TypeScript 5 and openapi-fetch in
tests/generated_clients/package-lock.json (`npm ci`, which `make test` runs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.node import ROOT, require_npm_packages, run
from tests.support import LiveServer

# Clients generated from the contract, over HTTP: nothing here depends on the major.
# CI runs this file on its first major only (JOBQ_SKIP_ONE_MAJOR).
pytestmark = pytest.mark.one_major

HERE = ROOT / "tests" / "generated_clients"
SPEC = ROOT / "openapi" / "openapi.json"
KEY = "generated-client-key-" + "k" * 32
BIN = Path(sys.executable).parent


def operation_ids() -> set[str]:
    doc = json.loads(SPEC.read_text())
    return {op["operationId"] for ops in doc["paths"].values() for op in ops.values()}


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@pytest.fixture
def keyed_server(server_factory) -> LiveServer:  # type: ignore[no-untyped-def]
    # Keys on: the generated clients send the bearer key the document's security scheme names.
    return server_factory(auth="on", api_key=KEY)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_openapi_python_client_runs_the_tour(keyed_server: LiveServer, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # its ruff post-hook
    package = tmp_path / "jobq_generated"
    command = [str(BIN / "openapi-python-client"), "generate", "--path", str(SPEC), "--meta", "none"]
    output = run([*command, "--config", str(HERE / "config.yaml"), "--output-path", str(package)], tmp_path, env=env)
    # It drops what it cannot read (schemas, whole operations) with a warning, and still exits 0.
    assert "Unable to" not in output and "Warning" not in output, output
    modules = {p.stem for p in package.glob("api/*/*.py")} - {"__init__"}
    assert modules == {snake(op) for op in operation_ids()}
    for name in ("tour.py", "mypy.ini"):
        shutil.copy(HERE / name, tmp_path / name)
    run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "jobq_generated", "tour.py"], tmp_path)
    assert "tour ok" in run([sys.executable, "tour.py", keyed_server.url, KEY], tmp_path, timeout=60)


@pytest.mark.slow
def test_openapi_typescript_runs_the_tour(keyed_server: LiveServer, tmp_path: Path) -> None:
    modules = require_npm_packages(HERE)
    bin_ = modules / ".bin"
    (tmp_path / "node_modules").symlink_to(modules)
    output = run([str(bin_ / "openapi-typescript"), str(SPEC), "--output", "jobq.ts"], tmp_path)
    assert "warn" not in output.lower(), output
    types = (tmp_path / "jobq.ts").read_text()
    operations = types[types.index("export interface operations {") :]
    assert {op for op in operation_ids() if f"\n    {op}: {{" not in operations} == set()
    for name in ("tour.ts", "tsconfig.json", "package.json"):  # package.json: ES modules
        shutil.copy(HERE / name, tmp_path / name)
    run([str(bin_ / "tsc"), "-p", "."], tmp_path)  # strict
    assert "tour ok" in run(["node", "out/tour.js", keyed_server.url, KEY], tmp_path, timeout=60)
