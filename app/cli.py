"""The `jobq` command: serve, migrate, openapi.

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
from typing import TYPE_CHECKING

from pydantic import ValidationError

from app.settings import Settings

if TYPE_CHECKING:
    pass

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
