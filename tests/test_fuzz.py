"""Schemathesis against the published contract: a real server on a real database, every check, positive
and negative data, with a fixed example budget so that the run stays short and repeatable."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import LiveServer

# Schemathesis over the HTTP contract (about 2 minutes): what it checks is the API's, not the major's.
# CI runs this file on its first major only (JOBQ_SKIP_ONE_MAJOR).
pytestmark = pytest.mark.one_major

ADMIN_KEY = "fuzz-admin-key-" + "f" * 32
# Examples per operation and phase; JOBQ_FUZZ_EXAMPLES raises it for a longer hunt.
EXAMPLES = int(os.environ.get("JOBQ_FUZZ_EXAMPLES", "100"))
SEED = os.environ.get("JOBQ_FUZZ_SEED", "20261129")
CONFIG = Path(__file__).parent / "schemathesis.toml"


@pytest.mark.slow
def test_schemathesis_finds_nothing(server_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Auth on, with an admin key that schemathesis sends: its ignored_auth check then verifies that the
    # same requests without it (or with a wrong one) are refused. Short long-polls and small batches keep
    # the run bounded; the contract the server publishes states these limits, so nothing is hidden.
    server: LiveServer = server_factory(
        auth="on", api_key=ADMIN_KEY, wait_max_seconds=1, max_batch_jobs=20, max_batch_complete=20, access_log=False
    )
    schema = tmp_path / "openapi.json"
    # The document as served: it states every rule the fuzzer needs, NUL in payloads included (JsonValue).
    schema.write_text(server.client.get("/openapi.json").text)
    command = [
        str(Path(sys.executable).parent / "st"), "--config-file", str(CONFIG), "run", str(schema), "--url", server.url,
        "--checks", "all",
        "--mode", "all",
        "--phases", "examples,coverage,fuzzing,stateful",
        "--max-examples", str(EXAMPLES),
        "--seed", SEED,
        "--header", f"Authorization: Bearer {ADMIN_KEY}",
        "--request-timeout", "10",
        "--generation-database", "none",
        "--no-color",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)
    elapsed = time.monotonic() - started
    report = done.stdout[-30_000:] + done.stderr[-5_000:]
    assert done.returncode == 0, f"schemathesis found problems ({elapsed:.0f}s):\n{report}"
    assert "No issues found" in done.stdout or " passed" in done.stdout, report
