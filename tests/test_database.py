"""Schema, migrations, and the service's behaviour when the database goes away and comes back."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

from app.auth.keys import new_key
from app.db import keys as store_keys
from app.db.migrate import MigrationError, load_migrations, migrate, statements
from app.db.operations import stats_writer
from app.db.spread import MAX_SPREAD, SEP
from app.models.fields import QUEUE_PATTERN
from app.runtime.cli import main as jobq
from tests import citus
from tests.conftest import _with_db, make_settings
from tests.support import LiveServer, TcpProxy, problem


@pytest.fixture
def empty_database(pg_admin_url: str) -> str:
    name = f"jobq_empty_{time.monotonic_ns()}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield _with_db(pg_admin_url, name)  # type: ignore[misc]
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_migrate_twice_applies_once(empty_database: str) -> None:
    first = migrate(empty_database)
    assert first == [m.name for m in load_migrations()]
    assert migrate(empty_database) == []
    with psycopg.connect(empty_database) as conn:
        assert conn.execute("SELECT count(*) FROM jobq.jobq_migrations").fetchone() == (len(first),)


def test_concurrent_migrations_are_safe(empty_database: str) -> None:
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(migrate(empty_database))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(len(r) for r in results) == [0, 0, 0, len(load_migrations())]


def test_an_edited_migration_is_refused(empty_database: str, tmp_path: Path) -> None:
    for m in load_migrations():
        (tmp_path / m.name).write_text(m.sql)
    migrate(empty_database, tmp_path)
    first = sorted(tmp_path.glob("*.sql"))[0]
    first.write_text(first.read_text().replace("NOT NULL", "NULL", 1))
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(empty_database, tmp_path)


def test_a_migration_whose_comments_changed_is_still_applied(empty_database: str, tmp_path: Path) -> None:
    """Comments in an applied migration may be corrected (a moved module renamed in them); statements may not."""
    for m in load_migrations():
        (tmp_path / m.name).write_text(m.sql)
    migrate(empty_database, tmp_path)
    first = sorted(tmp_path.glob("*.sql"))[0]
    first.write_text("-- a corrected comment\n" + first.read_text().replace("\n", "  \n") + "\n/* and one more */\n")
    assert migrate(empty_database, tmp_path) == []
    assert statements("SELECT '--not a comment', $x$ -- kept $x$ -- gone\n  FROM t") == (
        "SELECT '--not a comment', $x$ -- kept $x$ FROM t"
    )


@citus.plain_only("it reads the index's validity in the coordinator's catalogue, where Citus keeps no shard")
def test_a_no_transaction_migration_builds_an_index_concurrently_and_rebuilds_an_invalid_one(
    empty_database: str, tmp_path: Path
) -> None:
    """A file marked `-- jobq: no-transaction` runs statement by statement outside a transaction (CREATE INDEX
    CONCURRENTLY refuses a transaction). When an earlier run left its index invalid (here: a unique build
    that met a duplicate), the next run drops and builds it again instead of keeping a dead index."""
    for m in load_migrations():
        (tmp_path / m.name).write_text(m.sql)
    migrate(empty_database, tmp_path)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        for key in ("a", "a"):
            conn.execute("INSERT INTO jobq.jobs (queue_name, payload, locked_by) VALUES ('q', '{}', %s)", (key,))
        with pytest.raises(pg_errors.UniqueViolation):
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_test_worker_idx ON jobs (locked_by)")
        assert conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'jobs_test_worker_idx'::regclass"
        ).fetchone() == (False,)
        conn.execute("DELETE FROM jobq.jobs WHERE id = (SELECT max(id) FROM jobq.jobs)")
    (tmp_path / "9999_concurrent_index.sql").write_text(
        "-- jobq: no-transaction\n-- a comment; with a semicolon\n"
        "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_test_worker_idx ON jobs (locked_by);\n"
        "COMMENT ON INDEX jobs_test_worker_idx IS 'built; concurrently';\n"
    )
    assert migrate(empty_database, tmp_path) == ["9999_concurrent_index.sql"]
    assert migrate(empty_database, tmp_path) == []
    with psycopg.connect(empty_database) as conn:
        assert conn.execute(
            "SELECT indisvalid, obj_description(indexrelid, 'pg_class') FROM pg_index"
            " WHERE indexrelid = 'jobs_test_worker_idx'::regclass"
        ).fetchone() == (True, "built; concurrently")


def test_a_database_migrated_by_an_earlier_release_is_current(empty_database: str) -> None:
    """Releases before comment-insensitive checksums recorded each file's whole text, and some comments
    were corrected since: such a database needs no migration and is ready."""
    import hashlib
    import subprocess

    migrate(empty_database)
    root = Path(__file__).parent.parent
    with psycopg.connect(empty_database, autocommit=True) as conn:
        for m in load_migrations():
            earlier = subprocess.run(
                ["git", "show", f"2058cdc:migrations/{m.name}"], cwd=root, capture_output=True, check=False
            )
            text = earlier.stdout if earlier.returncode == 0 else m.sql.encode()
            conn.execute(
                "UPDATE jobq.jobq_migrations SET checksum = %s WHERE version = %s",
                (hashlib.sha256(text).hexdigest(), m.version),
            )
    assert migrate(empty_database) == []


def test_the_metrics_scope_migrates_a_database_that_has_keys(  # type: ignore[no-untyped-def]
    empty_database: str, tmp_path: Path, server_factory, capsys
) -> None:
    """0006 on top of a database at 0005: the keys it holds are kept and keep working; `metrics` is accepted
    only afterwards (before, `jobq keys create` says to migrate)."""
    for m in load_migrations():
        if m.version <= 5:
            (tmp_path / m.name).write_text(m.sql)
    assert migrate(empty_database, tmp_path)[-1] == "0005_api_keys.sql"
    with psycopg.connect(empty_database, autocommit=True) as conn:
        keys = {}
        for name, scopes, queues in (("ops", ["admin"], ["team-a.*"]), ("mailer", ["produce"], None)):
            keys[name], selector, key_hash = new_key()
            store_keys.api_key_insert(conn, name, selector, key_hash, scopes, queues)
        store_keys.api_key_revoke(conn, "mailer")
        keys["mailer"], selector, key_hash = new_key()
        store_keys.api_key_insert(conn, "mailer", selector, key_hash, ["produce"], None)
        before = conn.execute("SELECT * FROM jobq.api_keys ORDER BY id").fetchall()
    assert jobq(["keys", "create", "--database-url", empty_database, "--name", "m", "--scope", "metrics"]) == 1
    assert "jobq migrate" in capsys.readouterr().err

    (tmp_path / "0006_metrics_scope.sql").write_text(next(m.sql for m in load_migrations() if m.version == 6))
    assert migrate(empty_database, tmp_path) == ["0006_metrics_scope.sql"]  # not the later ones
    assert migrate(empty_database, tmp_path) == []
    with psycopg.connect(empty_database, autocommit=True) as conn:
        assert conn.execute("SELECT * FROM jobq.api_keys ORDER BY id").fetchall() == before
    assert jobq(["keys", "create", "--database-url", empty_database, "--name", "m", "--scope", "metrics"]) == 0
    scraper = capsys.readouterr().out.strip()

    migrate(empty_database)  # the later migrations, as a start of the service would
    server: LiveServer = server_factory(database=empty_database, auth="on")
    auth = {name: {"authorization": f"Bearer {key}"} for name, key in {**keys, "scraper": scraper}.items()}
    assert server.client.post("/queues/q/jobs", json={"payload": 1}, headers=auth["mailer"]).status_code == 201
    assert server.client.get("/queues/team-a.x/stats", headers=auth["ops"]).status_code == 200
    assert server.client.get("/metrics", headers=auth["scraper"]).status_code == 200


@citus.plain_only("it compares the table's file on the coordinator, where Citus keeps no rows")
def test_released_stats_migrate_a_database_that_has_stats(  # type: ignore[no-untyped-def]
    empty_database: str, tmp_path: Path, server_factory
) -> None:
    """0007 on top of a database at 0006: existing per-minute rows are kept (released 0) without a rewrite
    of queue_stats, and a release is then counted in the same window as them."""
    for m in load_migrations():
        if m.version <= 6:
            (tmp_path / m.name).write_text(m.sql)
    assert migrate(empty_database, tmp_path)[-1] == "0006_metrics_scope.sql"
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobq.queue_stats (queue_name, minute, enqueued, claimed, completed, retried)"
            " SELECT q, date_trunc('minute', now()) - interval '1 minute', 5, 4, 3, 1"
            " FROM unnest(ARRAY['q', 'other']) AS q"
        )
        before = conn.execute("SELECT * FROM jobq.queue_stats ORDER BY queue_name").fetchall()
        (file_before,) = conn.execute("SELECT pg_relation_filenode('queue_stats')").fetchone()  # type: ignore[misc]

    (tmp_path / "0007_queue_stats_released.sql").write_text(next(m.sql for m in load_migrations() if m.version == 7))
    assert migrate(empty_database, tmp_path) == ["0007_queue_stats_released.sql"]
    with psycopg.connect(empty_database, autocommit=True) as conn:
        after = conn.execute("SELECT * FROM jobq.queue_stats ORDER BY queue_name").fetchall()
        assert [r[:-1] for r in after] == before  # every old column as it was, released added last
        assert [r[-1] for r in after] == [0, 0]
        # Metadata-only: the table was not rewritten (a rewrite gives it a new file).
        assert conn.execute("SELECT pg_relation_filenode('queue_stats')").fetchone() == (file_before,)

    migrate(empty_database)  # the later migrations, as a start of the service would
    server: LiveServer = server_factory(database=empty_database)
    job = server.enqueue(payload=1)
    claim = server.claim_one()
    body = {"claim_token": claim["claim_token"]}
    assert server.client.post(f"/jobs/{job['id']}/release", json=body).status_code == 200
    server.run(lambda: server.services.metrics.flush(stats_writer(server.services.db)))
    w = server.client.get("/queues/q/stats").json()["window"]
    assert (w["enqueued"], w["claimed"], w["completed"], w["retries"], w["released"]) == (6, 5, 3, 1, 1)


def test_the_schema_holds_the_state_machine(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO jobq.jobs (queue_name, payload) VALUES ('q', '1')")
    bad_updates = [
        "UPDATE jobq.jobs SET status = 'running'",  # running without a claim
        "UPDATE jobq.jobs SET status = 'completed'",  # finished without finished_at
        "UPDATE jobq.jobs SET status = 'sleeping'",
        "UPDATE jobq.jobs SET attempts = max_attempts",  # pending with no attempt left
        "UPDATE jobq.jobs SET result = '1'",  # result on a job that did not complete
    ]
    for statement in bad_updates:
        with pytest.raises(pg_errors.CheckViolation):
            db.execute(statement)
    # A queue name the API would refuse never gets in, by insert nor by update (on Citus the distribution column
    # cannot be updated at all).
    citus = db.execute("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')").fetchone() == (True,)
    with pytest.raises(pg_errors.FeatureNotSupported if citus else pg_errors.CheckViolation):
        db.execute("UPDATE jobq.jobs SET queue_name = 'bad name'")
    with pytest.raises(pg_errors.CheckViolation):
        db.execute("INSERT INTO jobq.jobs (queue_name, payload) VALUES ('bad name', '1')")


QUEUE_NAMES = ["q", "-", "Az09_.:-", "a" * 128, "a" * 129, "", "bad name", "q\n", "\nq", "é", "q*", "q#", "q%", "q\\"]
# The stored names of a spread queue's keys (app/db/spread.py): `queue#k`, k from 1 to MAX_SPREAD - 1.
KEY_NAMES = [
    "q#1",
    "q#9",
    "q#10",
    "q#63",
    "a" * 128 + "#1",
    "q#0",
    "q#01",
    "q#64",
    "q#100",
    "#1",
    "q#1#2",
    "q #1",
    "a" * 129 + "#1",
    "q#1\n",
    "q#-1",
]


@pytest.mark.parametrize("name", QUEUE_NAMES + KEY_NAMES, ids=repr)
def test_the_database_takes_exactly_the_queue_names_the_api_takes(db: psycopg.Connection, name: str) -> None:
    # The CHECKs of jobs and queue_state (migrations/0049_queue_name_check.sql, 0051_queue_spread.sql) test the
    # API's rule another way than its regex, whose bounded repetition cost every row written: the same answer for
    # every name, both tables. Besides the API's names they take the names of a spread queue's keys, and no other.
    base, _, k = name.partition(SEP)
    key = k.isdigit() and str(int(k)) == k and 1 <= int(k) < MAX_SPREAD if SEP in name else True
    allowed = re.fullmatch(QUEUE_PATTERN.strip("^$"), base) is not None and key
    for statement in (
        "INSERT INTO jobq.jobs (queue_name, payload) VALUES (%s, '1')",
        "INSERT INTO jobq.queue_state (queue_name) VALUES (%s)",
    ):
        if allowed:
            db.execute(statement, (name,))
        else:
            with pytest.raises(pg_errors.CheckViolation):
                db.execute(statement, (name,))


def test_an_installation_migrated_before_0049_takes_it_on_both_engines(empty_database_url: str, tmp_path: Path) -> None:
    # The upgrade of an existing installation: the files up to 0048 applied (on Citus: then distributed), then the
    # later ones. On Citus the statements of a file reach the shards one by one (app/db/migrate.py
    # _apply_in_transaction): sent as one text, 0049's two ALTERs were refused on the workers ("cannot insert
    # multiple commands into a prepared statement"), where the tests' fresh databases take every file before they
    # are distributed.
    for f in sorted((Path(__file__).parent.parent / "migrations").glob("*.sql")):
        if int(f.name[:4]) <= 48:
            (tmp_path / f.name).write_bytes(f.read_bytes())
    migrate(empty_database_url, tmp_path)
    applied = [name for name in migrate(empty_database_url) if not name.startswith("distributed ")]
    assert applied[:2] == ["0049_queue_name_check.sql", "0050_sql_enqueue_queue_name.sql"]
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobq.jobs (queue_name, payload) VALUES (%s, '1')", ("a" * 128,))
        for bad in ("bad name", "a" * 129):
            with pytest.raises(pg_errors.CheckViolation):
                conn.execute("INSERT INTO jobq.jobs (queue_name, payload) VALUES (%s, '1')", (bad,))
        with pytest.raises(pg_errors.InvalidParameterValue):
            conn.execute("SELECT jobq.enqueue('bad name', '1'::jsonb)")


def test_claim_uses_the_partial_index(db: psycopg.Connection) -> None:
    db.execute(
        "INSERT INTO jobq.jobs (queue_name, payload) SELECT 'q' || (i % 50), '1' FROM generate_series(1, 20000) i"
    )
    db.execute("ANALYZE jobq.jobs")
    plan = "\n".join(
        r[0]
        for r in db.execute(
            "EXPLAIN SELECT id FROM jobq.jobs WHERE queue_name = 'q1' AND status = 'pending'"
            " AND run_at <= clock_timestamp() ORDER BY priority DESC, run_at, id LIMIT 10 FOR UPDATE SKIP LOCKED"
        )
    )
    assert "jobs_claim_idx" in plan


def test_database_outage_is_503_then_recovers(database_url: str) -> None:
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    proxy = TcpProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)).start()
    info.update(host="127.0.0.1", port=str(proxy.port))
    server = LiveServer(make_settings(psycopg.conninfo.make_conninfo(**info), pool_timeout_seconds=1.0)).start()  # type: ignore[arg-type]
    try:
        assert server.client.post("/queues/q/jobs", json={"payload": 1}).status_code == 201
        proxy.cut()
        for _ in range(3):
            r = server.client.post("/queues/q/jobs", json={"payload": 2})
            body = problem(r, 503, "database-unavailable")
            assert int(r.headers["retry-after"]) >= 1
            assert "payload" not in body
        problem(server.client.post("/queues/q/claim", json={"worker": "w"}), 503, "database-unavailable")
        problem(server.client.get("/readyz"), 503, "database-unavailable")
        assert server.client.get("/healthz").status_code == 200
        proxy.restore()
        deadline = time.monotonic() + 20
        while server.client.post("/queues/q/jobs", json={"payload": 3}).status_code != 201:
            assert time.monotonic() < deadline, "the pool did not recover"
            time.sleep(0.1)
        assert server.client.get("/readyz").status_code == 200
    finally:
        server.stop()
        proxy.stop()


def test_readyz_reports_pending_migrations(server: LiveServer, db: psycopg.Connection) -> None:
    assert server.client.get("/readyz").json()["status"] == "ready"
    db.execute("DELETE FROM jobq.jobq_migrations")
    problem(server.client.get("/readyz"), 503, "not-ready")


def test_jobq_commits_synchronously_whatever_the_database_default(  # type: ignore[no-untyped-def]
    server_factory, database_url: str, db: psycopg.Connection
) -> None:
    """An acknowledged enqueue is durable only if its commit waited for the WAL flush: jobq's sessions set
    synchronous_commit on, so a database (or server) default of off does not weaken the guarantee."""
    name = db.info.dbname
    db.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    with psycopg.connect(database_url, autocommit=True) as plain:
        assert plain.execute("SHOW synchronous_commit").fetchone() == ("off",)  # the default really is off
    server: LiveServer = server_factory(pool_min_size=2)

    async def settings_of_every_pooled_session() -> set[str]:
        pool = server.services.db.pool
        seen = set()
        async with pool.connection() as a, pool.connection() as b:
            for conn in (a, b):
                row = await (await conn.execute("SHOW synchronous_commit")).fetchone()
                seen.add(row[0])
        return seen

    assert server.run(settings_of_every_pooled_session) == {"on"}
    server.enqueue(payload="durable")


def test_readyz_reports_a_migration_missing_below_the_last(server: LiveServer, db: psycopg.Connection) -> None:
    """Migrations are applied by presence: a database can hold a later one without an earlier one (applied
    by an older build of a branch), and is then not current although its highest number is."""
    versions = [r[0] for r in db.execute("SELECT version FROM jobq.jobq_migrations ORDER BY version").fetchall()]
    assert len(versions) >= 2
    db.execute("DELETE FROM jobq.jobq_migrations WHERE version = %s", (versions[-2],))
    problem(server.client.get("/readyz"), 503, "not-ready")
