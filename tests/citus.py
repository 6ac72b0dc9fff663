"""The test harness on a Citus cluster (`make test-citus`, docs/scale-out.md#testing-on-citus).

JOBQ_TEST_CITUS_URL names a database on the coordinator of a running Citus cluster whose workers are
registered there (`citus_add_node`). Each test database is made on every node: the coordinator's and each
worker's database of the same name, with the citus extension, the workers registered in the coordinator's
(Citus does not propagate CREATE DATABASE). The migrated template is distributed by `jobq migrate` itself
(app/db/distribute.py); a test's database is a clone of it made on every node at once, so that the
coordinator's shard metadata and the workers' shards, cloned together, agree."""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg import sql

URL_VARIABLE = "JOBQ_TEST_CITUS_URL"


def _with(url: str, **changes: object) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info.update(changes)
    return psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]


class Cluster:
    def __init__(self, coordinator_url: str) -> None:
        self.url = coordinator_url
        with psycopg.connect(coordinator_url) as conn:
            rows = conn.execute(
                "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND isactive ORDER BY nodeid"
            ).fetchall()
            coordinator = conn.execute("SELECT nodename, nodeport FROM pg_dist_node WHERE groupid = 0").fetchone()
        if not rows:
            raise RuntimeError(f"{URL_VARIABLE}: the coordinator lists no worker node (citus_add_node)")
        self.workers: list[tuple[str, int]] = [(str(h), int(p)) for h, p in rows]
        self.coordinator: tuple[str, int] | None = (str(coordinator[0]), int(coordinator[1])) if coordinator else None
        self._pool = ThreadPoolExecutor(max_workers=len(self.workers) + 1, thread_name_prefix="jobq-test-citus")

    def node_urls(self, workers: int | None = None) -> list[str]:
        """The coordinator's URL first, then each worker's (same user and database): the first `workers`."""
        return [self.url] + [_with(self.url, host=h, port=p) for h, p in self.workers[:workers]]

    def _on_every_node(
        self, statements: list[sql.Composable], dbname: str | None = None, workers: int | None = None
    ) -> None:
        def run(url: str) -> None:
            with psycopg.connect(_with(url, dbname=dbname) if dbname else url, autocommit=True) as conn:
                for statement in statements:
                    conn.execute(statement)

        for future in [self._pool.submit(run, url) for url in self.node_urls(workers)]:
            future.result()

    def create(self, name: str, workers: int | None = None) -> None:
        """An empty database `name` on every node (or the coordinator and the first `workers`), citus installed,
        those workers registered."""
        ident = sql.Identifier(name)
        self._on_every_node([sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident)])
        self._on_every_node([sql.SQL("CREATE DATABASE {}").format(ident)], workers=workers)
        self._on_every_node([sql.SQL("CREATE EXTENSION citus")], dbname=name, workers=workers)
        with psycopg.connect(_with(self.url, dbname=name), autocommit=True) as conn:
            if self.coordinator:
                conn.execute("SELECT citus_set_coordinator_host(%s, %s)", self.coordinator)
            for host, port in self.workers[:workers]:
                conn.execute("SELECT citus_add_node(%s, %s)", (host, port))

    def clone(self, template: str, name: str) -> None:
        """`name` as a copy of `template` on every node. No session may be connected to a template while it
        is copied: Citus's maintenance daemon is, now and then, so it is ended first (it comes back)."""
        end = sql.SQL(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = {} AND pid <> pg_backend_pid()"
        ).format(sql.Literal(template))
        create = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))

        def run(url: str) -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                for attempt in range(50):
                    conn.execute(end)
                    try:
                        conn.execute(create)
                        return
                    except psycopg.errors.ObjectInUse:
                        if attempt == 49:
                            raise

        for future in [self._pool.submit(run, url) for url in self.node_urls()]:
            future.result()

    def drop(self, name: str) -> None:
        with contextlib.suppress(psycopg.Error):
            self._on_every_node([sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))])


def plain_only(reason: str) -> pytest.MarkDecorator:
    """Skip a test when the suite runs on Citus, saying why it holds on plain PostgreSQL only."""
    return pytest.mark.skipif(bool(os.environ.get(URL_VARIABLE)), reason=f"plain PostgreSQL only: {reason}")
