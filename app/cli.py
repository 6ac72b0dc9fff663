"""The `jobq` command: serve, migrate, keys, openapi.

Exit codes: 0 success, 1 runtime failure (database unreachable, migration failed), 2 bad usage or
configuration (an invalid JOBQ_* value is named in the message)."""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from app.settings import Settings

if TYPE_CHECKING:
    import psycopg

    from app.store_keys import KeyInfo

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
log = logging.getLogger("jobq")


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        for err in exc.errors():
            name = "JOBQ_" + "_".join(str(p) for p in err["loc"]).upper() if err["loc"] else "settings"
            print(f"jobq: invalid configuration: {name}: {err['msg']}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app import migrate

    settings = _settings()
    from app import logs

    logging.config.dictConfig(logs.dict_config(args.log_level))
    metrics_dir = None
    if args.workers > 1:
        # Prometheus multi-process mode: each worker writes its metrics to files here and /metrics, in
        # whichever worker answers, reports the sum. Must be set before the workers start.
        metrics_dir = tempfile.mkdtemp(prefix="jobq-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    embedded = None
    url = settings.database_url
    if not url:
        from app.embedded import EmbeddedError, LocalPostgres, default_data_dir

        data_dir = Path(args.data_dir or settings.data_dir or default_data_dir())
        try:
            embedded = LocalPostgres(data_dir)
            url = embedded.start()
        except EmbeddedError as exc:
            print(f"jobq: cannot start the embedded PostgreSQL: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        os.environ["JOBQ_DATABASE_URL"] = url
    try:
        if not args.no_migrate:
            applied = migrate.migrate(url)
            log.info("migrations: %s", ", ".join(applied) if applied else "schema is current")
        # Workers must not each migrate again; the parent did it (or was told not to).
        os.environ["JOBQ_MIGRATE_ON_START"] = "false"
        # The app decides JOBQ_AUTH=auto by the address it really listens on.
        os.environ["JOBQ_HOST"] = args.host
        uvicorn.run(
            "app.main:create_app",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=args.log_level,
            log_config=logs.dict_config(args.log_level),
            access_log=False,
            timeout_graceful_shutdown=args.graceful_timeout,
            proxy_headers=False,
        )
        return EXIT_OK
    except Exception as exc:
        print(f"jobq: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        if embedded is not None:
            embedded.stop()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def cmd_migrate(args: argparse.Namespace) -> int:
    from app import migrate

    url = args.database_url or _settings().database_url
    if not url:
        print("jobq migrate: set JOBQ_DATABASE_URL or pass --database-url", file=sys.stderr)
        return EXIT_USAGE
    try:
        applied = migrate.migrate(url)
    except Exception as exc:
        print(f"jobq migrate: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print("applied: " + ", ".join(applied) if applied else "schema is current")
    return EXIT_OK


def _database_url(args: argparse.Namespace, command: str) -> str | None:
    url: str | None = args.database_url or _settings().database_url
    if not url:
        print(f"jobq {command}: set JOBQ_DATABASE_URL or pass --database-url", file=sys.stderr)
    return url


def cmd_keys(args: argparse.Namespace) -> int:
    import psycopg

    from app import store_keys

    url = _database_url(args, "keys")
    if not url:
        return EXIT_USAGE
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            if args.keys_command == "create":
                return _keys_create(conn, args)
            if args.keys_command == "list":
                keys = store_keys.api_keys_list(conn, include_revoked=args.all)
                if args.json:
                    print(json.dumps([_key_doc(k) for k in keys], indent=2))
                else:
                    _print_keys(keys)
                return EXIT_OK
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


def _keys_create(conn: psycopg.Connection[Any], args: argparse.Namespace) -> int:
    import psycopg

    from app import auth, store_keys

    scopes = sorted(set(args.scope), key=auth.SCOPES.index)
    try:
        if args.queue:
            auth.queue_alternation(args.queue)
    except ValueError as exc:
        print(f"jobq keys create: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for _ in range(3):  # a selector already taken (48 random bits): draw again
        key, selector, key_hash = auth.new_key()
        try:
            key_id = store_keys.api_key_insert(conn, args.name, selector, key_hash, scopes, args.queue or None)
            break
        except psycopg.errors.UniqueViolation as exc:
            if "name" in (exc.diag.constraint_name or ""):
                print(f"jobq keys create: a live key is already named {args.name!r}", file=sys.stderr)
                return EXIT_USAGE
        except psycopg.errors.CheckViolation:
            print(f"jobq keys create: invalid name {args.name!r}: a letter, then [A-Za-z0-9_.:@-], at most 64",
                  file=sys.stderr)  # fmt: skip
            return EXIT_USAGE
    else:
        return EXIT_FAILURE
    where = ", ".join(args.queue) if args.queue else "every queue"
    print(
        f"created key {key_id} ({args.name}): scopes {', '.join(scopes)} on {where}.\n"
        "The key is printed once, on standard output; only its hash is stored. Keep it now.",
        file=sys.stderr,
    )
    print(key)
    return EXIT_OK


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
    }


def _print_keys(keys: Sequence[KeyInfo]) -> None:
    rows = [["ID", "NAME", "PREFIX", "SCOPES", "QUEUES", "CREATED", "LAST USED", "REVOKED"]]
    for doc in map(_key_doc, keys):
        rows.append(
            [
                str(doc["id"]),
                str(doc["name"]),
                str(doc["prefix"]),
                ",".join(doc["scopes"]),
                ",".join(doc["queues"]) if doc["queues"] else "*",
                str(doc["created_at"])[:19],
                str(doc["last_used_at"] or "-")[:19],
                str(doc["revoked_at"] or "-")[:19],
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


def cmd_openapi(args: argparse.Namespace) -> int:
    from app.openapi import published_document

    doc = published_document()
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jobq",
        description="jobq: an HTTP job queue on PostgreSQL. Configuration comes from JOBQ_* variables "
        "(see the README); flags override them.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the HTTP service",
        description="Run the service. Without JOBQ_DATABASE_URL it starts a managed local PostgreSQL "
        "(data in --data-dir) and uses that. Pending migrations are applied first unless --no-migrate.",
    )
    serve.add_argument("--host", default=os.environ.get("JOBQ_HOST", "127.0.0.1"),
                       help="address to listen on (default 127.0.0.1, env JOBQ_HOST)")  # fmt: skip
    serve.add_argument("--port", type=int, default=int(os.environ.get("JOBQ_PORT", "8000")),
                       help="port (default 8000, env JOBQ_PORT)")  # fmt: skip
    serve.add_argument("--workers", type=int, default=int(os.environ.get("JOBQ_WORKERS", "1")),
                       help="worker processes sharing the port (default 1, env JOBQ_WORKERS)")  # fmt: skip
    serve.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")
    serve.add_argument("--data-dir", help="embedded PostgreSQL data directory (env JOBQ_DATA_DIR)")
    serve.add_argument("--graceful-timeout", type=float, default=30.0,
                       help="seconds to let requests in flight finish on SIGTERM (default 30)")  # fmt: skip
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=cmd_serve)

    mig = sub.add_parser("migrate", help="apply pending migrations and exit",
                         description="Apply pending schema migrations (safe to run concurrently).")  # fmt: skip
    mig.add_argument("--database-url", help="default: JOBQ_DATABASE_URL")
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
    create.add_argument("--scope", action="append", required=True, choices=["produce", "consume", "admin"],
                        help="repeat for several; admin includes the others")  # fmt: skip
    create.add_argument("--queue", action="append", metavar="PATTERN",
                        help="limit the key to queues matching PATTERN (`*` = any characters); repeat for "
                             "several; default: every queue")  # fmt: skip
    lst = ksub.add_parser("list", parents=[common], help="list keys (never their secrets)")
    lst.add_argument("--all", action="store_true", help="include revoked keys")
    lst.add_argument("--json", action="store_true", help="JSON instead of a table")
    revoke = ksub.add_parser("revoke", parents=[common], help="revoke a key by id or name")
    revoke.add_argument("key", help="the key's id or name")

    api = sub.add_parser("openapi", help="print the OpenAPI document",
                         description="Write the OpenAPI document of the default configuration.")  # fmt: skip
    api.add_argument("--output", "-o", help="file to write (default: stdout)")
    api.set_defaults(func=cmd_openapi)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
