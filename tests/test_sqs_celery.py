"""Celery through jobq: a worker on kombu's SQS transport (boto3 to send, pycurl to long-poll ReceiveMessage)
runs tasks sent to jobq's SQS endpoint, with keys on, every request signed with a key's pair. The tasks are jobs
on the dashboard: sent, received, completed when the worker acknowledges them (tests/sqs_celery_app.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from app.auth.keys import new_key, sqs_access_key_id, sqs_secret
from app.db import keys as store_keys
from tests.support import LiveServer, wait_until

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("app.sqs") is None, reason="no SQS endpoint in this build"),
    pytest.mark.slow,
]
pytest.importorskip("celery")
pytest.importorskip("pycurl")  # kombu's SQS transport receives through it

ROOT = Path(__file__).parent.parent
SERVER_SECRET = "sqs-server-secret-" + "c" * 30


@pytest.fixture
def celery_env(server_factory, db: psycopg.Connection, tmp_path: Path) -> Iterator[tuple[LiveServer, dict[str, str]]]:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(auth="on", sqs_server_secret=SERVER_SECRET)
    key, selector, key_hash = new_key()
    key_id = store_keys.api_key_insert(db, "celery", selector, key_hash, ["admin"], ["celery-*"])
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JOBQ_URL": server.url,
        "AWS_ACCESS_KEY_ID": sqs_access_key_id(selector),
        "AWS_SECRET_ACCESS_KEY": sqs_secret(SERVER_SECRET, selector, key_id),
        "CELERY_RESULTS": str(tmp_path),
        "JOBQ_KEY": key,  # the same key as a bearer token, for the test's own look at the queue
    }
    yield server, env


def test_a_celery_worker_runs_tasks_through_jobq(celery_env: tuple[LiveServer, dict[str, str]], tmp_path: Path) -> None:
    server, env = celery_env
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.sqs_celery_app", "worker", "--pool", "solo",
         "--loglevel", "INFO", "--without-mingle", "--without-gossip", "--without-heartbeat"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # The producer: the same app, in a process of its own (as a web application would send).
        send = (
            "from tests.sqs_celery_app import add, flaky\n"
            "for i in range(5): add.delay(i, 10, f'add-{i}')\n"
            "flaky.delay('flaky')\n"
        )
        subprocess.run([sys.executable, "-c", send], cwd=ROOT, env=env, check=True, timeout=120)
        expected = {f"add-{i}": str(i + 10) for i in range(5)} | {"flaky": "retries=1"}

        def done() -> bool:
            assert worker.poll() is None, worker.stdout.read() if worker.stdout else "the worker exited"
            return {p.name for p in tmp_path.iterdir()} >= set(expected)

        wait_until(done, timeout=90, what="every task run by the worker")
        assert {name: (tmp_path / name).read_text() for name in expected} == expected

        # Each task a job in jobq's queue: completed once the worker acknowledged it (the retry is a job of its
        # own, and the first run's message, acknowledged too, another).
        def all_completed() -> bool:
            r = httpx.get(
                f"{server.url}/queues/celery-jobs/stats", headers={"authorization": f"Bearer {env['JOBQ_KEY']}"}
            )
            counts = r.json()["counts"]
            return counts["completed"] == 7 and counts["pending"] == 0 and counts["running"] == 0

        wait_until(all_completed, timeout=30, what="every task's job completed")
    finally:
        worker.terminate()
        try:
            output, _ = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            output, _ = worker.communicate()
    assert "Traceback" not in output.replace("Retry in 1s", ""), output[-5000:]
