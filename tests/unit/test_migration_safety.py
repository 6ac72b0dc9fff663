"""Every migration after the last release holds no lock that stops enqueues or claims on a big table for
more than a moment, and breaks nothing the previous release uses (tests/migration_safety.py says what is
refused and why; docs/deployment.md#rolling-upgrades)."""

from __future__ import annotations

import pytest

from app.db.migrate import Migration, load_migrations
from tests.migration_safety import LAST_RELEASED, check

EXISTING = "CREATE TABLE jobs (id bigint); CREATE TABLE queue_state (queue_name text);"
NO_TRANSACTION = "-- jobq: no-transaction\n"


def refusals(sql: str) -> list[str]:
    """What the check says about `sql` as the file after one that created jobs and queue_state."""
    return check([Migration(1, "0001_base.sql", EXISTING), Migration(2, "0002_new.sql", sql)], first_checked=2)


def test_migrations_after_the_last_release_are_safe_on_a_live_database() -> None:
    found = check(load_migrations())
    assert not found, "\n".join(found)


def test_the_previous_release_is_where_the_check_starts() -> None:
    """The files of 1.1.0 are the released schema; a new file is numbered past them."""
    versions = [m.version for m in load_migrations()]
    assert max(v for v in versions if v <= LAST_RELEASED) == LAST_RELEASED == 16


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("CREATE INDEX jobs_x_idx ON jobs (id)", "without CONCURRENTLY"),
        ("CREATE UNIQUE INDEX jobs_x_idx ON public.jobs (id)", "without CONCURRENTLY"),
        ("CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_x_idx ON jobs (id)", "cannot run in a transaction"),
        (NO_TRANSACTION + "CREATE INDEX CONCURRENTLY jobs_x_idx ON jobs (id)", "IF NOT EXISTS"),
        ("ALTER TABLE jobs ADD COLUMN token uuid DEFAULT gen_random_uuid()", "volatile default"),
        ("ALTER TABLE jobs ADD COLUMN seen timestamptz NOT NULL DEFAULT clock_timestamp()", "volatile default"),
        ("ALTER TABLE jobs ADD COLUMN n bigserial", "rewrites every row"),
        ("ALTER TABLE jobs ADD COLUMN n bigint GENERATED ALWAYS AS IDENTITY", "rewrites every row"),
        ("ALTER TABLE jobs ADD COLUMN d int GENERATED ALWAYS AS (id * 2) STORED", "rewrites every row"),
        ("ALTER TABLE jobs ADD CONSTRAINT jobs_x CHECK (id > 0)", "NOT VALID"),
        ("ALTER TABLE jobs ADD CHECK (id > 0)", "NOT VALID"),
        ("ALTER TABLE jobs ADD CONSTRAINT jobs_q FOREIGN KEY (q) REFERENCES queue_state (queue_name)", "NOT VALID"),
        ("ALTER TABLE jobs ADD CONSTRAINT jobs_u UNIQUE (id)", "USING INDEX"),
        ("ALTER TABLE jobs ALTER COLUMN id SET NOT NULL", "SET NOT NULL"),
        ("ALTER TABLE jobs ALTER COLUMN id TYPE numeric", "type"),
        ("ALTER TABLE ONLY jobs ALTER id SET DATA TYPE numeric", "type"),
        ("ALTER TABLE jobs SET UNLOGGED", "rewrites"),
        ("ALTER TABLE jobs DROP COLUMN id", "previous release"),
        ("ALTER TABLE queue_state DROP queue_name", "previous release"),
        ("ALTER TABLE queue_state RENAME COLUMN queue_name TO queue", "previous release"),
        ("ALTER TABLE queue_state RENAME TO queues", "previous release"),
        ("DROP TABLE queue_state", "previous release"),
        ("UPDATE jobs SET id = id", "in batches"),
        ("DELETE FROM jobs WHERE id < 0", "in batches"),
        ("INSERT INTO jobs SELECT * FROM jobs", "in batches"),
        ("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE", "in batches"),
        ("VACUUM FULL jobs", "VACUUM FULL"),
        ("CLUSTER jobs USING jobs_pkey", "CLUSTER"),
        ("REINDEX TABLE jobs", "REINDEX"),
        ("SELECT 1; ALTER TABLE jobs ADD COLUMN a int, ALTER COLUMN id SET NOT NULL", "SET NOT NULL"),
    ],
)
def test_what_would_stop_writes_or_break_the_previous_release_is_refused(sql: str, why: str) -> None:
    found = refusals(sql)
    assert found and any(why in f for f in found), found


@pytest.mark.parametrize(
    "sql",
    [
        NO_TRANSACTION + "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_x_idx ON jobs (id) WHERE id > 0",
        NO_TRANSACTION + "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_x_idx ON jobs (id)",
        "CREATE INDEX queue_state_x_idx ON queue_state (queue_name)",  # a small table
        "CREATE TABLE jobs_archive (id bigint); CREATE INDEX jobs_archive_idx ON jobs_archive (id)",
        "ALTER TABLE jobs ADD COLUMN timeout_seconds integer",
        "ALTER TABLE jobs ADD COLUMN kind text NOT NULL DEFAULT 'plain', ADD COLUMN at timestamptz DEFAULT now()",
        "ALTER TABLE jobs ADD CONSTRAINT jobs_x CHECK (id > 0) NOT VALID",
        "ALTER TABLE jobs VALIDATE CONSTRAINT jobs_x",
        "ALTER TABLE jobs DROP CONSTRAINT jobs_x, ALTER COLUMN id DROP NOT NULL, ALTER COLUMN id DROP DEFAULT",
        "ALTER TABLE jobs ADD CONSTRAINT jobs_u UNIQUE USING INDEX jobs_x_idx",
        "ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0.01)",
        "ALTER TABLE queue_state ADD COLUMN max_pending integer CHECK (max_pending > 0)",
        "UPDATE queue_state SET queue_name = queue_name",
        "CREATE OR REPLACE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN UPDATE jobs SET id = id; "
        "RETURN NULL; END $$",
        "CREATE TABLE t (id int); ALTER TABLE t RENAME TO u; DROP TABLE u",  # new in this file
        "-- jobq: reviewed: a validated CHECK (id IS NOT NULL) exists, so no scan\n"
        "ALTER TABLE jobs ALTER COLUMN id SET NOT NULL",
    ],
)
def test_what_is_safe_passes(sql: str) -> None:
    assert refusals(sql) == []
