"""Daily work on queues, over the HTTP API: `jobq queues`, `jobq queues config QUEUE [--set key=value]`,
`jobq stats QUEUE [--watch]`, `jobq redrive QUEUE`, `jobq pause|resume QUEUE`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from app.runtime.api_client import ApiClient, ApiError, segment
from app.runtime.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, _int_in, _number_in
from app.runtime.cli.output import duration, millis, print_json, print_lines, table
from app.runtime.cli.remote import add_api_command, exit_code, problem_line

_CLEAR = "\x1b[H\x1b[2J"
QUEUES_PAGE = 1000  # queues per request of `jobq queues` (the API's largest page)


# -- queues ---------------------------------------------------------------------------------------------------


def all_queues(api: ApiClient, page: int = QUEUES_PAGE) -> dict[str, Any]:
    """Every queue, following GET /queues page by page: {"queues": [...], "next_cursor": null}."""
    queues: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        doc = api.get("/queues", {"limit": page, "cursor": cursor} if cursor else {"limit": page})
        queues += doc["queues"]
        cursor = doc.get("next_cursor")
        if not cursor:
            return {"queues": queues, "next_cursor": None}


def cmd_queues(args: argparse.Namespace, api: ApiClient) -> int:
    doc = all_queues(api, args.page_size)
    if args.json:
        print_json(doc)
        return EXIT_OK
    if not doc["queues"]:
        print("no queues yet: a queue appears with its first job", file=sys.stderr)
        return EXIT_OK
    print_lines(queue_table(doc["queues"]))
    return EXIT_OK


def queue_table(queues: list[dict[str, Any]]) -> list[str]:
    headers = ["QUEUE", "STATE", "READY", "SCHEDULED", "WAITING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED",
               "OLDEST READY"]  # fmt: skip
    rows = []
    for q in queues:
        c = q["counts"]
        state = "paused" if q["paused"] else "active"
        age = duration(q["oldest_ready_age_seconds"])
        rows.append([q["queue"], state, c["ready"], c["scheduled"], c["waiting"], c["running"], c["completed"],
                     c["failed"], c["cancelled"], age])  # fmt: skip
    return table(headers, rows, numeric=range(2, 10))


# -- stats ------------------------------------------------------------------------------------------------------


def cmd_stats(args: argparse.Namespace, api: ApiClient) -> int:
    path = f"/queues/{segment(args.queue)}/stats"
    query = {"window_seconds": args.window}
    if not args.watch:
        doc = api.get(path, query)
        if args.json:
            print_json(doc)
        else:
            print_lines(stats_lines(doc))
        return EXIT_OK
    clear = sys.stdout.isatty() and not args.json
    try:
        while True:
            try:
                doc = api.get(path, query)
            except ApiError as exc:
                if exit_code(exc) != EXIT_FAILURE:
                    raise  # a refusal (bad queue name, key): asking again will not change it
                # Unreachable or a 5xx: the service may be restarting; keep watching.
                print(problem_line(exc, api.url, args.queue), file=sys.stderr, flush=True)
            else:
                if args.json:
                    print_json(doc, compact=True)  # one document a line
                else:
                    head = f"every {args.interval:g}s; Ctrl-C to stop"
                    print_lines([_CLEAR + head if clear else head, *stats_lines(doc), ""])
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK  # how a watch is meant to end


def stats_lines(s: dict[str, Any]) -> list[str]:
    c, w, d = s["counts"], s["window"], s["window"]["duration"]
    state = "paused: claims get nothing" if s["paused"] else "active"
    rate = f"{w['completions_per_minute']:g}/min"
    return [
        f"{s['queue']} ({state}), as of {s['as_of']}",
        f"  now         ready {c['ready']}  scheduled {c['scheduled']}  waiting {c['waiting']}  "
        f"running {c['running']}  completed {c['completed']}  failed {c['failed']}  cancelled {c['cancelled']}",
        f"              oldest ready {duration(s['oldest_ready_age_seconds'])}  "
        f"on last attempt {s['jobs_on_last_attempt']}  one attempt left {s['jobs_one_attempt_left']}",
        f"  {'last ' + duration(w['seconds']):<10}  enqueued {w['enqueued']}  claimed {w['claimed']}  "
        f"completed {w['completed']} ({rate})  retries {w['retries']}  failures {w['failures']}",
        f"              lease expired {w['lease_expired']}  cancelled {w['cancelled']}  released {w['released']}  "
        f"empty claims with jobs ready {w['empty_claims_with_ready_jobs']}",
        f"  durations   p50 {millis(d['p50_ms'])}  p95 {millis(d['p95_ms'])}  max {millis(d['max_ms'])}  "
        f"(claim to completion, {d['count']} job(s))",
    ]


# -- redrive, pause, resume ----------------------------------------------------------------------------------


def cmd_redrive(args: argparse.Namespace, api: ApiClient) -> int:
    body: dict[str, Any] = {"dry_run": args.dry_run}
    if args.error_contains is not None:
        body["error_contains"] = args.error_contains
    if args.limit is not None:
        body["limit"] = args.limit
    doc = api.post(f"/queues/{segment(args.queue)}/redrive", body)
    if args.json:
        print_json(doc)
    elif doc["dry_run"]:
        print(f"{doc['queue']}: {doc['jobs']} failed job(s) would be redriven (dry run: nothing moved)")
    else:
        print(f"{doc['queue']}: {doc['jobs']} failed job(s) redriven: pending again, attempts reset")
    return EXIT_OK


def _set_paused(args: argparse.Namespace, api: ApiClient, action: str) -> int:
    doc = api.post(f"/queues/{segment(args.queue)}/{action}")
    if args.json:
        print_json(doc)
    elif doc["paused"]:
        print(f"{doc['queue']}: paused (it still accepts jobs; claims get none until `jobq resume`)")
    else:
        print(f"{doc['queue']}: active (claims get jobs again)")
    return EXIT_OK


def cmd_pause(args: argparse.Namespace, api: ApiClient) -> int:
    return _set_paused(args, api, "pause")


def cmd_resume(args: argparse.Namespace, api: ApiClient) -> int:
    return _set_paused(args, api, "resume")


# -- arguments ------------------------------------------------------------------------------------------------


# -- queues config ---------------------------------------------------------------------------------------------

CONFIG_KEYS = (
    "max_attempts, backoff_base_seconds, backoff_max_seconds, lease_seconds, default_priority, "
    "retention.completed, retention.failed, retention.cancelled, concurrency, rate (LIMIT/SECONDS), "
    "group_concurrency, group_rate (LIMIT/SECONDS), fair, ordered, max_pending, timeout_seconds"
)


def parse_value(key: str, text: str) -> Any:
    """`null` clears; LIMIT/SECONDS for rates; otherwise a JSON value (a bare word stays a string, so that
    the server's 422 names what is wrong with it)."""
    if text == "null":
        return None
    if key in ("rate", "group_rate") and "/" in text:
        limit, _, per = text.partition("/")
        return {"limit": parse_value("", limit), "per_seconds": parse_value("", per)}
    try:
        return json.loads(text)
    except ValueError:
        return text


def patch_of(settings: list[str]) -> dict[str, Any]:
    """The PATCH /queues/{queue}/config body that `--set key=value ...` stands for."""
    body: dict[str, Any] = {}
    for item in settings:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected key=value")
        value = parse_value(key, text)
        if key.startswith("retention."):
            body.setdefault("retention", {})[key.removeprefix("retention.")] = value
        else:
            body[key] = value
    return body


def config_lines(doc: dict[str, Any]) -> list[str]:
    def shown(value: Any) -> str:
        if value is None:
            return "- (global)"
        if isinstance(value, dict):
            return f"{value['limit']}/{value['per_seconds']}s" if "limit" in value else json.dumps(value)
        return json.dumps(value)

    rows = [[key, shown(value)] for key, value in doc.items() if key not in ("queue", "retention")]
    rows += [[f"retention.{k}", shown(v)] for k, v in doc["retention"].items()]
    return [f"queue {doc['queue']}", *table(["FIELD", "VALUE"], rows)]


def cmd_queue_config(args: argparse.Namespace, api: ApiClient) -> int:
    path = f"/queues/{segment(args.queue)}/config"
    try:
        body = patch_of(args.set) if args.set else None
    except ValueError as exc:
        print(f"jobq: {exc}", file=sys.stderr)
        return EXIT_USAGE
    doc = api.patch(path, body) if body is not None else api.get(path)
    if args.json:
        print_json(doc)
    else:
        print_lines(config_lines(doc))
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Actions on one queue (`jobq queues ACTION QUEUE ...`) hang below this parser: keep it, add
    # actions = parser.add_subparsers(dest="queues_command", metavar="ACTION") and, for each,
    # add_api_command(actions, "NAME", cmd_NAME, ...); without an action, `jobq queues` still lists.
    queues = add_api_command(
        sub,
        "queues",
        cmd_queues,
        help="every queue with its counts (a table)",
        description="List every queue (those the API key may see) with its jobs by status, the age of its "
        "oldest ready job and whether it is paused, following GET /queues a page at a time. Needs an admin key "
        "when authentication is on.",
        examples="  jobq queues\n  jobq queues --json | jq '.queues[] | select(.counts.failed > 0) | .queue'",
    )
    queues.add_argument("--page-size", type=_int_in(1, 1000), default=QUEUES_PAGE, metavar="N",
                        help=f"queues per request (default {QUEUES_PAGE})")  # fmt: skip
    actions = queues.add_subparsers(dest="queues_command", metavar="ACTION")
    config = add_api_command(
        actions,
        "config",
        cmd_queue_config,
        help="show a queue's configuration (defaults and limits), or change it with --set",
        description="Show a queue's configuration, as GET /queues/{queue}/config answers, or change fields "
        f"with --set key=value, as PATCH /queues/{{queue}}/config does. Keys: {CONFIG_KEYS}. `null` clears a "
        "field back to the global setting. A change reaches every running jobq process at once. Needs an "
        "admin key when authentication is on; a refused value exits 2 with the server's reason.",
        examples="  jobq queues config emails\n  jobq queues config emails --set concurrency=20 --set rate=100/60\n"
        "  jobq queues config emails --set group_concurrency=1 --set ordered=true\n"
        "  jobq queues config emails --set retention.completed=3600 --set max_attempts=null",
    )
    config.add_argument("queue", metavar="QUEUE")
    config.add_argument("--set", action="append", metavar="KEY=VALUE", help="repeat for several fields")

    stats = add_api_command(
        sub,
        "stats",
        cmd_stats,
        help="one queue's health: backlog, throughput, failures, durations",
        description="Show a queue's statistics: jobs by status now, the oldest ready job's age, jobs near "
        "their last attempt, and over the last window (default 5 minutes) what was enqueued, claimed, "
        "completed, retried and failed, with claim-to-completion percentiles. --watch shows them again every "
        "--interval seconds until Ctrl-C (with --json: one document a line). While watching, a service that "
        "does not answer is reported and asked again.",
        examples="  jobq stats emails\n  jobq stats emails --watch --interval 5\n"
        "  jobq stats emails --json | jq .window.failures",
    )
    stats.add_argument("queue", metavar="QUEUE")
    stats.add_argument("--watch", "-w", action="store_true", help="show the figures again every --interval")
    stats.add_argument(
        "--interval", type=_number_in(0.5, 3600), default=2.0, metavar="SECONDS", help="with --watch (default 2)"
    )
    stats.add_argument(
        "--window", type=_int_in(60, 3600), metavar="SECONDS", help="length of the window (default: the server's, 300)"
    )

    redrive = add_api_command(
        sub,
        "redrive",
        cmd_redrive,
        help="send a queue's failed jobs back to pending",
        description="Send the failed jobs (the dead-letter set) of a queue back to pending with their attempts "
        "reset, oldest first. --dry-run only counts them.",
        examples='  jobq redrive emails --dry-run\n  jobq redrive emails --error-contains "SMTP 451" --limit 100',
    )
    redrive.add_argument("queue", metavar="QUEUE")
    redrive.add_argument("--dry-run", action="store_true", help="count the jobs, move nothing")
    redrive.add_argument("--error-contains", metavar="TEXT", help="only jobs whose last error contains TEXT")
    redrive.add_argument("--limit", type=_int_in(1, 1_000_000), help="at most this many jobs")

    for name, command, text in (
        ("pause", cmd_pause, "pause a queue: it accepts jobs, claims get none"),
        ("resume", cmd_resume, "resume a paused queue"),
    ):
        parser = add_api_command(
            sub,
            name,
            command,
            help=text,
            description=text[0].upper() + text[1:] + ". Waiting long-polls keep waiting while a queue is paused "
            "and get jobs once it is resumed.",
        )
        parser.add_argument("queue", metavar="QUEUE")
