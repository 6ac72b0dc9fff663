"""What every SQS action reads: its parameters (in the JSON protocol's shape, with SQS's rules), the queue it
addresses, and whether the caller may; the Call an action runs with."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.types import Receive, Scope

from app.auth.policy import KeyScope, Principal, client_identity
from app.core.sqs import NoSuchQueue, SqsService
from app.db.sqs import SqsQueueRow
from app.settings import Settings
from app.sqs.errors import (
    AccessDenied,
    BatchEntryIdsNotDistinct,
    EmptyBatchRequest,
    InvalidBatchEntryId,
    InvalidParameterValue,
    MissingParameter,
    QueueDoesNotExist,
    SqsError,
    TooManyEntriesInBatchRequest,
)

ACCOUNT = "000000000000"  # the account id in queue URLs and ARNs: jobq has no accounts
REGION = "us-east-1"  # the region in ARNs (the SDKs sign for theirs; jobq has one)
MAX_BATCH = 10
MAX_RECEIVE = 10
MAX_WAIT = 20
MAX_VISIBILITY = 43_200
MAX_ATTRIBUTES = 10
MAX_TAGS = 50

Params = dict[str, Any]
Result = dict[str, Any]

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")


@dataclass(slots=True)
class Call:
    """One SQS request as the actions see it. What only some actions need is worked out when they ask."""

    sqs: SqsService
    settings: Settings
    who: Principal
    base_url: str  # scheme://host the request was sent to: queue URLs are built on it
    path_queue: str | None  # the queue of a request POSTed to its queue URL
    scope: Scope
    receive: Receive
    job_context: Callable[[Scope], str | None]  # the trace context an enqueue stores (Services.job_context)

    def client(self) -> str:
        """Whose share of the long-poll places this is (app/auth/policy.py client_identity)."""
        return client_identity(Request(self.scope, self.receive))

    async def disconnected(self) -> None:
        """Ends when the client goes away (its body was read whole: the next message is the disconnect)."""
        while (await self.receive())["type"] != "http.disconnect":
            pass

    def still_authorized(self) -> Callable[[], Awaitable[bool]] | None:
        recheck: Callable[[], Awaitable[bool]] | None = self.scope.get("state", {}).get("recheck")
        return recheck

    def traceparent(self) -> str | None:
        return self.job_context(self.scope)


# --- reading parameters -----------------------------------------------------------------------------------


def read_str(p: Params, name: str, *, required: bool = False) -> str | None:
    value = p.get(name)
    if value is None:
        if required:
            raise MissingParameter(f"The request must contain the parameter {name}.")
        return None
    if not isinstance(value, str):
        raise InvalidParameterValue(f"Value for parameter {name} is invalid: it must be a string.")
    return value


def read_int(p: Params, name: str, low: int, high: int) -> int | None:
    value = p.get(name)
    if value is None:
        return None
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,12}", value.strip()):
        number = int(value)
    if number is None or not low <= number <= high:
        raise InvalidParameterValue(
            f"Value {value} for parameter {name} is invalid. Reason: must be between {low} and {high}."
        )
    return number


def read_list(p: Params, name: str) -> list[str]:
    value = p.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidParameterValue(f"Value for parameter {name} is invalid: it must be a list of strings.")
    return value


def read_map(p: Params, name: str) -> dict[str, Any]:
    value = p.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidParameterValue(f"Value for parameter {name} is invalid: it must be a map.")
    return value


def read_strings(p: Params, name: str) -> dict[str, str]:
    value = read_map(p, name)
    if not all(isinstance(v, str) for v in value.values()):
        raise InvalidParameterValue(f"Value for parameter {name} is invalid: its values must be strings.")
    return value


def read_entries(p: Params) -> list[Params]:
    entries = p.get("Entries")
    if entries is None:
        raise MissingParameter("The request must contain the parameter Entries.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidParameterValue("Value for parameter Entries is invalid: it must be a list of entries.")
    if not entries:
        raise EmptyBatchRequest("There should be at least one SendMessageBatchRequestEntry in the request.")
    if len(entries) > MAX_BATCH:
        raise TooManyEntriesInBatchRequest(f"Maximum number of entries per request are {MAX_BATCH}.")
    ids = []
    for e in entries:
        entry_id = e.get("Id")
        if not isinstance(entry_id, str) or not _ENTRY_ID.fullmatch(entry_id):
            raise InvalidBatchEntryId(
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
                "It can be at most 80 letters long."
            )
        ids.append(entry_id)
    if len(set(ids)) != len(ids):
        raise BatchEntryIdsNotDistinct("Two or more batch entries in the request have the same Id.")
    return entries


def failure(entry_id: str, err: SqsError) -> Result:
    return {"Id": entry_id, "SenderFault": err.sender, "Code": err.code, "Message": err.message}


# --- the queue a request addresses -----------------------------------------------------------------------


def queue_url(call: Call, name: str) -> str:
    return f"{call.base_url}/{ACCOUNT}/{name}"


def queue_arn(name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"


def name_of_url(url: str) -> str:
    """The queue a QueueUrl names: its path's last segment (`http://host/000000000000/name`, `/name`)."""
    try:
        path = urlsplit(url).path if "://" in url else url
    except ValueError:
        path = ""
    name = path.rstrip("/").rpartition("/")[2]
    if not valid_name(name):
        raise QueueDoesNotExist("The specified queue does not exist.")
    return name


def name_of_arn(arn: str, name: str) -> str:
    parts = arn.split(":")
    # Partition, region and account are checked too: a task's SourceArn is stored and answered as given.
    plain = all(re.fullmatch(r"[A-Za-z0-9-]*", part) for part in parts[1:5]) if len(parts) == 6 else False
    if not plain or parts[0] != "arn" or parts[2] != "sqs" or not valid_name(parts[5]):
        raise InvalidParameterValue(f"Value {arn} for parameter {name} is invalid: not an SQS queue ARN.")
    return parts[5]


def valid_name(name: str) -> bool:
    return _QUEUE_NAME.fullmatch(name.removesuffix(".fifo")) is not None and len(name) <= 80


def authorize(call: Call, scope: KeyScope | None, queue: str | None) -> None:
    who = call.who
    if scope is not None and not who.has(scope):
        raise AccessDenied(f"This key lacks the `{scope}` scope.")
    if scope is None and not who.scopes & {"produce", "consume", "admin"}:
        raise AccessDenied("This key has only the `metrics` scope.")
    if queue is not None and not who.allows(queue):
        raise AccessDenied(f"This key may not use queue `{queue}`.")


async def target(call: Call, p: Params, scope: KeyScope | None) -> SqsQueueRow:
    """The queue a request addresses (QueueUrl, else the URL it was POSTed to), authorised and existing."""
    url = read_str(p, "QueueUrl")
    if url is None and call.path_queue is None:
        raise MissingParameter("The request must contain the parameter QueueUrl.")
    name = name_of_url(url) if url is not None else call.path_queue
    assert name is not None
    authorize(call, scope, name)
    try:
        return await call.sqs.queue(name)
    except NoSuchQueue:
        raise QueueDoesNotExist("The specified queue does not exist.") from None


def is_fifo(row: SqsQueueRow) -> bool:
    return row.queue.endswith(".fifo")


def only_queue(queue: str) -> str:
    """The queue regex that limits a write addressed by job id to this queue (a receipt handle of another
    queue finds nothing), as the SQL's queue guard reads it (app/auth/policy.py)."""
    return f"^{re.escape(queue)}$"


# Queue attributes a client may set, and how each is checked and stored.
