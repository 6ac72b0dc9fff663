"""Rolling upgrades (docs/deployment.md#rolling-upgrades): a migration never makes enqueues and claims wait
long for a lock (a statement gives way to a long transaction and tries again), a million jobs at the
previous release's schema are migrated to this one while enqueues and claims run, the previous release
keeps working on the migrated schema beside this one, and this one on an older schema says so."""

from __future__ import annotations

import io
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest

from app.db.migrate import MigrationError, load_migrations, migrate, migrations_dir, move_into_schema
from tests.conftest import make_settings
from tests.migration_safety import LAST_RELEASED
from tests.processes import ServeProcess
from tests.support import LiveServer, problem, report, wait_until

ROOT = Path(__file__).parent.parent
# The previous release, whose processes keep serving while the database is migrated and replicas replaced
# (CHANGELOG.md). Move both on at each release.
PREVIOUS_VERSION, PREVIOUS_COMMIT = "1.1.0", "ff9830a"


def migrations_up_to(directory: Path, last: int, extra: dict[str, str] | None = None) -> Path:
    """A copy of the shipped migrations numbered up to `last`, plus `extra` files (name -> SQL)."""
    directory.mkdir()
    for m in load_migrations():
        if m.version <= last:
            shutil.copy(migrations_dir() / m.name, directory / m.name)
    for name, sql in (extra or {}).items():
        (directory / name).write_text(sql)
    return directory


@pytest.fixture
def long_transaction(database_url: str) -> Iterator[psycopg.Connection]:
    """A transaction that has read jobs and stays open: it holds a lock no ALTER TABLE jobq.jobs can take."""
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT count(*) FROM jobq.jobs")
        yield conn
        conn.rollback()


def test_a_migration_behind_a_long_transaction_lets_enqueues_through(
    database_url: str, long_transaction: psycopg.Connection, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a lock timeout, the ALTER would wait behind the transaction, and every enqueue and claim behind
    the ALTER, until the transaction ended."""
    caplog.set_level(logging.WARNING, "jobq.migrate")
    latest = max(m.version for m in load_migrations())
    directory = migrations_up_to(tmp_path / "m", latest, {"9999_probe.sql": "ALTER TABLE jobs ADD COLUMN probe int;"})
    applied: list[list[str]] = []
    migrating = threading.Thread(target=lambda: applied.append(migrate(database_url, directory, lock_timeout_ms=100)))
    migrating.start()
    try:
        wait_until(lambda: "a lock was not free" in caplog.text, what="the migration to give way")
        assert f"pid {long_transaction.info.backend_pid} in a transaction" in caplog.text  # who holds it
        enqueued = threading.Event()

        def enqueue() -> None:
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute("INSERT INTO jobq.jobs (queue_name, payload) VALUES ('q', '1')")
            enqueued.set()

        threading.Thread(target=enqueue, daemon=True).start()
        wait_until(enqueued.is_set, what="an enqueue while the migration waits for its lock")
        assert migrating.is_alive()  # still trying: the transaction has not ended
    finally:
        long_transaction.rollback()
        migrating.join(60)
    assert applied == [["9999_probe.sql"]]
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(probe) FROM jobq.jobs").fetchone() == (0,)


def test_a_migration_that_cannot_take_its_lock_gives_up_and_names_the_holder(
    database_url: str, long_transaction: psycopg.Connection, tmp_path: Path
) -> None:
    latest = max(m.version for m in load_migrations())
    directory = migrations_up_to(tmp_path / "m", latest, {"9999_probe.sql": "ALTER TABLE jobs ADD COLUMN probe int;"})
    with pytest.raises(MigrationError) as refused:
        migrate(database_url, directory, lock_timeout_ms=50, lock_wait_seconds=0.5)
    message = str(refused.value)
    assert "9999_probe.sql" in message and "JOBQ_MIGRATION_LOCK_WAIT_SECONDS" in message, message
    assert f"pid {long_transaction.info.backend_pid}" in message and "nothing of this file was applied" in message
    long_transaction.rollback()
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT to_regclass('jobq.jobq_migrations') IS NOT NULL").fetchone() == (True,)
        assert conn.execute("SELECT count(*) FROM jobq.jobq_migrations WHERE version = 9999").fetchone() == (0,)
        column = "SELECT count(*) FROM information_schema.columns WHERE table_name = 'jobs' AND column_name = 'probe'"
        assert conn.execute(column).fetchone() == (0,)


# -- a million jobs -------------------------------------------------------------------------------------------


@dataclass
class Load:
    """Enqueues and claims in two threads, as the previous release's statements do them, each timed."""

    url: str
    ops: list[tuple[str, float, float]] = field(default_factory=list)  # (kind, start, end)
    errors: list[str] = field(default_factory=list)
    enqueued: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    # The previous release's tables are in schema public (its statements name no schema).
    ENQUEUE = "INSERT INTO public.jobs (queue_name, payload) VALUES ('load', '{}') RETURNING id"
    CLAIM = """
        UPDATE public.jobs SET status = 'running', attempts = attempts + 1, claimed_at = now(), claim_token = 't',
               locked_by = 'load', lease_seconds = 30, lease_expires_at = now() + interval '30 seconds'
        WHERE id = (SELECT id FROM public.jobs WHERE queue_name = 'load' AND status = 'pending'
                    ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING id"""

    def run(self, kind: str) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                start = time.monotonic()
                try:
                    row = conn.execute(self.ENQUEUE if kind == "enqueue" else self.CLAIM).fetchone()
                except psycopg.Error as exc:
                    self.errors.append(f"{kind}: {exc}")
                    return
                self.ops.append((kind, start, time.monotonic()))
                if kind == "enqueue" and row:
                    self.enqueued.append(row[0])
                time.sleep(0.002)

    def longest_stall(self, since: float, until: float) -> float:
        """The longest an operation running during [since, until] took."""
        return max((end - start for _, start, end in self.ops if end >= since and start <= until), default=0.0)


@pytest.mark.slow  # a million jobs written, then migrated under load: about a minute
@pytest.mark.one_major  # what a migration locks is the same on every major: CI runs it once
def test_a_million_jobs_at_the_previous_schema_migrate_under_load(empty_database_url: str, tmp_path: Path) -> None:
    url = empty_database_url
    migrate(url, migrations_up_to(tmp_path / "previous", LAST_RELEASED), schema="public")  # as it made them
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO public.jobs (queue_name, payload, status, attempts, claimed_at, claim_token, finished_at,
                                 result, run_at)
               SELECT 'q' || (i % 20), jsonb_build_object('n', i), 'completed', 1, now(), 't', now(), '1', now()
               FROM generate_series(1, 1000000) i"""
        )
        conn.execute("INSERT INTO public.jobs (queue_name, payload) SELECT 'load', '{}' FROM generate_series(1, 5000)")
        conn.execute("VACUUM ANALYZE public.jobs")
    # What waits for the move into a schema of its own is not applied while the tables are in public.
    pending = [m.name for m in load_migrations() if m.version > LAST_RELEASED and not m.own_schema]

    load = Load(url)
    threads = [threading.Thread(target=load.run, args=(kind,)) for kind in ("enqueue", "claim", "claim")]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(load.ops) >= 50, what="the load to run")
        since = time.monotonic()
        applied = migrate(url)
        until = time.monotonic()
        wait_until(lambda: sum(start > until for _, start, _ in load.ops) >= 50, what="the load after the migration")
    finally:
        load.stop.set()
        for t in threads:
            t.join(60)
    assert not load.errors, load.errors
    assert applied == pending
    during = [op for op in load.ops if op[2] >= since and op[1] <= until]
    stall = load.longest_stall(since, until)
    report(
        f"migrating 1,000,000 jobs from {PREVIOUS_VERSION} ({len(pending)} migration(s): "
        f"{', '.join(pending) or 'none pending'}) took {until - since:.2f}s under load; "
        f"{len(during)} enqueues and claims ran meanwhile, the longest took {stall:.3f}s"
    )
    if pending:
        assert {kind for kind, _, _ in during} == {"enqueue", "claim"}  # both went on while it ran
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute("SELECT count(*) FROM public.jobs WHERE id = ANY(%s)", (load.enqueued,)).fetchone()
        assert found == (len(load.enqueued),)  # every acknowledged enqueue is there
        versions = {r[0] for r in conn.execute("SELECT version FROM public.jobq_migrations")}
        assert versions == {m.version for m in load_migrations() if not m.own_schema}
    # Then, the previous release's processes gone, the move into schema jobq (catalogue changes only).
    started = time.monotonic()
    moved = move_into_schema(url)
    report(f"moving the tables of 1,000,000 jobs from public into schema jobq took {time.monotonic() - started:.2f}s")
    assert "jobs" in moved
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) >= 1000000 FROM jobq.jobs").fetchone() == (True,)
        versions = {r[0] for r in conn.execute("SELECT version FROM jobq.jobq_migrations")}
        assert versions == {m.version for m in load_migrations()}


# -- the previous release, this one, and the schema between them ---------------------------------------------


def previous_release(into: Path) -> Path:
    """The previous release's source tree, from git history (CI's clone has it: JOBQ_REQUIRE_PREVIOUS_RELEASE)."""
    git = shutil.which("git")
    found = git and subprocess.run(
        [git, "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS_COMMIT}^{{commit}}"], capture_output=True
    )
    if not git or not found or found.returncode != 0:
        why = f"release {PREVIOUS_VERSION} (commit {PREVIOUS_COMMIT}) is not in this clone's history (a shallow clone?)"
        if os.environ.get("JOBQ_REQUIRE_PREVIOUS_RELEASE"):
            pytest.fail(f"JOBQ_REQUIRE_PREVIOUS_RELEASE is set but {why}")
        pytest.skip(why)
    tree = subprocess.run(
        [git, "-C", str(ROOT), "archive", "--format=tar", PREVIOUS_COMMIT, "app", "migrations"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tree)) as archive:
        archive.extractall(into, filter="data")
    return into


def serve_previous(source: Path, url: str, log: Path) -> ServeProcess:
    """The previous release's `jobq serve`, run by this environment's Python from its own source tree."""
    command = [sys.executable, "-c", "import sys; from app.runtime.cli import main; sys.exit(main())"]
    env = {"JOBQ_DATABASE_URL": url, "PYTHONPATH": str(source)}
    return ServeProcess("--no-migrate", log=log, env=env, command=command, cwd=str(source))


def work(through: httpx.Client, then: httpx.Client, queue: str) -> None:
    """Enqueue through one process, claim and complete through the other."""
    r = through.post(f"/queues/{queue}/jobs", json={"payload": {"n": 1}, "idempotency_key": f"{queue}-1"})
    assert r.status_code == 201, r.text
    claimed = then.post(f"/queues/{queue}/claim", json={"worker": "w"}).json()["jobs"]
    assert [c["id"] for c in claimed] == [r.json()["id"]], claimed
    done = then.post(f"/jobs/{claimed[0]['id']}/complete", json={"claim_token": claimed[0]["claim_token"], "result": 2})
    assert done.status_code == 200 and done.json()["status"] == "completed", done.text
    assert through.get(f"/jobs/{claimed[0]['id']}").json()["result"] == 2


def enqueue(through: httpx.Client, queue: str, **fields: object) -> int:
    r = through.post(f"/queues/{queue}/jobs", json={"payload": {"n": 1}, **fields})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def finish(through: httpx.Client, queue: str, job_id: int, how: str) -> None:
    """Claim `job_id` (the only claimable job of `queue`) through one process and complete or fail it for good."""
    claimed = through.post(f"/queues/{queue}/claim", json={"worker": "w"}).json()["jobs"]
    assert [c["id"] for c in claimed] == [job_id], claimed
    body = {"claim_token": claimed[0]["claim_token"], **({"result": 1} if how == "complete" else {"error": "boom"})}
    r = through.post(f"/jobs/{job_id}/{how}", json=body)
    assert r.status_code == 200 and r.json()["status"] == ("completed" if how == "complete" else "failed"), r.text


def dependencies_across(old: httpx.Client, new: httpx.Client, queue: str) -> None:
    """Parents finished by one release, dependants enqueued by either: every dependant is released (or
    cancelled, its parent failed). The previous release finishes a parent without the outbox this one reads
    (its triggers are gone): this release's reconciliation finds it, within JOBQ_DEPENDENCY_RECONCILE_SECONDS."""
    cases = [  # (who enqueues, who finishes the parent, how, the dependant's status after)
        (old, old, "complete", "pending"),
        (old, old, "fail", "cancelled"),
        (new, old, "complete", "pending"),
        (new, old, "fail", "cancelled"),
        (old, new, "complete", "pending"),
        (old, new, "fail", "cancelled"),
    ]
    children: list[tuple[int, int, str]] = []
    for n, (enqueuer, finisher, how, after) in enumerate(cases):
        parent = enqueue(enqueuer, f"{queue}-p{n}", max_attempts=1)
        child = enqueue(enqueuer, f"{queue}-c{n}", depends_on=[parent])
        assert new.get(f"/jobs/{child}").json()["status"] == "waiting"
        finish(finisher, f"{queue}-p{n}", parent, how)
        children.append((child, parent, after))

    def released() -> bool:
        return all(new.get(f"/jobs/{child}").json()["status"] == after for child, _, after in children)

    wait_until(released, timeout=60, what="every dependant released or cancelled")
    for child, parent, after in children:
        job = old.get(f"/jobs/{child}").json()  # the previous release reads them as this one does
        assert job["status"] == after, job
        if after == "cancelled":
            assert job["last_error"] == f"dependency {parent} failed", job
    # A released dependant runs, through either release.
    for n, (child, _, after) in enumerate(children):
        if after == "pending":
            finish(old if n % 2 else new, f"{queue}-c{n}", child, "complete")


@pytest.mark.slow  # the previous release started from git history: about 10 s
def test_the_previous_release_keeps_working_beside_this_one_on_the_migrated_schema(
    server_factory: Callable[..., LiveServer], empty_database_url: str, tmp_path: Path
) -> None:
    """Replicas replaced one by one: the database made by the previous release (its tables in schema public)
    and migrated by this one (in place: it does not move them while the previous release serves), processes of
    both serving it. Then, the previous release gone, the tables are moved into schema jobq under this
    release's process, which finds them there."""
    url = empty_database_url
    migrate(url, migrations_up_to(tmp_path / "made", LAST_RELEASED), schema="public")  # as the previous release did
    assert migrate(url)  # this release's migrations, applied where the tables are
    server = server_factory(database=url, dependency_reconcile_seconds=1)
    source = previous_release(tmp_path / "previous")
    old = serve_previous(source, url, tmp_path / "previous.log")
    try:
        old.wait_ready()
        assert "replication" not in old.client.get("/readyz").json()  # really the previous release's code
        assert old.client.get("/healthz").json()["version"] == PREVIOUS_VERSION
        work(old.client, old.client, "old")
        work(old.client, server.client, "old-to-new")
        work(server.client, old.client, "new-to-old")
        dependencies_across(old.client, server.client, "deps")
    finally:
        old.close()
    pending = enqueue(server.client, "moving")
    moved = move_into_schema(url)
    assert {"jobs", "jobq_migrations", "api_keys", "queue_state"} <= set(moved), moved
    with psycopg.connect(url) as conn:
        where = "SELECT to_regclass('public.jobs') IS NULL, to_regclass('jobq.jobs') IS NOT NULL"
        assert conn.execute(where).fetchone() == (True, True)
    # The process found the tables in public at start: its next statement names the old place, is answered 503
    # (retryable, as in a failover), and it names the new place from then on.
    first = server.client.get(f"/jobs/{pending}")
    assert first.status_code in (200, 503), first.text
    assert server.client.get(f"/jobs/{pending}").json()["status"] == "pending"  # the job moved with its table
    work(server.client, server.client, "after-move")
    assert move_into_schema(url) == []  # done once
    assert migrate(url) == []


def test_this_release_on_an_older_schema_says_so_and_is_not_ready(
    empty_database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shipped = load_migrations()
    migrate(empty_database_url, migrations_up_to(tmp_path / "older", shipped[-2].version))
    caplog.set_level(logging.ERROR, "jobq")
    server = LiveServer(make_settings(empty_database_url, migrate_on_start=False)).start()
    try:
        body = problem(server.client.get("/readyz"), 503, "not-ready")
        assert shipped[-1].name in body["detail"] and "jobq migrate" in body["detail"], body
        assert f"schema is older than this jobq: 1 migration(s) not applied ({shipped[-1].name})" in caplog.text
    finally:
        server.stop()
