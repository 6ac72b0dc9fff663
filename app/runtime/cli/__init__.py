"""The `jobq` command, one module per family of commands:

  service.py   run and administer the service: serve, migrate, keys, healthcheck, openapi (database side)
  jobs.py      daily work on jobs over the HTTP API: enqueue, jobs, job, retry, cancel
  queues.py    daily work on queues over the HTTP API: queues, stats, redrive, pause, resume
  schedules.py cron schedules over the HTTP API: schedules list|get|put|delete|pause|resume
  workers.py   the worker registry over the HTTP API: workers [NAME]

remote.py is what the HTTP API commands share (JOBQ_URL / JOBQ_API_KEY, --json, errors to exit codes) on
top of app/runtime/api_client.py; output.py prints tables; common.py holds the exit codes and argument types.
To add a family, write its `add_commands(sub)` and list the module in FAMILIES.

Exit codes, for scripts: 0 success (for `serve`: stopped by SIGTERM or SIGINT after a clean shutdown),
1 runtime failure (database or service unreachable, migration failed, no PostgreSQL binaries, the service
could not start or stopped on its own, a 5xx answer), 2 bad usage or configuration (the message names the
flag or the JOBQ_* variable; also a request the service refused as invalid), 3 refused for the state of
things (no such job, a state that does not allow the action), 4 not allowed (401, 403). Messages go to
stderr and start with `jobq:`."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from app import __version__
from app.runtime.cli import jobs, queues, schedules, service, workers
from app.runtime.cli.common import EXIT_CODES, _Formatter, _settings
from app.runtime.cli.remote import API_EXIT_CODES

__all__ = ["_settings", "build_parser", "main"]

FAMILIES = (service, jobs, queues, schedules, workers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jobq",
        formatter_class=_Formatter,
        description="jobq: an HTTP job queue on PostgreSQL. Producers POST jobs; workers long-poll, claim, "
        "heartbeat and complete them.\n\n"
        "Running the service: serve, migrate, keys, healthcheck, openapi. Their configuration comes from JOBQ_* "
        "environment variables (docs/configuration.md lists every one with its default and range); flags "
        "override them. A bad value stops the command with exit code 2 and a message naming the variable.\n\n"
        "Daily work, over the HTTP API of a running jobq: enqueue, queues, stats, jobs, job, retry, cancel, "
        "redrive, pause, resume, schedules, workers. They find it at JOBQ_URL (default "
        "http://127.0.0.1:$JOBQ_PORT) and send JOBQ_API_KEY; --url and --api-key override them. Tables by "
        "default, --json for scripts.",
        epilog=EXIT_CODES
        + "\n\n"
        + API_EXIT_CODES.replace("exit codes:", "exit codes of the HTTP API commands:")
        + "\n\nRun `jobq COMMAND --help` for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"jobq {__version__}", help="print the release and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in FAMILIES:
        family.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
