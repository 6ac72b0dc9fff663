"""jobq's tables live in a schema of their own (app/db/schema.py, docs/deployment.md#the-schema): an application
sharing the database keeps its own tables of the same names, another schema name can be configured, and no
statement relies on search_path."""

from __future__ import annotations

import psycopg
import pytest

from app.db import schema
from app.db.migrate import MigrationError, load_migrations, migrate, move_into_schema
from tests import citus
from tests.conftest import make_settings
from tests.processes import run_jobq
from tests.support import LiveServer, wait_until

TABLES_IN = "SELECT relname FROM pg_class WHERE relnamespace = to_regnamespace(%s) AND relkind = 'r' ORDER BY 1"


def tables_in(url: str, namespace: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute(TABLES_IN, (namespace,)).fetchall()}


def round_trip(server: LiveServer, queue: str) -> dict[str, object]:
    """Enqueue, claim (woken from a long poll) and complete one job; the job as read back."""
    client = server.client
    r = client.post(f"/queues/{queue}/jobs", json={"payload": {"n": 1}, "idempotency_key": "k"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    claimed = client.post(f"/queues/{queue}/claim", json={"worker": "w"}).json()["jobs"]
    assert [c["id"] for c in claimed] == [job_id]
    done = client.post(f"/jobs/{job_id}/complete", json={"claim_token": claimed[0]["claim_token"], "result": 7})
    assert done.status_code == 200, done.text
    assert client.get(f"/queues/{queue}/stats").json()["counts"]["completed"] == 1
    return dict(client.get(f"/jobs/{job_id}").json())


def test_a_new_installation_keeps_every_table_in_schema_jobq(empty_database_url: str) -> None:
    migrate(empty_database_url)
    assert tables_in(empty_database_url, "jobq") == set(schema.TABLES)
    assert tables_in(empty_database_url, "public") == set()


def test_an_applications_own_tables_of_the_same_names_are_left_alone(empty_database_url: str) -> None:
    """The application's `jobs`, `workers` and `schedules` in public, made before jobq was installed."""
    url = empty_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.jobs (id serial PRIMARY KEY, title text NOT NULL)")
        conn.execute("CREATE TABLE public.workers (name text PRIMARY KEY)")
        conn.execute("CREATE TABLE public.schedules (day date)")
        conn.execute("INSERT INTO public.jobs (title) VALUES ('plumber'), ('baker')")
    migrate(url)
    server = LiveServer(make_settings(url)).start()
    try:
        assert round_trip(server, "emails")["result"] == 7
        assert server.client.get("/workers").status_code == 200  # jobq's workers, not the application's
    finally:
        server.stop()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT title FROM public.jobs ORDER BY id").fetchall() == [("plumber",), ("baker",)]
        assert conn.execute("SELECT count(*) FROM public.workers").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM jobq.jobs").fetchone() == (1,)
    assert tables_in(url, "public") == {"jobs", "workers", "schedules"}


def test_another_schema_name_and_no_search_path(empty_database_url: str) -> None:
    """JOBQ_DB_SCHEMA=acme_queue: everything is made and found there, with the database's search_path naming
    neither it nor public."""
    url = empty_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT set_config('x.y', '1', false)")
        database = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        conn.execute(f'ALTER DATABASE "{database}" SET search_path = nowhere')
    assert migrate(url, schema="acme_queue")
    assert tables_in(url, "acme_queue") == set(schema.TABLES)
    assert tables_in(url, "jobq") == tables_in(url, "public") == set()
    server = LiveServer(make_settings(url, db_schema="acme_queue")).start()
    try:
        client = server.client
        assert round_trip(server, "q")["status"] == "completed"
        assert client.get("/queues").json()["queues"][0]["queue"] == "q"
        assert client.get("/readyz").status_code == 200
        assert client.post("/queues/q/pause").status_code in (200, 204)
        assert client.get("/queues/q/stats").json()["paused"] is True
    finally:
        server.stop()


def test_the_cli_migrates_into_the_configured_schema(empty_database_url: str) -> None:
    r = run_jobq("migrate", env={"JOBQ_DATABASE_URL": empty_database_url, "JOBQ_DB_SCHEMA": "other_place"})
    assert r.returncode == 0, r.stderr
    assert tables_in(empty_database_url, "other_place") == set(schema.TABLES)
    r = run_jobq("keys", "create", "--name", "ci", "--scope", "admin", env={"JOBQ_DATABASE_URL": empty_database_url,
                                                        "JOBQ_DB_SCHEMA": "other_place"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT name FROM other_place.api_keys").fetchall() == [("ci",)]


@citus.plain_only("installations in public were made by 1.1.0, which never ran on Citus")
def test_an_installation_in_public_is_migrated_in_place_then_moved_by_the_cli(empty_database_url: str) -> None:
    """An installation made before 1.2.0: `jobq migrate` leaves the tables where they are (a process of the
    previous release may still be serving); `--move-into-schema` moves them, jobs and all, in one transaction."""
    url = empty_database_url
    migrate(url, schema="public")  # the layout of every release before 1.2.0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO public.jobs (queue_name, payload) SELECT 'q', '1' FROM generate_series(1, 100)")
    r = run_jobq("migrate", env={"JOBQ_DATABASE_URL": url})
    assert (r.returncode, r.stdout.strip()) == (0, "schema is current"), r.stderr
    assert "--move-into-schema" in r.stderr and "0045_sql_enqueue.sql" in r.stderr  # what is left to do
    assert "jobs" in tables_in(url, "public")
    with psycopg.connect(url) as conn:  # enqueue from SQL waits for the move: no SECURITY DEFINER in public
        functions = "SELECT count(*) FROM pg_proc WHERE proname LIKE 'enqueue%' AND prosecdef"
        assert conn.execute(functions).fetchone() == (0,)
    r = run_jobq("migrate", "--move-into-schema", env={"JOBQ_DATABASE_URL": url})
    assert r.returncode == 0, r.stderr
    assert "moved into schema jobq: jobq_migrations, jobs," in r.stdout and "0045_sql_enqueue.sql" in r.stdout
    assert tables_in(url, "public") == set()
    assert tables_in(url, "jobq") == set(schema.TABLES)
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobq.jobs").fetchone() == (100,)
        new = conn.execute("INSERT INTO jobq.jobs (queue_name, payload) VALUES ('q', '1') RETURNING id").fetchone()
        assert new == (101,)  # the id sequence moved with its table
        # Enqueue from SQL was made by the move, in the new place.
        assert conn.execute("SELECT jobq.enqueue('q', '{\"n\": 1}')").fetchone() == (102,)
        left = "SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace AND proname LIKE 'enqueue%'"
        assert conn.execute(left).fetchone() == (0,)
        versions = {r[0] for r in conn.execute("SELECT version FROM jobq.jobq_migrations")}
        assert versions == {m.version for m in load_migrations()}
    r = run_jobq("migrate", "--move-into-schema", env={"JOBQ_DATABASE_URL": url})
    assert (r.returncode, r.stdout.strip()) == (0, "schema is current\nnothing to move"), r.stderr


def test_a_process_started_on_public_follows_a_move(empty_database_url: str) -> None:
    url = empty_database_url
    migrate(url, schema="public")
    server = LiveServer(make_settings(url)).start()
    try:
        client = server.client
        job = client.post("/queues/q/jobs", json={"payload": 1}).json()["id"]
        assert client.get("/readyz").status_code == 200  # what waits for the move is not missing
        assert move_into_schema(url)
        assert client.get("/readyz").status_code == 200  # it looks again, finds them moved, and everything applied
        answers = [client.get(f"/jobs/{job}").status_code for _ in range(3)]
        assert answers[-1] == 200 and set(answers) <= {200, 503}, answers
        assert answers.count(503) <= 1  # one statement named the old place; the next ones the new one
        wait_until(lambda: client.post("/queues/q/claim", json={"worker": "w"}).json()["jobs"], what="a claim")
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("written", "sent"),
    [
        ("SELECT * FROM jobq.jobs j JOIN jobq.queue_state s USING (queue_name)",
         "SELECT * FROM acme.jobs j JOIN acme.queue_state s USING (queue_name)"),
        ("SELECT 'jobq.x', \"jobq\".y, myjobq.jobs, jobq_wakeup",
         "SELECT 'acme.x', \"jobq\".y, myjobq.jobs, jobq_wakeup"),
        ("SELECT to_regclass('jobq.jobs')", "SELECT to_regclass('acme.jobs')"),
    ],
)  # fmt: skip
def test_statements_are_sent_for_the_configured_schema(written: str, sent: str) -> None:
    location = schema.Location("acme")
    assert location.rename(written) == sent
    assert schema.Location().rename(written) is written  # the default: sent as written
    assert location.rename(b"CREATE TABLE jobs ()") == b"CREATE TABLE jobs ()"  # a migration file's statement


def test_jobqs_schema_is_its_owners_alone_and_a_grant_of_create_is_refused(
    empty_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """jobq's SECURITY DEFINER functions call built-ins: a role that may create in their schema could make a
    better-matching overload that runs as their owner. The migrations make the schema with CREATE for its owner
    alone, refuse to make those functions where another role may create, and say so at every run."""
    url = empty_database_url
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        others = conn.execute(
            "SELECT count(*) FROM pg_namespace n, aclexplode(n.nspacl) a"
            " WHERE n.nspname = 'jobq' AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner"
        ).fetchone()
        assert others == (0,)
        conn.execute("GRANT CREATE ON SCHEMA jobq TO PUBLIC")
        conn.execute("DELETE FROM jobq.jobq_migrations WHERE version = 45")  # as if it were still to come
    with pytest.raises(MigrationError, match=r"0045_sql_enqueue.sql: roles other than its owner .* \(PUBLIC\)"):
        migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("REVOKE CREATE ON SCHEMA jobq FROM PUBLIC")
    caplog.clear()
    assert migrate(url) == ["0045_sql_enqueue.sql"]
    assert "may create objects" not in caplog.text


def test_public_is_not_a_schema_of_its_own() -> None:
    r = run_jobq("migrate", env={"JOBQ_DATABASE_URL": "postgresql://127.0.0.1:1/x", "JOBQ_DB_SCHEMA": "public"})
    assert r.returncode == 2 and "JOBQ_DB_SCHEMA" in r.stderr and "not public" in r.stderr, r.stderr


@pytest.mark.parametrize("bad", ["", "Jobq", "pg_jobs", "a-b", "x" * 64, '"q"'])
def test_a_schema_name_must_be_a_plain_identifier(bad: str) -> None:
    with pytest.raises(ValueError):
        schema.Location(bad)
