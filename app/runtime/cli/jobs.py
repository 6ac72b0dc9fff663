"""Daily work on jobs, over the HTTP API: `jobq enqueue QUEUE PAYLOAD`, `jobq jobs QUEUE`, `jobq job ID`,
`jobq retry ID...`, `jobq cancel ID...`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from app.runtime.api_client import ApiClient, ApiError, segment
from app.runtime.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, _fail, _int_in, _number_in
from app.runtime.cli.output import one_line, print_json, print_lines, relative, table
from app.runtime.cli.remote import EXIT_DENIED, add_api_command, exit_code, problem_line

INT64_MAX = 2**63 - 1
STATUSES = ("pending", "waiting", "running", "completed", "failed", "cancelled")
PAGE_MAX = 500  # the server's largest page (GET /queues/{queue}/jobs?limit=)

_job_id = _int_in(1, INT64_MAX)


# -- enqueue -------------------------------------------------------------------------------------------------


def cmd_enqueue(args: argparse.Namespace, api: ApiClient) -> int:
    text = sys.stdin.read() if args.payload == "-" else args.payload
    try:
        payload = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        hint = " (a string is quoted: '\"hello\"')" if text.strip() and text.strip()[0] not in '{["' else ""
        return _fail(f"enqueue: PAYLOAD is not JSON: {exc}{hint}", EXIT_USAGE)
    body: dict[str, Any] = {"payload": payload}
    for name in ("priority", "delay_seconds", "run_at", "max_attempts", "idempotency_key", "depends_on"):
        if (value := getattr(args, name)) is not None:
            body[name] = value
    unique = {
        name: value
        for name, value in (("key", args.unique_key), ("for_seconds", args.unique_for), ("while", args.unique_while))
        if value is not None
    }
    if unique or args.unique:
        body["unique"] = unique
    if (args.debounce_seconds is not None or args.debounce_max_wait is not None) and args.debounce is None:
        return _fail("enqueue: --debounce-seconds and --debounce-max-wait go with --debounce KEY", EXIT_USAGE)
    if args.debounce is not None:
        if args.debounce_seconds is None:
            return _fail("enqueue: --debounce KEY needs --debounce-seconds", EXIT_USAGE)
        body["debounce"] = {"key": args.debounce, "seconds": args.debounce_seconds}
        if args.debounce_max_wait is not None:
            body["debounce"]["max_wait_seconds"] = args.debounce_max_wait
    if args.on_dependency_failure is not None:
        if not args.depends_on:
            return _fail("enqueue: --on-dependency-failure goes with --depends-on", EXIT_USAGE)
        body["on_dependency_failure"] = args.on_dependency_failure
    status, job = api.answer("POST", f"/queues/{segment(args.queue)}/jobs", body)
    if args.json:
        print_json(job)
    elif status == 200 and job.get("debounce"):
        print(f"job {job['id']} on {job['queue']} replaced: debounce key {job['debounce']['key']!r}, now "
              f"{_due(job)}")  # fmt: skip
    elif status == 200 and job.get("unique"):
        print(f"job {job['id']} already exists on {job['queue']} with unique key {job['unique']['key']!r} "
              f"({job['status']}); nothing enqueued")  # fmt: skip
    elif status == 200:
        print(f"job {job['id']} already exists on {job['queue']} with idempotency key {job['idempotency_key']!r} "
              f"({job['status']}); nothing enqueued")  # fmt: skip
    elif job["status"] == "waiting":
        print(f"job {job['id']} enqueued on {job['queue']} (waiting for {job['pending_dependencies']} of its "
              f"dependencies to complete)")  # fmt: skip
    elif job["status"] == "cancelled":
        print(f"job {job['id']} enqueued on {job['queue']} and cancelled at once: {job['last_error']}")
    else:
        print(f"job {job['id']} enqueued on {job['queue']} ({_due(job)})")
    return EXIT_OK


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _due(job: dict[str, Any]) -> str:
    when = relative(job["run_at"])
    return "due now" if when in ("now",) or when.endswith(" ago") else f"due {when}"


# -- jobs, job -----------------------------------------------------------------------------------------------


def cmd_jobs(args: argparse.Namespace, api: ApiClient) -> int:
    path = f"/queues/{segment(args.queue)}/jobs"
    jobs: list[dict[str, Any]] = []
    cursor = args.cursor
    while len(jobs) < args.limit:
        page = api.get(path, {"status": args.status, "limit": min(PAGE_MAX, args.limit - len(jobs)), "cursor": cursor})
        jobs.extend(page["jobs"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    if args.json:
        print_json({"jobs": jobs, "next_cursor": cursor})
        return EXIT_OK
    what = f"{args.status} jobs" if args.status else "jobs"
    if not jobs:
        print(f"no {what} on {args.queue}", file=sys.stderr)
        return EXIT_OK
    print_lines(job_table(jobs))
    if cursor is not None:
        again = f"jobq jobs {args.queue}" + (f" --status {args.status}" if args.status else "")
        print(f"more {what}: {again} --cursor {cursor}", file=sys.stderr)
    return EXIT_OK


def job_table(jobs: list[dict[str, Any]]) -> list[str]:
    headers = ["ID", "STATUS", "ATTEMPTS", "PRIORITY", "CREATED", "RUN AT", "WORKER", "LAST ERROR"]
    rows = [
        [
            j["id"],
            j["status"],
            f"{j['attempts']}/{j['max_attempts']}",
            j["priority"],
            relative(j["created_at"]),
            relative(j["run_at"]) if j["status"] == "pending" else None,
            j["worker"],
            one_line(j["last_error"], 60),
        ]
        for j in jobs
    ]
    return table(headers, rows, numeric=(0, 2, 3))


def cmd_job(args: argparse.Namespace, api: ApiClient) -> int:
    job = api.get(f"/jobs/{args.id}")
    if args.json:
        print_json(job)
    else:
        print_lines(job_lines(job))
    return EXIT_OK


def job_lines(j: dict[str, Any]) -> list[str]:
    fields = [
        ("status", j["status"]),
        ("attempts", f"{j['attempts']} of {j['max_attempts']}"),
        ("priority", j["priority"]),
        ("created", _at(j["created_at"])),
        ("run at", _at(j["run_at"])),
        ("claimed", _at(j["claimed_at"])),
        ("lease until", _at(j["lease_expires_at"])),
        ("finished", _at(j["finished_at"])),
        ("worker", j["worker"]),
        ("idempotency key", j["idempotency_key"]),
        ("group", j.get("group")),
    ]
    if j.get("depends_on"):
        fields.append(("depends on", " ".join(str(i) for i in j["depends_on"])))
        fields.append(("if one fails", j["on_dependency_failure"]))
        fields.append(("waiting for", j["pending_dependencies"]))
    if (unique := j.get("unique")) is not None:
        fields.append(("unique key", unique["key"]))
        fields.append(("unique while", " ".join(unique["while"])))
        if unique["window_start"] is not None:
            fields.append(("unique window", f"{_at(unique['window_start'])} to {_at(unique['window_end'])}"))
    if (debounce := j.get("debounce")) is not None:
        fields.append(("debounce key", debounce["key"]))
        wait = f", at most {debounce['max_wait_seconds']:g} s after the first" if debounce["max_wait_seconds"] else ""
        fields.append(("debounce", f"{debounce['seconds']:g} s after the latest enqueue{wait}"))
    if j.get("traceparent"):
        fields.append(("traceparent", j["traceparent"]))
    lines = [f"job {j['id']} on {j['queue']}"]
    lines += [f"  {name:<16}{value}" for name, value in fields if value is not None]
    if j["last_error"] is not None:
        lines += ["  last error", *("    " + line for line in j["last_error"].splitlines())]
    for name in ("progress", "payload", "result"):
        if name == "progress" and j.get(name) is None:
            continue
        text = json.dumps(j[name], indent=2, ensure_ascii=False)
        lines += [f"  {name}", *("    " + line for line in text.splitlines())]
    return lines


def _at(text: str | None) -> str | None:
    return None if text is None else f"{text} ({relative(text)})"


# -- retry, cancel ---------------------------------------------------------------------------------------------


def _each(args: argparse.Namespace, api: ApiClient, action: str, body: Any, done: str) -> int:
    """Apply an action to each id in turn. A job it cannot apply to is reported and the next is tried; an
    answer that every other id would get too (no service, no permission) stops here. The exit code is
    the first failure's."""
    first_failure = EXIT_OK
    changed = []
    for job_id in args.ids:
        try:
            job = api.post(f"/jobs/{job_id}/{action}", *([] if body is None else [body]))
        except ApiError as exc:
            print(problem_line(exc, api.url, f"job {job_id}"), file=sys.stderr)
            code = exit_code(exc)
            first_failure = first_failure or code
            if code in (EXIT_FAILURE, EXIT_DENIED):
                if job_id != args.ids[-1]:
                    print(f"jobq: stopped; not tried: {' '.join(map(str, args.ids[args.ids.index(job_id) + 1:]))}",
                          file=sys.stderr)  # fmt: skip
                break
            continue
        changed.append(job)
        if not args.json:
            print(f"job {job['id']} {done} ({job['status']})")
    if args.json:
        print_json(changed)
    return first_failure


def cmd_retry(args: argparse.Namespace, api: ApiClient) -> int:
    return _each(args, api, "retry", None, "retried: pending again, attempts reset")


def cmd_cancel(args: argparse.Namespace, api: ApiClient) -> int:
    body = {"reason": args.reason} if args.reason is not None else None
    return _each(args, api, "cancel", body, "cancelled")


# -- arguments ------------------------------------------------------------------------------------------------


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    enqueue = add_api_command(
        sub,
        "enqueue",
        cmd_enqueue,
        help="add a job to a queue",
        description="Enqueue a job. PAYLOAD is JSON (`-` reads it from standard input); a plain string is "
        "quoted: '\"hello\"'. With --idempotency-key, a key already used on the queue names the existing "
        "job and nothing is added. Needs a produce (or admin) key when authentication is on.",
        examples='  jobq enqueue emails \'{"to": "ada@example.com"}\' --priority 5\n'
        "  jobq enqueue reports '{\"month\": 11}' --delay 3600 --idempotency-key report-11\n"
        "  jobq enqueue publish '{\"issue\": 7}' --depends-on 41 --depends-on 42\n"
        "  jobq enqueue digests '{\"customer\": 7}' --unique-key digest-7 --unique-for 3600\n"
        "  jobq enqueue search '{\"doc\": 9}' --debounce reindex-9 --debounce-seconds 10 --debounce-max-wait 60\n"
        "  id=$(jobq enqueue emails '{}' --json | jq .id)",
    )
    enqueue.add_argument("queue", metavar="QUEUE")
    enqueue.add_argument("payload", metavar="PAYLOAD", help="the job's payload, JSON; - reads standard input")
    enqueue.add_argument("--priority", type=int, help="higher is claimed first (default 0)")
    when = enqueue.add_mutually_exclusive_group()
    when.add_argument("--delay", dest="delay_seconds", type=_number_in(0, 1e12), metavar="SECONDS",
                      help="claimable after this long")  # fmt: skip
    when.add_argument("--run-at", metavar="TIME", help="claimable from this RFC 3339 time, e.g. 2026-12-01T09:00:00Z")
    enqueue.add_argument("--max-attempts", type=int, metavar="N", help="default: the server's (5)")
    enqueue.add_argument("--idempotency-key", metavar="KEY", help="a repeat on the queue names the existing job")
    enqueue.add_argument("--depends-on", type=_job_id, action="append", metavar="ID",
                         help="run only after job ID has completed (repeat for several)")  # fmt: skip
    enqueue.add_argument("--unique", action="store_true",
                         help="at most one such job: a repeat returns the job holding its key")  # fmt: skip
    enqueue.add_argument(
        "--unique-key", metavar="KEY", help="the unique key (implies --unique; default: a hash of the payload)"
    )
    enqueue.add_argument("--unique-for", type=_int_in(1, 31_622_400), metavar="SECONDS",
                         help="the key holds within aligned windows of this length (implies --unique)")  # fmt: skip
    enqueue.add_argument("--unique-while", choices=STATUSES, action="append", metavar="STATE",
                         help="a state in which a job holds the key (repeat; implies --unique)")  # fmt: skip
    enqueue.add_argument("--debounce", metavar="KEY",
                         help="replace the pending job with this key instead of adding one")  # fmt: skip
    enqueue.add_argument("--debounce-seconds", type=_number_in(0, 31_622_400), metavar="SECONDS",
                         help="with --debounce: run this long after the latest enqueue")  # fmt: skip
    enqueue.add_argument("--debounce-max-wait", type=_number_in(0, 31_622_400), metavar="SECONDS",
                         help="with --debounce: at most this long after the first enqueue")  # fmt: skip
    enqueue.add_argument("--on-dependency-failure", choices=("cancel", "run"),
                         help="a dependency failed or was cancelled: cancel this job (default), or run it")  # fmt: skip

    jobs = add_api_command(
        sub,
        "jobs",
        cmd_jobs,
        help="a queue's jobs (a table)",
        description="List a queue's jobs: pending ones in claim order, running ones by lease expiry, finished "
        "ones newest first; all statuses together newest first. Shows --limit jobs, following the server's "
        "pages; when more are left, says how to get the next ones (--cursor). Needs an admin key when "
        "authentication is on.",
        examples="  jobq jobs emails --status failed\n  jobq jobs emails --status failed --json | jq '.jobs[].id'",
    )
    jobs.add_argument("queue", metavar="QUEUE")
    jobs.add_argument("--status", choices=STATUSES, help="only jobs in this status")
    jobs.add_argument("--limit", type=_int_in(1, 100_000), default=50, help="how many jobs (default 50)")
    jobs.add_argument("--cursor", help="start where a previous listing stopped")

    job = add_api_command(
        sub,
        "job",
        cmd_job,
        help="one job: status, attempts, times, error, payload, result",
        description="Show one job (never its claim token). Any key with a job scope may read the jobs of its queues.",
        examples="  jobq job 42\n  jobq job 42 --json | jq .last_error",
    )
    job.add_argument("id", type=_job_id, metavar="ID")

    retry = add_api_command(
        sub,
        "retry",
        cmd_retry,
        help="run failed, cancelled or completed jobs again",
        description="Send each failed, cancelled or completed job back to pending, its attempts reset (a "
        "completed job runs again with the same payload: a replay). Each id is tried "
        "in turn; one that cannot be retried (no such job, another status) is reported and the rest are "
        "still tried. With --json, prints the jobs retried.",
        examples="  jobq retry 42 43\n  jobq jobs emails --status failed --json | jq '.jobs[].id' | xargs jobq retry",
    )
    retry.add_argument("ids", type=_job_id, nargs="+", metavar="ID")

    cancel = add_api_command(
        sub,
        "cancel",
        cmd_cancel,
        help="cancel pending or running jobs",
        description="Cancel each job. A pending job is cancelled at once; a running one too, and its worker "
        "learns it at its next heartbeat. A finished job cannot be cancelled (exit code 3). Each id is "
        "tried in turn; with --json, prints the jobs cancelled.",
        examples='  jobq cancel 42\n  jobq cancel 42 43 --reason "sent by mistake"',
    )
    cancel.add_argument("ids", type=_job_id, nargs="+", metavar="ID")
    cancel.add_argument("--reason", help="kept as the job's last error")
