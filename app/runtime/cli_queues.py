"""`jobq queues config QUEUE [--set key=value ...]`: read or change a queue's configuration in the database,
as PATCH /queues/{queue}/config does (same checks, same notification to every running process)."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from typing import Any

EXAMPLES = """examples:
  jobq queues config emails                                   # show it
  jobq queues config emails --set concurrency=20 --set rate=100/60
  jobq queues config emails --set group_concurrency=1 --set ordered=true
  jobq queues config emails --set retention.completed=3600 --set max_attempts=null   # null: the global setting"""

KEYS = (
    "max_attempts, backoff_base_seconds, backoff_max_seconds, lease_seconds, default_priority, "
    "retention.completed, retention.failed, retention.cancelled, concurrency, rate (LIMIT/SECONDS), "
    "group_concurrency, group_rate (LIMIT/SECONDS), fair, ordered"
)


def parse_value(key: str, text: str) -> Any:
    """`null` clears; LIMIT/SECONDS for rates; otherwise a JSON value (a bare word stays a string, so that
    the request model names what is wrong with it)."""
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
    """The PATCH body that `--set key=value ...` stands for."""
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


async def _run(url: str, queue: str, body: dict[str, Any] | None) -> dict[str, Any]:
    import psycopg

    from app.core.flow import changes_of, check, merged
    from app.db import flow as store_flow
    from app.http.documents import config_document
    from app.models.flow import QueueConfigPatch
    from app.settings import Settings

    async with await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=10) as conn:
        if body is None:
            return config_document(queue, await store_flow.queue_config_get(conn, queue))
        patch = QueueConfigPatch.model_validate(body)
        async with conn.transaction():
            current = await store_flow.queue_config_lock(conn, queue)
            values = merged(current, changes_of(patch))
            check(Settings(), values)
            row = await store_flow.queue_config_set(conn, queue, values)
        return config_document(queue, row)


def cmd_queues(args: argparse.Namespace) -> int:
    import psycopg
    from pydantic import ValidationError

    from app.errors import ValidationFailed
    from app.models.jobs import QUEUE_PATTERN

    url = args.database_url or _env_url()
    if not url:
        print("jobq queues: set JOBQ_DATABASE_URL or pass --database-url", file=sys.stderr)
        return 2
    if not re.match(QUEUE_PATTERN, args.queue):
        print(f"jobq queues config: {args.queue!r} is not a queue name ([A-Za-z0-9_.:-]{{1,128}})", file=sys.stderr)
        return 2
    try:
        body = patch_of(args.set) if args.set else None
        doc = asyncio.run(_run(url, args.queue, body))
    except ValueError as exc:
        print(f"jobq queues config: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            print(f"jobq queues config: {where}: {err['msg']}", file=sys.stderr)
        return 2
    except ValidationFailed as exc:
        print(f"jobq queues config: {exc.detail}", file=sys.stderr)
        return 2
    except psycopg.errors.UndefinedColumn:
        print("jobq queues config: the database schema is older than this jobq; run `jobq migrate` first",
              file=sys.stderr)  # fmt: skip
        return 1
    except psycopg.Error as exc:
        print(f"jobq queues config: {str(exc).strip()}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2, default=str))
    return 0


def _env_url() -> str | None:
    from app.runtime.cli import _settings

    return _settings().database_url


def add_parser(sub: Any) -> None:
    """`jobq queues ...` on the command's subparsers."""
    from app.runtime.cli import _Formatter

    queues = sub.add_parser(
        "queues",
        help="read or change a queue's configuration",
        description="Queue configuration in the database: defaults and flow-control limits. A change reaches "
        "every running jobq process at once.",
    )
    qsub = queues.add_subparsers(dest="queues_command", required=True, metavar="ACTION")
    config = qsub.add_parser(
        "config",
        formatter_class=_Formatter,
        help="show a queue's configuration, or change it with --set",
        description="Show a queue's configuration (JSON, as GET /queues/{queue}/config answers), or change "
        f"fields with --set key=value, as PATCH /queues/{{queue}}/config does. Keys: {KEYS}. A value of "
        "`null` clears the field back to the global setting. Exit code 2 when a value is refused.",
        epilog=EXAMPLES,
    )
    config.add_argument("queue", help="the queue's name")
    config.add_argument("--set", action="append", metavar="KEY=VALUE", help="repeat for several fields")
    config.add_argument("--database-url", help="default: JOBQ_DATABASE_URL")
    config.set_defaults(func=cmd_queues)
