"""Cron schedules over the HTTP API: `jobq schedules list|get|put|delete|pause|resume` (admin; see
docs/schedules.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from app.runtime.api_client import ApiClient, segment
from app.runtime.cli.common import EXIT_OK, EXIT_USAGE, _fail, _Formatter, _int_in
from app.runtime.cli.output import print_json, print_lines, relative, table


def _path(args: argparse.Namespace, action: str = "") -> str:
    return f"/schedules/{segment(args.schedule)}" + (f"/{action}" if action else "")


def _show(doc: dict[str, Any]) -> None:
    state = "paused" if doc["paused"] else f"next run {doc['next_run_at'] or '-'} ({relative(doc['next_run_at'])})"
    print(f"{doc['name']}: {doc['cron']} ({doc['timezone']}) -> {doc['queue']}; {state}")


def schedule_table(schedules: list[dict[str, Any]]) -> list[str]:
    headers = ["NAME", "QUEUE", "CRON", "TIMEZONE", "NEXT RUN", "LAST RUN", "STATE"]
    rows = []
    for s in schedules:
        state = "paused" if s["paused"] else "active"
        rows.append([s["name"], s["queue"], s["cron"], s["timezone"], s["next_run_at"], s["last_run_at"], state])
    return table(headers, rows)


def cmd_list(args: argparse.Namespace, api: ApiClient) -> int:
    found = api.get("/schedules")["schedules"]
    if args.json:
        print_json(found)
    elif not found:
        print("no schedules: `jobq schedules put NAME --queue Q --cron '...'` makes one", file=sys.stderr)
    else:
        print_lines(schedule_table(found))
    return EXIT_OK


def cmd_get(args: argparse.Namespace, api: ApiClient) -> int:
    doc = api.get(_path(args))
    print_json(doc) if args.json else _show(doc)
    return EXIT_OK


def cmd_put(args: argparse.Namespace, api: ApiClient) -> int:
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        return _fail(f"schedules put: --payload is not JSON: {exc}", EXIT_USAGE)
    body: dict[str, Any] = {"queue": args.queue, "cron": args.cron, "payload": payload, "missed": args.missed}
    for name in ("timezone", "priority", "max_attempts", "paused"):
        if (value := getattr(args, name)) is not None:
            body[name] = value
    status, doc = api.answer("PUT", _path(args), body)
    if args.json:
        print_json(doc)
    else:
        print("created " if status == 201 else "replaced ", end="")
        _show(doc)
    return EXIT_OK


def cmd_delete(args: argparse.Namespace, api: ApiClient) -> int:
    api.delete(_path(args))
    if not args.json:
        print(f"{args.schedule}: deleted (the jobs it made stay)")
    return EXIT_OK


def _set_paused(args: argparse.Namespace, api: ApiClient, action: str) -> int:
    doc = api.post(_path(args, action))
    print_json(doc) if args.json else _show(doc)
    return EXIT_OK


def cmd_pause(args: argparse.Namespace, api: ApiClient) -> int:
    return _set_paused(args, api, "pause")


def cmd_resume(args: argparse.Namespace, api: ApiClient) -> int:
    return _set_paused(args, api, "resume")


# -- arguments ------------------------------------------------------------------------------------------------


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from app.runtime.cli.remote import add_api_command

    schedules = sub.add_parser(
        "schedules",
        formatter_class=_Formatter,
        help="cron schedules: list, get, put, delete, pause, resume",
        description="Manage the cron schedules of a running jobq over its HTTP API (an admin key when "
        "authentication is on). Times are shown as the server gives them (UTC, RFC 3339); a schedule's cron "
        "is read in its own time zone. See docs/schedules.md.",
        epilog="examples:\n"
        "  jobq schedules put nightly-report --queue reports --cron '0 3 * * *' --timezone Europe/Paris \\\n"
        '      --payload \'{"report": "nightly"}\'\n'
        "  jobq schedules list\n"
        "  jobq schedules pause nightly-report",
    )
    actions = schedules.add_subparsers(dest="schedules_command", required=True, metavar="ACTION")
    add_api_command(
        actions,
        "list",
        cmd_list,
        help="every schedule with its next run (a table)",
        description="List every schedule (those of the queues the API key may use) with its next and last run.",
    )
    for name, command, text in (
        ("get", cmd_get, "show a schedule and its next run"),
        ("delete", cmd_delete, "delete a schedule (the jobs it made stay)"),
        ("pause", cmd_pause, "pause a schedule: no jobs until it is resumed"),
        ("resume", cmd_resume, "resume a paused schedule from its next tick after now"),
    ):
        parser = add_api_command(actions, name, command, help=text, description=text[0].upper() + text[1:] + ".")
        parser.add_argument("schedule", metavar="NAME")
    put = add_api_command(
        actions,
        "put",
        cmd_put,
        help="create or replace a schedule",
        description="Create or replace a schedule. Replacing it keeps its next tick when --cron and --timezone "
        "are unchanged, and its paused state unless --paused or --active is given.",
        examples="  jobq schedules put nightly-report --queue reports --cron '0 3 * * *' --timezone Europe/Paris \\\n"
        '      --payload \'{"report": "nightly"}\'\n'
        "  jobq schedules put ping --queue ops --cron '*/10 * * * * *' --missed catch_up",
    )
    put.add_argument("schedule", metavar="NAME", help="[A-Za-z0-9_.:-], at most 128")
    put.add_argument("--queue", required=True, help="the queue each job goes to")
    put.add_argument("--cron", required=True, help="5 fields, or 6 with seconds first; or @hourly, @daily, ...")
    put.add_argument("--timezone", help="IANA time zone of the cron (default UTC)")
    put.add_argument("--payload", default="null", help="each job's payload, as JSON (default null)")
    put.add_argument("--priority", type=_int_in(-32768, 32767), help="each job's priority (default 0)")
    put.add_argument("--max-attempts", type=_int_in(1, 1000), help="each job's max_attempts (default: the service's)")
    put.add_argument("--missed", choices=["skip", "catch_up"], default="skip",
                     help="ticks missed while no jobq ran: skip them (default), or enqueue the latest")  # fmt: skip
    state = put.add_mutually_exclusive_group()
    state.add_argument("--paused", dest="paused", action="store_true", default=None, help="create or set it paused")
    state.add_argument("--active", dest="paused", action="store_false", help="create or set it running")
