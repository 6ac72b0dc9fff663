"""`jobq schedules ...`: list, show, define, delete, pause and resume schedules through the HTTP API of a
running jobq (JOBQ_URL, default http://127.0.0.1:$JOBQ_PORT; JOBQ_API_KEY, an admin key, when the service
requires keys). Exit codes as for every command: 0 done, 1 the service refused or did not answer (the
problem's detail is printed), 2 bad usage (a refused definition included: the message says what is
wrong)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
TIMEOUT_SECONDS = 30


class _Refused(Exception):
    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        super().__init__(problem.get("detail") or problem.get("title") or f"HTTP {status}")


def _base_url(args: argparse.Namespace) -> str:
    url: str = args.url or os.environ.get("JOBQ_URL") or f"http://127.0.0.1:{os.environ.get('JOBQ_PORT', '8000')}"
    return url.rstrip("/")


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    headers = {"accept": "application/json"}
    key = os.environ.get("JOBQ_API_KEY")
    if key:
        headers["authorization"] = f"Bearer {key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["content-type"] = "application/json"
    request = urllib.request.Request(_base_url(args) + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            text = response.read()
    except urllib.error.HTTPError as exc:
        try:
            problem = json.loads(exc.read() or b"{}")
        except ValueError:
            problem = {}
        raise _Refused(exc.code, problem if isinstance(problem, dict) else {}) from None
    return json.loads(text) if text else None


def _path(name: str, action: str = "") -> str:
    return "/schedules/" + urllib.parse.quote(name, safe="") + (f"/{action}" if action else "")


def _table(schedules: list[dict[str, Any]]) -> None:
    rows = [["NAME", "QUEUE", "CRON", "TIMEZONE", "NEXT RUN", "LAST RUN", "STATE"]]
    for s in schedules:
        rows.append(
            [
                s["name"],
                s["queue"],
                s["cron"],
                s["timezone"],
                s["next_run_at"] or "-",
                s["last_run_at"] or "-",
                "paused" if s["paused"] else "active",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


def _definition(args: argparse.Namespace) -> dict[str, Any]:
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise SystemExit(_usage(f"--payload is not JSON: {exc}")) from None
    body: dict[str, Any] = {"queue": args.queue, "cron": args.cron, "payload": payload, "missed": args.missed}
    for field in ("timezone", "priority", "max_attempts", "paused"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    return body


def _usage(message: str) -> int:
    print(f"jobq schedules: {message}", file=sys.stderr)
    return EXIT_USAGE


def cmd_schedules(args: argparse.Namespace) -> int:
    action = args.schedules_command
    try:
        if action == "list":
            found = _call(args, "GET", "/schedules")["schedules"]
            if args.json:
                print(json.dumps(found, indent=2))
            else:
                _table(found)
            return EXIT_OK
        if action == "delete":
            _call(args, "DELETE", _path(args.name))
            print(f"deleted schedule {args.name}")
            return EXIT_OK
        if action == "get":
            answer = _call(args, "GET", _path(args.name))
        elif action in ("pause", "resume"):
            answer = _call(args, "POST", _path(args.name, action))
        else:
            answer = _call(args, "PUT", _path(args.name), _definition(args))
        print(json.dumps(answer, indent=2))
        return EXIT_OK
    except _Refused as exc:
        what = f"{exc.status} {exc.problem.get('title', '')}".strip()
        print(f"jobq schedules {action}: {what}: {exc}", file=sys.stderr)
        return EXIT_USAGE if exc.status == 422 else EXIT_FAILURE
    except (urllib.error.URLError, OSError) as exc:
        print(f"jobq schedules {action}: {_base_url(args)}: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return EXIT_FAILURE


def add_schedule_commands(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """`jobq schedules ...` on the CLI's subcommands."""
    schedules = sub.add_parser(
        "schedules",
        formatter_class=formatter,
        help="list, define, pause, resume and delete cron schedules (through the HTTP API)",
        description="Manage the schedules of a running jobq through its HTTP API: JOBQ_URL (default "
        "http://127.0.0.1:$JOBQ_PORT) and, when it requires keys, JOBQ_API_KEY (an admin key). Times are UTC "
        "(RFC 3339); a schedule's cron is read in its own time zone.",
        epilog="examples:\n"
        "  jobq schedules put nightly-report --queue reports --cron '0 3 * * *' --timezone Europe/Paris \\\n"
        '      --payload \'{"report": "nightly"}\'\n'
        "  jobq schedules list\n"
        "  jobq schedules pause nightly-report\n\n"
        "exit codes:\n  0  done\n  1  the service refused (e.g. no such schedule) or did not answer\n"
        "  2  bad usage, or a definition the service refused (the message says what is wrong)",
    )
    schedules.add_argument("--url", help="jobq's base URL (default: JOBQ_URL, else http://127.0.0.1:$JOBQ_PORT)")
    schedules.set_defaults(func=cmd_schedules)
    actions = schedules.add_subparsers(dest="schedules_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every schedule with its next run")
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")
    for action, text in (
        ("get", "show a schedule (JSON)"),
        ("delete", "delete a schedule (the jobs it made stay)"),
        ("pause", "pause a schedule: no jobs until it is resumed"),
        ("resume", "resume a paused schedule from its next tick after now"),
    ):
        actions.add_parser(action, help=text).add_argument("name")
    put = actions.add_parser(
        "put",
        help="create or replace a schedule",
        description="Create or replace a schedule. Replacing it keeps its next tick when --cron and --timezone "
        "are unchanged, and its paused state unless --paused or --active is given.",
    )
    put.add_argument("name", help="[A-Za-z0-9_.:-], at most 128")
    put.add_argument("--queue", required=True, help="the queue each job goes to")
    put.add_argument("--cron", required=True, help="5 fields, or 6 with seconds first; or @hourly, @daily, ...")
    put.add_argument("--timezone", help="IANA time zone of the cron (default UTC)")
    put.add_argument("--payload", default="null", help="each job's payload, as JSON (default null)")
    put.add_argument("--priority", type=int, help="each job's priority (default 0)")
    put.add_argument("--max-attempts", type=int, help="each job's max_attempts (default: the service's)")
    put.add_argument("--missed", choices=["skip", "catch_up"], default="skip",
                     help="ticks missed while no jobq ran: skip them (default), or enqueue the latest")  # fmt: skip
    state = put.add_mutually_exclusive_group()
    state.add_argument("--paused", dest="paused", action="store_true", default=None, help="create or set it paused")
    state.add_argument("--active", dest="paused", action="store_false", help="create or set it running")
