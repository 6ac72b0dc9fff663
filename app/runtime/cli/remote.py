"""What every command over the HTTP API shares: where jobq is and which key to send (JOBQ_URL, JOBQ_API_KEY,
or flags), `--json`, and how a failed request becomes one line on stderr and an exit code.

A command family declares each command with add_api_command(); its function receives the parsed arguments
and a connected ApiClient (app/runtime/api_client.py), prints its answer, and returns an exit code or
raises the client's ApiError, which is reported here:

    def cmd_pause(args: argparse.Namespace, api: ApiClient) -> int:
        state = api.post(f"/queues/{segment(args.queue)}/pause")
        ...
        return EXIT_OK

    add_api_command(sub, "pause", cmd_pause, help="...", description="...")
        .add_argument("queue", metavar="QUEUE")
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from app.runtime.api_client import DEFAULT_TIMEOUT, ApiClient, ApiError, NotJobq, Problem, Unreachable
from app.runtime.cli.common import EXIT_FAILURE, EXIT_USAGE, _fail, _Formatter, _number_in

EXIT_REFUSED, EXIT_DENIED = 3, 4
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

API_EXIT_CODES = """exit codes:
  0  success
  1  no answer or a server failure: unreachable, timeout, 429, 5xx, an answer not from jobq
  2  bad usage: the command line, or a request refused as invalid (400, 413, 415, 422)
  3  refused by the state of things: no such job (404), a state that forbids it (409)
  4  not allowed: no key or a refused one (401), a key without the scope or queue (403)"""

Command = Callable[[argparse.Namespace, ApiClient], int]


def default_url() -> str:
    """JOBQ_URL, else the local service on JOBQ_PORT (what `jobq serve` listens on), else port 8000."""
    if url := os.environ.get("JOBQ_URL"):
        return url
    port = os.environ.get("JOBQ_PORT") or "8000"
    return f"http://127.0.0.1:{port}"


def _options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("connection")
    where.add_argument("--url", help="jobq's address (default: JOBQ_URL, else http://127.0.0.1:$JOBQ_PORT, port 8000)")
    where.add_argument(
        "--api-key",
        metavar="KEY",
        help="API key to send (default: JOBQ_API_KEY; the variable keeps the key out of the process list)",
    )
    where.add_argument(
        "--timeout",
        type=_number_in(0.1, 600),
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"longest wait for an answer (default {DEFAULT_TIMEOUT:g})",
    )
    common.add_argument("--json", action="store_true", help="print the server's JSON document(s), for scripts")
    return common


API_OPTIONS = _options()


def exit_code(error: ApiError) -> int:
    if not isinstance(error, Problem):
        return EXIT_FAILURE  # Unreachable, NotJobq
    status = error.status
    if status in (401, 403):
        return EXIT_DENIED
    if status in (400, 413, 415, 422):
        return EXIT_USAGE
    if status == 404 and error.slug == "not-found":
        return EXIT_FAILURE  # no such route: JOBQ_URL is not a jobq of this version
    if 400 <= status < 500 and status not in (405, 429):
        return EXIT_REFUSED
    return EXIT_FAILURE


def problem_line(error: ApiError, url: str, what: str | None = None) -> str:
    """One line saying what went wrong, for stderr: `jobq: job 42: No job has this id. (404 job-not-found)`."""
    prefix = f"jobq: {what}: " if what else "jobq: "
    if isinstance(error, Unreachable):
        return f"jobq: cannot reach {error} (is jobq running there? set JOBQ_URL or pass --url)"
    if isinstance(error, NotJobq):
        return f"jobq: {error}"
    assert isinstance(error, Problem)
    text = error.detail or error.title or "no detail"
    line = f"{prefix}{text} ({error.status} {error.slug})"
    if error.status == 401:
        line += "; set JOBQ_API_KEY or pass --api-key"
    elif error.status == 404 and error.slug == "not-found":
        line += f"; is {url} a jobq that has this command?"
    elif error.retry_after:
        line += f"; retry after {error.retry_after}s"
    return line


def subject(args: argparse.Namespace) -> str | None:
    """What a command was about, to begin its error line with: `job 42`, or the queue's name."""
    if isinstance(getattr(args, "id", None), int):
        return f"job {args.id}"
    if isinstance(getattr(args, "schedule", None), str):
        return f"schedule {args.schedule}"
    queue = getattr(args, "queue", None)
    return queue if isinstance(queue, str) else None


def connect(args: argparse.Namespace) -> ApiClient:
    key = args.api_key if args.api_key is not None else os.environ.get("JOBQ_API_KEY")
    return ApiClient(args.url or default_url(), key or None, args.timeout)


def run_api_command(command: Command) -> Callable[[argparse.Namespace], int]:
    """The parser's `func`: connect, run, and report an ApiError that the command did not handle itself."""

    def run(args: argparse.Namespace) -> int:
        try:
            api = connect(args)
        except ValueError as exc:
            source = "--url" if args.url else "JOBQ_URL"
            return _fail(f"{source}: {exc}", EXIT_USAGE)
        try:
            return command(args, api)
        except ApiError as exc:
            print(problem_line(exc, api.url, subject(args)), file=sys.stderr)
            return exit_code(exc)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED

    return run


def add_api_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    command: Command,
    *,
    help: str,
    description: str,
    examples: str = "",
) -> argparse.ArgumentParser:
    """A `jobq NAME` command over the HTTP API, with the connection options, --json and the exit codes."""
    epilog = API_EXIT_CODES + (f"\n\nexamples:\n{examples}" if examples else "")
    parser = sub.add_parser(
        name, parents=[API_OPTIONS], formatter_class=_Formatter, help=help, description=description, epilog=epilog
    )
    parser.set_defaults(func=run_api_command(command))
    return parser
