"""The worker registry over the HTTP API: `jobq workers` (live workers and those gone recently) and
`jobq workers NAME` (one worker and the jobs it holds)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from app.runtime.api_client import ApiClient, segment
from app.runtime.cli.common import EXIT_OK
from app.runtime.cli.output import print_json, print_lines, relative, table
from app.runtime.cli.remote import add_api_command


def cmd_workers(args: argparse.Namespace, api: ApiClient) -> int:
    if args.name is not None:
        doc = api.get(f"/workers/{segment(args.name)}")
        if args.json:
            print_json(doc)
        else:
            print_lines(worker_lines(doc))
        return EXIT_OK
    doc = api.get("/workers", {"limit": args.limit})
    if args.json:
        print_json(doc)
        return EXIT_OK
    if not doc["workers"]:
        print("no workers seen yet: a worker appears with its first claim", file=sys.stderr)
        return EXIT_OK
    print_lines(worker_table(doc["workers"]))
    return EXIT_OK


def _sdk(w: dict[str, Any]) -> str:
    return " ".join(p for p in (w["sdk"], w["version"]) if p) or "-"


def worker_table(workers: list[dict[str, Any]]) -> list[str]:
    headers = ["WORKER", "STATE", "QUEUES", "SDK", "HOST", "HELD", "DONE 1H", "FAILED 1H", "LAST SEEN"]
    rows = [
        [
            w["name"],
            w["state"],
            ",".join(w["queues"]),
            _sdk(w),
            w["host"] or "-",
            w["jobs_held"],
            w["completed_last_hour"],
            w["failed_last_hour"],
            relative(w["last_seen"]),
        ]
        for w in workers
    ]
    return table(headers, rows, numeric=range(5, 8))


def worker_lines(w: dict[str, Any]) -> list[str]:
    fields = [
        ("state", w["state"]),
        ("queues", ", ".join(w["queues"])),
        ("sdk", _sdk(w)),
        ("host", w["host"] or "-"),
        ("first seen", f"{w['first_seen']} ({relative(w['first_seen'])})"),
        ("last seen", f"{w['last_seen']} ({relative(w['last_seen'])})"),
        ("last hour", f"{w['completed_last_hour']} completed, {w['failed_last_hour']} failed"),
        ("holds", f"{w['jobs_held']} jobs"),
    ]
    lines = [f"worker {w['name']}"] + [f"  {name:<12}{value}" for name, value in fields]
    if w["jobs"]:
        lines.append("")
        rows = [[j["id"], j["queue"], f"{j['attempts']}/{j['max_attempts']}", relative(j["claimed_at"]),
                 relative(j["lease_expires_at"])] for j in w["jobs"]]  # fmt: skip
        lines += table(["JOB", "QUEUE", "ATTEMPT", "CLAIMED", "LEASE UNTIL"], rows, numeric=[0])
    return lines


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    workers = add_api_command(
        sub,
        "workers",
        cmd_workers,
        help="live workers and those gone recently; or one worker and the jobs it holds",
        description="List the workers seen recently (GET /workers): live ones first (holding a lease, or seen "
        "within JOBQ_WORKER_GONE_SECONDS), each with its queues, SDK, host, the jobs it holds and what it "
        "completed and failed in the last hour. With NAME, that worker and the jobs it holds now. Needs an "
        "admin key when authentication is on.",
        examples="  jobq workers\n  jobq workers web-1-4242\n  jobq workers --json | jq '.workers[].name'",
    )
    workers.add_argument("name", nargs="?", metavar="NAME", help="one worker, with the jobs it holds")
    workers.add_argument("--limit", type=int, default=200, help="most workers listed (1-1000)")
