"""Jobs stay safe through crashes. A real worker fleet (the Python SDK's Worker, in its own process) works
through a queue while the API is killed (-9) and PostgreSQL crashes under it, twice: once as
`pg_ctl stop -m immediate` would (SIGQUIT), once as a power cut would (SIGKILL, postmaster.pid left
behind). The service comes back on the same port and data directory each time. In the end every job is
completed with its own result, none is lost, none failed, and only jobs that were in flight at a crash
ran more than once (at-least-once delivery, with redelivery bounded by what was in flight)."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from app.runtime.embedded import free_port
from tests.processes import ServeProcess, embedded_url, postgres_pids, postmaster_pid
from tests.support import wait_until, whole_lines

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
JOBS = 400
CONCURRENCY = 8
CRASHES = 2
# Short leases and a quick sweeper, so that jobs whose worker lost its claim in a crash come back soon.
SERVE_ENV = {"JOBQ_SWEEP_INTERVAL_SECONDS": "0.5", "JOBQ_POLL_INTERVAL_SECONDS": "0.5"}
LEASE_SECONDS = 4


def _done_lines(log: Path) -> list[int]:
    return [int(line.split()[1]) for line in whole_lines(log) if line.startswith("done ")]


def test_every_job_completes_through_crashes_of_the_api_and_postgresql(pg_data_dir: Path, tmp_path: Path) -> None:
    port = free_port()

    def serve(n: int) -> ServeProcess:
        return ServeProcess(
            "--data-dir", str(pg_data_dir), port=port, env=SERVE_ENV, log=tmp_path / f"serve-{n}.log"
        ).wait_ready()

    srv = serve(0)
    work_log, worker_out = tmp_path / "work.log", tmp_path / "worker.out"
    with worker_out.open("wb") as out:  # a file, not a pipe: a full pipe would stall the worker's logging
        worker = subprocess.Popen(
            [
                sys.executable, str(ROOT / "tests" / "sdk_worker_main.py"), srv.url, "q", str(work_log),
                "--work", "0.02", "--concurrency", str(CONCURRENCY), "--lease", str(LEASE_SECONDS), "--grace", "30",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        ids: dict[int, int] = {}  # job id -> payload
        for start in range(0, JOBS, 100):
            r = srv.client.post(
                "/queues/q/jobs/batch",
                json={"jobs": [{"payload": n, "max_attempts": 25} for n in range(start, start + 100)]},
            )
            assert r.status_code == 201, r.text
            ids.update((j["id"], j["payload"]) for j in r.json()["jobs"])

        for crash in range(1, CRASHES + 1):
            # Crash mid-stream: some jobs done, many still to go, some in the worker's hands.
            target = JOBS * crash // (CRASHES + 1)
            wait_until(lambda t=target: len(set(_done_lines(work_log))) >= t, timeout=120, what=f"{target} jobs done")
            srv.kill()  # the API dies without any shutdown; its embedded PostgreSQL is orphaned
            srv.close()
            os.kill(postmaster_pid(pg_data_dir), signal.SIGQUIT if crash == 1 else signal.SIGKILL)
            wait_until(lambda: not postgres_pids(pg_data_dir), what="PostgreSQL gone")
            srv = serve(crash)  # crash recovery, then the same port: the worker finds it again by itself

        with psycopg.connect(embedded_url(pg_data_dir), autocommit=True) as db:

            def finished() -> bool:
                row = db.execute(
                    "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FROM jobq.jobs"
                ).fetchone()
                return row == (JOBS, JOBS)

            wait_until(finished, timeout=180, what="every job completed")
            rows = db.execute("SELECT id, status, attempts, result, payload FROM jobq.jobs").fetchall()
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        srv.close()
    assert worker.returncode == 0, worker_out.read_text(errors="replace")[-3000:]

    # Nothing lost, nothing failed, each job's own result.
    assert {r[0] for r in rows} == set(ids)
    assert all(status == "completed" for _, status, _, _, _ in rows)
    assert all(result == {"n": payload} == {"n": ids[job_id]} for job_id, _, _, result, payload in rows)
    # At least once: every job ran to its end in the worker; more than once only if in flight at a crash.
    runs = collections.Counter(_done_lines(work_log))
    assert set(runs) == set(ids)
    again = [job_id for job_id, n in runs.items() if n > 1]
    assert len(again) <= CRASHES * CONCURRENCY, again
    # An attempt is spent only by a claim that was lost in a crash.
    assert sum(attempts - 1 for _, _, attempts, _, _ in rows) <= CRASHES * CONCURRENCY * 2
    print(f"chaos: {len(again)} jobs ran twice, {sum(a - 1 for _, _, a, _, _ in rows)} extra attempts")
