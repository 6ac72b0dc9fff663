"""The example workers in other languages (examples/: Node.js on the TypeScript SDK, and bash + curl) claim,
heartbeat, complete and fail jobs of a live service; the final states are read from the database."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.node import typescript_sdk
from tests.support import LiveServer, wait_until
from tests.test_security import as_key, create_key

# The example workers over HTTP: nothing here depends on the major.
# CI runs this file on its first major only (JOBQ_SKIP_ONE_MAJOR).
pytestmark = pytest.mark.one_major

EXAMPLES = Path(__file__).parent.parent / "examples"


def final_states(db: psycopg.Connection) -> dict[str, tuple[str, int, Any, str | None]]:
    """name -> (status, attempts, result, last_error), by the `name` in each job's payload."""
    rows = db.execute("SELECT payload->>'name', status, attempts, result, last_error FROM jobq.jobs").fetchall()
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}


# The workers heartbeat every third of the lease. The shell worker's beat is a sleep, then curl and a JSON
# tool in processes of their own: on a loaded 2-core machine a 2 s lease left little more than a second for
# those, and the sweeper (every 0.1 s) takes a lapsed lease back at once.
LEASE_SECONDS = 4
SLOW_SECONDS = 10  # 2.5 leases


def run_worker(server: LiveServer, command: list[str], extra_env: dict[str, str]) -> str:
    env = {
        **os.environ,
        "JOBQ_URL": server.url,
        "JOBQ_WORKER": "example",
        "JOBQ_LEASE_SECONDS": str(LEASE_SECONDS),
        "JOBQ_WAIT_SECONDS": "1",
        "JOBQ_EXIT_WHEN_IDLE": "1",
        **extra_env,
    }
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


@pytest.fixture
def sweeping_server(server_factory) -> LiveServer:  # type: ignore[no-untyped-def]
    # A lease left to lapse is taken back within 0.1 s, so only heartbeats keep a slow job; short
    # backoff and fallback poll, so a retried job comes back at once.
    return server_factory(  # type: ignore[no-any-return]
        sweep_interval_seconds=0.1, backoff_base_seconds=0.01, backoff_cap_seconds=0.05, poll_interval_seconds=0.05
    )


def test_node_worker(sweeping_server: LiveServer, db: psycopg.Connection) -> None:
    typescript_sdk()  # the example runs on it (skips without Node.js 20 and the SDK's npm packages)
    server = sweeping_server
    server.enqueue(payload={"name": "ok", "n": 1})
    server.enqueue(payload={"name": "slow", "sleep_seconds": SLOW_SECONDS})  # 2.5 leases, kept by heartbeats
    server.enqueue(payload={"name": "flaky", "fail": "upstream 503", "fail_attempts": 1, "retry_in_seconds": 0})
    server.enqueue(payload={"name": "broken", "fail": "bad input", "retry": False}, max_attempts=5)
    server.enqueue(payload={"name": "doomed", "fail": "always"}, max_attempts=2)
    output = run_worker(server, ["node", str(EXAMPLES / "node-worker.mjs"), "q"], {"JOBQ_CONCURRENCY": "3"})
    states = final_states(db)
    assert states["ok"][:3] == ("completed", 1, {"handled_by": "example", "attempt": 1, "echo": {"name": "ok", "n": 1}})
    assert states["slow"][:2] == ("completed", 1), output
    assert states["flaky"][:2] == ("completed", 2)
    assert states["broken"] == ("failed", 1, None, "PermanentFailure: bad input")
    assert states["doomed"] == ("failed", 2, None, "Error: always")


# The command the shell worker runs per job: the payload says what to do.
JOB_COMMAND = r"""
import json, os, sys, time
p = json.load(sys.stdin)
time.sleep(p.get("sleep", 0))
if p.get("fail") and int(os.environ["JOBQ_ATTEMPT"]) <= p.get("fail_attempts", 99):
    print(p["fail"], file=sys.stderr)
    sys.exit(p.get("exit", 1))
if p.get("text"):
    print("plain text")
elif p.get("echo"):
    print(json.dumps(p["echo"]))
else:
    print(json.dumps({"job": int(os.environ["JOBQ_JOB_ID"]), "attempt": int(os.environ["JOBQ_ATTEMPT"])}))
"""


@pytest.mark.parametrize("json_tool", ["python3", "jq"])
def test_shell_worker(sweeping_server: LiveServer, db: psycopg.Connection, json_tool: str) -> None:
    if shutil.which(json_tool) is None:
        pytest.skip(f"{json_tool} is not installed")
    for tool in ("bash", "curl"):
        assert shutil.which(tool), f"the shell worker needs {tool}"
    server = sweeping_server
    ok = server.enqueue(payload={"name": "ok"})
    server.enqueue(payload={"name": "text", "text": True})
    server.enqueue(payload={"name": "slow", "sleep": SLOW_SECONDS})  # 2.5 leases, kept by heartbeats
    server.enqueue(payload={"name": "flaky", "fail": "try again", "fail_attempts": 1})
    server.enqueue(payload={"name": "broken", "fail": "bad input", "exit": 65}, max_attempts=5)
    server.enqueue(payload={"name": "doomed", "fail": "always"}, max_attempts=2)
    command = ["bash", str(EXAMPLES / "shell-worker.sh"), "q", sys.executable, "-c", JOB_COMMAND]
    output = run_worker(server, command, {"JOBQ_JSON": json_tool})
    assert f"JSON by {json_tool}" in output
    states = final_states(db)
    assert states["ok"][:3] == ("completed", 1, {"job": ok["id"], "attempt": 1})
    assert states["text"][:3] == ("completed", 1, "plain text\n")
    assert states["slow"][:2] == ("completed", 1), output
    assert states["flaky"][:2] == ("completed", 2)
    assert states["broken"] == ("failed", 1, None, "exit 65: bad input")
    assert states["doomed"] == ("failed", 2, None, "exit 1: always")
    # One request per job: every result rode on the next claim; none needed a complete of its own.
    assert output.count("complete (on the claim) -> completed") == 4, output
    assert [line for line in output.splitlines() if "complete -> " in line and "on the claim" not in line] == []


# Every program the shell worker runs, each replaced by a shim that notes its command line and runs it.
SHELL_WORKER_TOOLS = ("awk", "cat", "curl", "date", "grep", "hostname", "jq", "mktemp", "python3", "rm", "sleep",
                      "tail", "touch", "tr")  # fmt: skip


@pytest.mark.parametrize("json_tool", ["python3", "jq"])
def test_the_shell_worker_puts_no_secret_on_a_command_line(
    server_factory: Any, db: psycopg.Connection, json_tool: str, tmp_path: Path
) -> None:
    """`ps` shows every process's command line to every user of the machine. The shell worker put its API key
    (curl's -H), claim tokens, results and errors (curl's --data-binary, jq's --arg, python3's argv) there.
    Each program it runs is a shim here that writes down its command line: none holds the key, a token (any
    run of 40 or more token characters), a payload, a result or an error."""
    if shutil.which(json_tool) is None:
        pytest.skip(f"{json_tool} is not installed")
    admin = "shell-worker-admin-" + "a" * 32
    server: LiveServer = server_factory(
        auth="on", api_key=admin, sweep_interval_seconds=0.1, backoff_base_seconds=0.01, backoff_cap_seconds=0.05
    )
    key = create_key(db, "shell-worker", ["consume"], ["q"])
    producer = as_key(server, admin)
    secret = "do-not-show-9c41"
    jobs = [
        {"payload": {"name": "ok", "echo": f"result {secret}"}},
        {"payload": {"name": "slow", "sleep": 2, "echo": "slow"}},  # heartbeats: a third of a 4 s lease
        {"payload": {"name": "doomed", "fail": f"error {secret}"}, "max_attempts": 1},
        {"payload": {"name": "secret", "text": True, "note": secret}},
    ]
    for job in jobs:
        assert producer.post("/queues/q/jobs", json=job).status_code == 201
    shims, log = tmp_path / "bin", tmp_path / "argv.log"
    shims.mkdir()
    for tool in SHELL_WORKER_TOOLS:
        real = shutil.which(tool)
        if real is None:
            pytest.skip(f"{tool} is not installed")
        shim = shims / tool
        # The program runs with the usual PATH (a pyenv shim is itself a script); the worker sees the shims only.
        note = 'printf "%s\\0" "$0" "$@" >>"$ARGV_LOG"; printf "\\n" >>"$ARGV_LOG"'
        shim.write_text(f'#!/bin/bash\n{note}\nPATH="$REAL_PATH" exec {real} "$@"\n')
        shim.chmod(0o755)
    command = ["/bin/bash", str(EXAMPLES / "shell-worker.sh"), "q", sys.executable, "-c", JOB_COMMAND]
    env = {"JOBQ_JSON": json_tool, "JOBQ_API_KEY": key, "PATH": str(shims), "ARGV_LOG": str(log)}
    env["REAL_PATH"] = os.environ.get("PATH", "")
    output = run_worker(server, command, env)
    states = final_states(db)
    assert states["ok"][:3] == ("completed", 1, f"result {secret}"), output
    assert states["slow"][:2] == ("completed", 1), output
    assert states["doomed"][::3] == ("failed", f"exit 1: error {secret}"), output
    lines = [line.rstrip("\0").split("\0") for line in log.read_text().split("\0\n") if line]
    assert {Path(line[0]).name for line in lines} >= {"curl", json_tool}, lines  # the shims saw the work
    assert "heartbeat" in " ".join(" ".join(line) for line in lines)  # and a heartbeat among it
    for line in lines:
        text = " ".join(line)
        assert key not in text and secret not in text, text
        assert not re.search(r"[A-Za-z0-9_-]{40,}", text), text


@pytest.mark.parametrize("language", ["node", "shell"])
def test_sigterm_finishes_the_job_in_hand(server: LiveServer, language: str) -> None:
    if language == "node":
        typescript_sdk()
    job = server.enqueue(payload={"name": "in hand", "sleep": 2, "sleep_seconds": 2})
    later = server.enqueue(payload={"name": "later"})
    command = (
        ["node", str(EXAMPLES / "node-worker.mjs"), "q"]
        if language == "node"
        else ["bash", str(EXAMPLES / "shell-worker.sh"), "q", sys.executable, "-c", JOB_COMMAND]
    )
    env = {
        **os.environ,
        "JOBQ_URL": server.url,
        "JOBQ_JSON": "python3",
        "JOBQ_WAIT_SECONDS": "5",
        "JOBQ_CONCURRENCY": "1",
    }
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        # The job is in hand once the worker says so. (Its status turns `running` in the database before the
        # claim's answer reaches the worker; a signal in that gap interrupts the claim, and the job is then
        # the lease's to take back, not this test's subject.)
        wait_until(lambda: any(f"job {job['id']}: attempt" in line for line in lines), what="the job in hand")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        proc.stdout.close()
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert server.job(job["id"])["status"] == "completed", out
    assert (server.job(later["id"])["status"], server.job(later["id"])["attempts"]) == ("pending", 0), out
