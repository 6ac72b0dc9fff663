"""The SQS actions: SQS's limits and checks, then jobq's services (app/core/sqs.py, JobService, OpsService).

Each action takes the request's parameters in the JSON protocol's shape (app/sqs/wire.py reads the query
protocol into it) and returns its result in that shape. ACTIONS is the table: name -> (scope, handler).
docs/sqs.md says, action by action, what jobq does and where it differs from SQS."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import orjson
from starlette.requests import Request
from starlette.types import Receive, Scope

from app.auth.policy import KeyScope, Principal, client_identity
from app.core.jobs import Renewal
from app.core.sqs import DEFAULTS, NO_REDRIVE_ATTEMPTS, NoSuchQueue, Outgoing, SqsService, queue_config, tags_of
from app.db.rows import ClaimRow
from app.db.sqs import SqsQueueRow
from app.errors import ClaimLost, JobCancelled, JobNotFound
from app.settings import Settings
from app.sqs.digests import md5_of_attributes, md5_of_body
from app.sqs.errors import (
    AccessDenied,
    BatchEntryIdsNotDistinct,
    BatchRequestTooLong,
    EmptyBatchRequest,
    InvalidAttributeName,
    InvalidAttributeValue,
    InvalidBatchEntryId,
    InvalidMessageContents,
    InvalidParameterValue,
    MessageNotInflight,
    MissingParameter,
    QueueDoesNotExist,
    QueueNameExists,
    ReceiptHandleIsInvalid,
    ResourceNotFoundException,
    SqsError,
    TooManyEntriesInBatchRequest,
    UnsupportedOperation,
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
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_DATA_TYPE = re.compile(r"(String|Number|Binary)(\.[^\x00-\x1f]{1,250})?")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")  # a claim token, as app/models/jobs.py ClaimToken
_GROUP = re.compile(r"[!-~]{1,128}")  # SQS: alphanumerics and punctuation
# The characters SQS accepts in a body and in string attributes (XML's): #x9 #xA #xD #x20-#xD7FF
# #xE000-#xFFFD #x10000-#x10FFFF; anything else is refused (jsonb could not hold NUL anyway).
_BAD_CHAR = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


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


def _str(p: Params, name: str, *, required: bool = False) -> str | None:
    value = p.get(name)
    if value is None:
        if required:
            raise MissingParameter(f"The request must contain the parameter {name}.")
        return None
    if not isinstance(value, str):
        raise InvalidParameterValue(f"Value for parameter {name} is invalid: it must be a string.")
    return value


def _int(p: Params, name: str, low: int, high: int) -> int | None:
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


def _list(p: Params, name: str) -> list[str]:
    value = p.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidParameterValue(f"Value for parameter {name} is invalid: it must be a list of strings.")
    return value


def _map(p: Params, name: str) -> dict[str, Any]:
    value = p.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidParameterValue(f"Value for parameter {name} is invalid: it must be a map.")
    return value


def _strings(p: Params, name: str) -> dict[str, str]:
    value = _map(p, name)
    if not all(isinstance(v, str) for v in value.values()):
        raise InvalidParameterValue(f"Value for parameter {name} is invalid: its values must be strings.")
    return value


def _entries(p: Params) -> list[Params]:
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


def _failure(entry_id: str, err: SqsError) -> Result:
    return {"Id": entry_id, "SenderFault": err.sender, "Code": err.code, "Message": err.message}


# --- queues ----------------------------------------------------------------------------------------------


def queue_url(call: Call, name: str) -> str:
    return f"{call.base_url}/{ACCOUNT}/{name}"


def queue_arn(name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"


def _name_of_url(url: str) -> str:
    """The queue a QueueUrl names: its path's last segment (`http://host/000000000000/name`, `/name`)."""
    try:
        path = urlsplit(url).path if "://" in url else url
    except ValueError:
        path = ""
    name = path.rstrip("/").rpartition("/")[2]
    if not _valid_name(name):
        raise QueueDoesNotExist("The specified queue does not exist.")
    return name


def _name_of_arn(arn: str, name: str) -> str:
    parts = arn.split(":")
    if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sqs" or not _valid_name(parts[5]):
        raise InvalidParameterValue(f"Value {arn} for parameter {name} is invalid: not an SQS queue ARN.")
    return parts[5]


def _valid_name(name: str) -> bool:
    return _QUEUE_NAME.fullmatch(name.removesuffix(".fifo")) is not None and len(name) <= 80


def _authorize(call: Call, scope: KeyScope | None, queue: str | None) -> None:
    who = call.who
    if scope is not None and not who.has(scope):
        raise AccessDenied(f"This key lacks the `{scope}` scope.")
    if scope is None and not who.scopes & {"produce", "consume", "admin"}:
        raise AccessDenied("This key has only the `metrics` scope.")
    if queue is not None and not who.allows(queue):
        raise AccessDenied(f"This key may not use queue `{queue}`.")


async def _target(call: Call, p: Params, scope: KeyScope | None) -> SqsQueueRow:
    """The queue a request addresses (QueueUrl, else the URL it was POSTed to), authorised and existing."""
    url = _str(p, "QueueUrl")
    if url is None and call.path_queue is None:
        raise MissingParameter("The request must contain the parameter QueueUrl.")
    name = _name_of_url(url) if url is not None else call.path_queue
    assert name is not None
    _authorize(call, scope, name)
    try:
        return await call.sqs.queue(name)
    except NoSuchQueue:
        raise QueueDoesNotExist("The specified queue does not exist.") from None


def _fifo(row: SqsQueueRow) -> bool:
    return row.queue.endswith(".fifo")


def _only(queue: str) -> str:
    """The queue regex that limits a write addressed by job id to this queue (a receipt handle of another
    queue finds nothing), as the SQL's queue guard reads it (app/auth/policy.py)."""
    return f"^{re.escape(queue)}$"


# Queue attributes a client may set, and how each is checked and stored.
_SETTABLE = {
    "DelaySeconds": ("delay_seconds", 0, 900),
    "MaximumMessageSize": ("maximum_message_size", 1024, 1_048_576),
    "MessageRetentionPeriod": ("retention_seconds", 60, 1_209_600),
    "ReceiveMessageWaitTimeSeconds": ("receive_wait_seconds", 0, MAX_WAIT),
}
# Accepted and not kept: access policies are jobq keys, encryption is the database's, throughput is jobq's.
_IGNORED = frozenset(
    {
        "Policy",
        "RedriveAllowPolicy",
        "KmsMasterKeyId",
        "KmsDataKeyReusePeriodSeconds",
        "SqsManagedSseEnabled",
        "DeduplicationScope",
        "FifoThroughputLimit",
    }
)
_READABLE = (
    "VisibilityTimeout",
    "DelaySeconds",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ReceiveMessageWaitTimeSeconds",
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
    "RedrivePolicy",
    "FifoQueue",
    "ContentBasedDeduplication",
    "SqsManagedSseEnabled",
)


def _attribute_int(attrs: dict[str, Any], name: str, low: int, high: int) -> int:
    value = attrs[name]
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,10}", value) and low <= int(value) <= high:
        return int(value)
    raise InvalidAttributeValue(f"Invalid value for the parameter {name}: must be between {low} and {high}.")


def _queue_attributes(
    call: Call, attrs: dict[str, Any], fifo: bool, creating: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the sqs_queues columns, the jobq configuration) the attributes set."""
    values: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for name, value in attrs.items():
        if not isinstance(value, str):
            raise InvalidAttributeValue(f"Invalid value for the parameter {name}: it must be a string.")
        if name in _SETTABLE:
            column, low, high = _SETTABLE[name]
            values[column] = _attribute_int(attrs, name, low, high)
            if name == "MessageRetentionPeriod":
                config["retention_failed"] = values[column]
        elif name == "VisibilityTimeout":
            seconds = _attribute_int(attrs, name, 0, min(MAX_VISIBILITY, call.settings.lease_max_seconds))
            config["lease_seconds"] = max(1, seconds)  # a jobq lease is at least a second
        elif name == "RedrivePolicy":
            values["redrive_policy"], config["max_attempts"] = _redrive_policy(value)
        elif name == "FifoQueue":
            if not creating:
                raise InvalidAttributeValue("Invalid value for the parameter FifoQueue: a queue cannot change type.")
            if value.lower() != ("true" if fifo else "false"):
                raise InvalidParameterValue(
                    "Invalid value for the parameter FifoQueue. Reason: The name of a FIFO queue can only "
                    "include alphanumeric characters, hyphens, or underscores, must end with .fifo suffix."
                )
        elif name == "ContentBasedDeduplication":
            if not fifo:
                raise InvalidAttributeName(f"Unknown Attribute {name}.")
            if value.lower() not in ("true", "false"):
                raise InvalidAttributeValue(f"Invalid value for the parameter {name}.")
            values["content_based_dedup"] = value.lower() == "true"
        elif name not in _IGNORED:
            raise InvalidAttributeName(f"Unknown Attribute {name}.")
    return values, config


def _redrive_policy(text: str) -> tuple[str | None, int]:
    if text == "":
        return None, NO_REDRIVE_ATTEMPTS  # cleared: no dead letters any more
    try:
        policy = orjson.loads(text)
    except orjson.JSONDecodeError:
        policy = None
    count = policy.get("maxReceiveCount") if isinstance(policy, dict) else None
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    target = policy.get("deadLetterTargetArn") if isinstance(policy, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1000 or not isinstance(target, str):
        raise InvalidParameterValue(
            "Value for parameter RedrivePolicy is invalid. Reason: Redrive policy is not a valid JSON map "
            "with deadLetterTargetArn and maxReceiveCount (1 to 1000)."
        )
    _name_of_arn(target, "RedrivePolicy.deadLetterTargetArn")
    return text, count


async def create_queue(call: Call, p: Params) -> Result:
    name = _str(p, "QueueName", required=True)
    assert name is not None
    if not _valid_name(name):
        raise InvalidParameterValue(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length."
        )
    _authorize(call, "admin", name)
    fifo = name.endswith(".fifo")
    attrs = _map(p, "Attributes")
    if attrs.get("FifoQueue", "").lower() == "true" and not fifo:
        raise InvalidParameterValue("The name of a FIFO queue must end with the .fifo suffix.")
    values, config = _queue_attributes(call, attrs, fifo, creating=True)
    tags = _tags(_strings(p, "tags"))
    wanted = {**DEFAULTS, **values}
    if fifo:
        config["ordered"] = True
    # SQS's default VisibilityTimeout, and no dead letters without a RedrivePolicy.
    defaults = {"lease_seconds": 30, "max_attempts": NO_REDRIVE_ATTEMPTS}
    row, created = await call.sqs.create(name, wanted, tags, config, defaults)
    if not created:
        # An existing queue: its URL, unless the attributes asked for differ from its own (SQS's rule).
        current = {k: getattr(row, k) for k in wanted}
        if any(current[k] != v for k, v in values.items()):
            raise QueueNameExists("A queue already exists with the same name and a different value for attributes")
    return {"QueueUrl": queue_url(call, name)}


def _tags(tags: dict[str, str]) -> dict[str, str]:
    if len(tags) > MAX_TAGS:
        raise InvalidParameterValue(f"Too many tags: a queue has at most {MAX_TAGS}.")
    for key, value in tags.items():
        if not 1 <= len(key) <= 128 or len(value) > 256 or key.startswith("aws:"):
            raise InvalidParameterValue(f"Tag {key!r} is invalid: keys are 1-128 characters, values at most 256.")
    return tags


async def get_queue_url(call: Call, p: Params) -> Result:
    name = _str(p, "QueueName", required=True)
    assert name is not None
    if not _valid_name(name):
        raise QueueDoesNotExist("The specified queue does not exist.")
    _authorize(call, None, name)
    try:
        await call.sqs.adopt(name)
    except NoSuchQueue:
        raise QueueDoesNotExist("The specified queue does not exist.") from None
    return {"QueueUrl": queue_url(call, name)}


async def list_queues(call: Call, p: Params) -> Result:
    _authorize(call, None, None)
    prefix = _str(p, "QueueNamePrefix") or ""
    limit = _int(p, "MaxResults", 1, 1000)
    token = _str(p, "NextToken")
    after = None
    if token:
        try:
            after = base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise InvalidParameterValue("Invalid NextToken value.") from None
    page = limit or 1000
    names = [n for n in await call.sqs.names(prefix, after, page + 1) if call.who.allows(n)]
    out: Result = {"QueueUrls": [queue_url(call, n) for n in names[:page]]}
    if limit is not None and len(names) > page:
        out["NextToken"] = base64.urlsafe_b64encode(names[page - 1].encode()).decode()
    if not out["QueueUrls"]:
        del out["QueueUrls"]
    return out


async def delete_queue(call: Call, p: Params) -> Result:
    row = await _target(call, p, "admin")
    await call.sqs.delete(row.queue)
    return {}


async def purge_queue(call: Call, p: Params) -> Result:
    row = await _target(call, p, "admin")
    await call.sqs.purge(row.queue)
    return {}


async def get_queue_attributes(call: Call, p: Params) -> Result:
    row = await _target(call, p, None)
    names = _list(p, "AttributeNames")
    for name in names:
        if name != "All" and name not in _READABLE:
            raise InvalidAttributeName(f"Unknown Attribute {name}.")
    wanted = set(_READABLE) if "All" in names else set(names)
    row = await call.sqs.queue(row.queue, fresh=True)
    attrs: dict[str, str] = {}
    counts: dict[str, Any] = {}
    if any(n.startswith("Approximate") for n in wanted):
        counts = await call.sqs.counts(row.queue)
    fifo = _fifo(row)
    values: dict[str, Callable[[], str]] = {
        "DelaySeconds": lambda: str(row.delay_seconds),
        "MaximumMessageSize": lambda: str(row.maximum_message_size),
        "MessageRetentionPeriod": lambda: str(row.retention_seconds),
        "ReceiveMessageWaitTimeSeconds": lambda: str(row.receive_wait_seconds),
        "ApproximateNumberOfMessages": lambda: str(counts["ready"]),
        "ApproximateNumberOfMessagesNotVisible": lambda: str(counts["running"]),
        "ApproximateNumberOfMessagesDelayed": lambda: str(counts["scheduled"] + counts["waiting"]),
        "CreatedTimestamp": lambda: str(int(row.created_at.timestamp())),
        "LastModifiedTimestamp": lambda: str(int(row.modified_at.timestamp())),
        "QueueArn": lambda: queue_arn(row.queue),
        "SqsManagedSseEnabled": lambda: "false",
    }
    for name in _READABLE:
        if name not in wanted:
            continue
        if name == "VisibilityTimeout":
            attrs[name] = str(await call.sqs.lease_seconds(row.queue))
        elif name == "RedrivePolicy":
            if row.redrive_policy is not None:
                attrs[name] = row.redrive_policy
        elif name in ("FifoQueue", "ContentBasedDeduplication"):
            if fifo:
                attrs[name] = "true" if name == "FifoQueue" or row.content_based_dedup else "false"
        else:
            attrs[name] = values[name]()
    return {"Attributes": attrs} if attrs else {}


async def set_queue_attributes(call: Call, p: Params) -> Result:
    row = await _target(call, p, "admin")
    attrs = _map(p, "Attributes")
    if not attrs:
        raise MissingParameter("The request must contain the parameter Attributes.")
    values, config = _queue_attributes(call, attrs, _fifo(row), creating=False)
    await call.sqs.set_attributes(row.queue, values, queue_config(**config))
    return {}


async def tag_queue(call: Call, p: Params) -> Result:
    row = await _target(call, p, "admin")
    add = _tags(_strings(p, "Tags"))
    if len({**tags_of(row), **add}) > MAX_TAGS:
        raise InvalidParameterValue(f"Too many tags: a queue has at most {MAX_TAGS}.")
    await call.sqs.tag(row.queue, add, ())
    return {}


async def untag_queue(call: Call, p: Params) -> Result:
    row = await _target(call, p, "admin")
    await call.sqs.tag(row.queue, {}, _list(p, "TagKeys"))
    return {}


async def list_queue_tags(call: Call, p: Params) -> Result:
    row = await _target(call, p, None)
    tags = tags_of(await call.sqs.queue(row.queue, fresh=True))
    return {"Tags": tags} if tags else {}


async def list_dead_letter_source_queues(call: Call, p: Params) -> Result:
    row = await _target(call, p, None)
    names = [n for n in await call.sqs.dead_letter_sources(row.queue) if call.who.allows(n)]
    return {"queueUrls": [queue_url(call, n) for n in names]}


# --- dead letters: StartMessageMoveTask is a redrive ---------------------------------------------------------


_NO_SOURCE = "The resource that you specified for the SourceArn parameter doesn't exist."


async def start_message_move_task(call: Call, p: Params) -> Result:
    source_arn = _str(p, "SourceArn", required=True)
    assert source_arn is not None
    source = _name_of_arn(source_arn, "SourceArn")
    _authorize(call, "admin", source)
    try:
        await call.sqs.queue(source)
    except NoSuchQueue:
        raise ResourceNotFoundException(_NO_SOURCE) from None
    rate = _int(p, "MaxNumberOfMessagesPerSecond", 1, 500)
    # jobq keeps dead letters where they failed (the source queues' failed jobs) and redrives them there.
    queues = await call.sqs.dead_letter_sources(source) or [source]
    destination_arn = _str(p, "DestinationArn")
    if destination_arn is not None:
        destination = _name_of_arn(destination_arn, "DestinationArn")
        if destination not in queues:
            raise UnsupportedOperation(
                "jobq redrives dead letters to the queue they failed in only: give no DestinationArn, or the "
                "ARN of a queue whose RedrivePolicy names the source."
            )
        queues = [destination]
    for q in queues:
        _authorize(call, "admin", q)
    started = int(time.time() * 1000)
    handle = base64.urlsafe_b64encode(orjson.dumps({"source": source, "started": started})).decode()
    task: Result = {
        "TaskHandle": handle,
        "Status": "COMPLETED",
        "SourceArn": source_arn,
        "StartedTimestamp": started,
        "ApproximateNumberOfMessagesToMove": 0,
    }
    if destination_arn is not None:
        task["DestinationArn"] = destination_arn
    if rate is not None:
        task["MaxNumberOfMessagesPerSecond"] = rate
    moved = await call.sqs.redrive(source, queues, task)
    task["ApproximateNumberOfMessagesToMove"] = moved
    return {"TaskHandle": handle}


async def list_message_move_tasks(call: Call, p: Params) -> Result:
    source_arn = _str(p, "SourceArn", required=True)
    assert source_arn is not None
    source = _name_of_arn(source_arn, "SourceArn")
    _authorize(call, None, source)
    _int(p, "MaxResults", 1, 10)
    try:
        row = await call.sqs.queue(source, fresh=True)
    except NoSuchQueue:
        raise ResourceNotFoundException(_NO_SOURCE) from None
    tasks = [orjson.loads(row.move_task)] if row.move_task else []
    return {"Results": tasks}


async def cancel_message_move_task(call: Call, p: Params) -> Result:
    _str(p, "TaskHandle", required=True)
    _authorize(call, "admin", None)
    raise ResourceNotFoundException("Task does not exist or is already complete: jobq's move tasks finish at once.")


async def unsupported(call: Call, p: Params) -> Result:
    raise UnsupportedOperation("jobq grants access with its API keys' scopes and queue patterns, not SQS policies.")


# --- messages -------------------------------------------------------------------------------------------------


def _body(p: Params) -> str:
    body = _str(p, "MessageBody", required=True)
    assert body is not None
    if body == "":
        raise InvalidParameterValue("The request must contain a non-empty message body.")
    if _BAD_CHAR.search(body):
        raise InvalidMessageContents(
            "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | #x20 to #xD7FF | "
            "#xE000 to #xFFFD | #x10000 to #x10FFFF"
        )
    return body


def _message_attributes(p: Params) -> tuple[dict[str, dict[str, str]], int]:
    """The message attributes, checked, in the JSON shape; and their size as SQS counts it."""
    attrs = _map(p, "MessageAttributes")
    if len(attrs) > MAX_ATTRIBUTES:
        raise InvalidParameterValue(f"Number of message attributes [{len(attrs)}] exceeds the allowed maximum [10].")
    out: dict[str, dict[str, str]] = {}
    size = 0
    for name, value in attrs.items():
        if (
            not _ATTRIBUTE_NAME.fullmatch(name)
            or name.lower().startswith(("aws.", "amazon."))
            or ".." in name
            or name.startswith(".")
            or name.endswith(".")
        ):
            raise InvalidParameterValue(f"The message attribute name '{name}' is invalid.")
        if not isinstance(value, dict):
            raise InvalidParameterValue(f"The message attribute '{name}' must have a value.")
        data_type = value.get("DataType")
        if not isinstance(data_type, str) or not _DATA_TYPE.fullmatch(data_type):
            raise InvalidParameterValue(f"The message attribute '{name}' has an invalid message attribute type.")
        if data_type.startswith("Binary"):
            raw = value.get("BinaryValue")
            try:
                decoded = base64.b64decode(raw, validate=True) if isinstance(raw, str) else None
            except (binascii.Error, ValueError):
                decoded = None
            if not decoded:
                raise InvalidParameterValue(f"The message attribute '{name}' of type Binary needs a BinaryValue.")
            out[name] = {"DataType": data_type, "BinaryValue": raw}  # type: ignore[dict-item]
            size += len(decoded)
        else:
            text = value.get("StringValue")
            if not isinstance(text, str) or text == "":
                raise InvalidParameterValue(f"The message attribute '{name}' must contain a non-empty StringValue.")
            if _BAD_CHAR.search(text):
                raise InvalidParameterValue(f"The message attribute '{name}' contains invalid characters.")
            if data_type.startswith("Number") and not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
                raise InvalidParameterValue(f"Can't convert '{text}' to Number for the message attribute '{name}'.")
            out[name] = {"DataType": data_type, "StringValue": text}
            size += len(text.encode())
        size += len(name.encode()) + len(data_type.encode())
    return out, size


class _Checked(NamedTuple):
    message: Outgoing
    md5_body: str
    md5_attributes: str | None
    size: int


_PLAIN = frozenset({"Id", "QueueUrl", "MessageBody"})


def _checked(row: SqsQueueRow, p: Params) -> _Checked:
    if not _fifo(row) and _PLAIN.issuperset(p):
        # The common message: a body and nothing else (the checks below, short-cut).
        body = _body(p)
        size = len(body.encode())
        if size > row.maximum_message_size:
            raise _too_long(row)
        return _Checked(Outgoing(body, None, row.delay_seconds, None, None), md5_of_body(body), None, size)
    body = _body(p)
    attrs, attrs_size = _message_attributes(p)
    _map(p, "MessageSystemAttributes")  # AWSTraceHeader: accepted, not kept (jobq carries traceparent)
    size = len(body.encode()) + attrs_size
    if size > row.maximum_message_size:
        raise _too_long(row)
    delay = _int(p, "DelaySeconds", 0, 900)
    group = _str(p, "MessageGroupId")
    dedup = _str(p, "MessageDeduplicationId")
    if group is not None and not _GROUP.fullmatch(group):
        raise InvalidParameterValue(f"Value {group} for parameter MessageGroupId is invalid.")
    if _fifo(row):
        if delay is not None:
            raise InvalidParameterValue(
                f"Value {delay} for parameter DelaySeconds is invalid. Reason: The request include parameter "
                "that is not valid for this queue type."
            )
        if group is None:
            raise MissingParameter("The request must contain the parameter MessageGroupId.")
        if dedup is None:
            if not row.content_based_dedup:
                raise InvalidParameterValue(
                    "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId "
                    "provided explicitly"
                )
            dedup = hashlib.sha256(body.encode()).hexdigest()
        elif not _GROUP.fullmatch(dedup):
            raise InvalidParameterValue(f"Value {dedup} for parameter MessageDeduplicationId is invalid.")
    elif dedup is not None:
        raise InvalidParameterValue(
            f"Value {dedup} for parameter MessageDeduplicationId is invalid. Reason: The request includes a "
            "parameter that is not valid for this queue type."
        )
    message = Outgoing(
        body=body,
        attributes=orjson.dumps(attrs).decode() if attrs else None,
        delay_seconds=row.delay_seconds if delay is None else delay,
        group=group,
        dedup_id=dedup,
    )
    return _Checked(message, md5_of_body(body), md5_of_attributes(attrs) if attrs else None, size)


def _too_long(row: SqsQueueRow) -> InvalidParameterValue:
    return InvalidParameterValue(
        f"One or more parameters are invalid. Reason: Message must be shorter than {row.maximum_message_size} bytes."
    )


def _sent(checked: _Checked, job_id: int, fifo: bool) -> Result:
    out: Result = {"MessageId": str(job_id), "MD5OfMessageBody": checked.md5_body}
    if checked.md5_attributes is not None:
        out["MD5OfMessageAttributes"] = checked.md5_attributes
    if fifo:
        out["SequenceNumber"] = _sequence(job_id)
    return out


def _sequence(job_id: int) -> str:
    # Job ids grow in send order, across the queue's groups: SQS's rule for sequence numbers.
    return f"{job_id:020d}"


async def send_message(call: Call, p: Params) -> Result:
    row = await _target(call, p, "produce")
    checked = _checked(row, p)
    [sent] = await call.sqs.send(row.queue, [checked.message], _fifo(row), call.traceparent())
    return _sent(checked, sent.job_id, _fifo(row))


async def send_message_batch(call: Call, p: Params) -> Result:
    row = await _target(call, p, "produce")
    entries = _entries(p)
    good: list[tuple[str, _Checked]] = []
    failed: list[Result] = []
    for e in entries:
        try:
            good.append((e["Id"], _checked(row, e)))
        except SqsError as err:
            failed.append(_failure(e["Id"], err))
    if sum(c.size for _, c in good) > row.maximum_message_size:
        raise BatchRequestTooLong(
            f"Batch requests cannot be longer than {row.maximum_message_size} bytes. You have sent more."
        )
    fifo = _fifo(row)
    sent = await call.sqs.send(row.queue, [c.message for _, c in good], fifo, call.traceparent()) if good else []
    out: Result = {"Successful": [{"Id": i, **_sent(c, s.job_id, fifo)} for (i, c), s in zip(good, sent, strict=True)]}
    out["Failed"] = failed
    return out


def _handle(handle: Any) -> tuple[int, str]:
    """A receipt handle: `<job id>:<claim token>`."""
    if isinstance(handle, str):
        job, sep, token = handle.partition(":")
        if sep and job.isdigit() and 0 < len(job) <= 18 and int(job) > 0 and _TOKEN.fullmatch(token):
            return int(job), token
    raise ReceiptHandleIsInvalid(f'The input receipt handle "{handle}" is not a valid receipt handle.')


def _receipt(p: Params) -> tuple[int, str]:
    if p.get("ReceiptHandle") is None:
        raise MissingParameter("The request must contain the parameter ReceiptHandle.")
    return _handle(p["ReceiptHandle"])


_SYSTEM = (
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "SequenceNumber",
    "MessageDeduplicationId",
    "MessageGroupId",
    "AWSTraceHeader",
    "DeadLetterQueueSourceArn",
)


def _wanted_attributes(names: list[str]) -> set[str]:
    if "All" in names:
        return set(_SYSTEM)
    for name in names:
        if name not in _SYSTEM and name not in _READABLE:  # old SDKs send queue attribute names too
            raise InvalidAttributeName(f"Unknown Attribute {name}.")
    return set(names)


def _selected(attrs: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The message attributes a receive asked for: `All`, `.*`, a name, or a `prefix.*`."""
    if not names:
        return {}
    if "All" in names or ".*" in names:
        return attrs
    exact = {n for n in names if not n.endswith(".*")}
    prefixes = tuple(n[:-1] for n in names if n.endswith(".*"))
    return {k: v for k, v in attrs.items() if k in exact or (prefixes and k.startswith(prefixes))}


def body_of(payload: str) -> str:
    """A job's payload as a message body: a JSON string is its text (how SQS sends store bodies); any other
    payload, its JSON text as PostgreSQL renders jsonb (a job enqueued over jobq's API)."""
    if payload.startswith('"'):
        text: str = orjson.loads(payload)
        return text
    return payload


async def receive_message(call: Call, p: Params) -> Result:
    row = await _target(call, p, "consume")
    limit = _int(p, "MaxNumberOfMessages", 1, MAX_RECEIVE) or 1
    wait = _int(p, "WaitTimeSeconds", 0, MAX_WAIT)
    visibility = _int(p, "VisibilityTimeout", 0, MAX_VISIBILITY)
    if visibility is not None and visibility > call.settings.lease_max_seconds:
        raise InvalidParameterValue(f"VisibilityTimeout is at most {call.settings.lease_max_seconds} here.")
    system = _wanted_attributes(_list(p, "AttributeNames") + _list(p, "MessageSystemAttributeNames"))
    attribute_names = _list(p, "MessageAttributeNames")
    _str(p, "ReceiveRequestAttemptId")
    seconds = row.receive_wait_seconds if wait is None else wait
    claimed = await call.sqs.receive(
        row.queue,
        limit,
        max(1, visibility) if visibility is not None else None,  # a jobq lease is at least a second
        float(min(seconds, call.settings.wait_max_seconds)),
        call.who.queue_regex,
        call.disconnected if seconds > 0 else None,
        call.client(),
        call.still_authorized(),
    )
    if not claimed.jobs:
        return {}
    extras: dict[int, tuple[str | None, str | None]] = {}
    if attribute_names or "MessageDeduplicationId" in system:
        extras = await call.sqs.extras([j.id for j in claimed.jobs])
    now = str(int(time.time() * 1000))
    fifo = _fifo(row)
    return {"Messages": [_message(j, extras.get(j.id), system, attribute_names, now, fifo, call) for j in claimed.jobs]}


def _message(
    job: ClaimRow,
    extra: tuple[str | None, str | None] | None,
    system: set[str],
    attribute_names: list[str],
    now: str,
    fifo: bool,
    call: Call,
) -> Result:
    body = body_of(job.payload)
    out: Result = {
        "MessageId": str(job.id),
        "ReceiptHandle": f"{job.id}:{job.claim_token}",
        "MD5OfBody": md5_of_body(body),
        "Body": body,
    }
    attrs: dict[str, str] = {}
    for name in system:
        if name == "SenderId":
            attrs[name] = ACCOUNT
        elif name == "SentTimestamp":
            attrs[name] = str(int(job.created_at.timestamp() * 1000))
        elif name == "ApproximateReceiveCount":
            attrs[name] = str(job.attempts)
        elif name == "ApproximateFirstReceiveTimestamp":
            attrs[name] = now  # jobq keeps the latest claim's time only (docs/sqs.md)
        elif name == "SequenceNumber" and fifo:
            attrs[name] = _sequence(job.id)
        elif name == "MessageGroupId" and job.group is not None:
            attrs[name] = job.group
        elif name == "MessageDeduplicationId" and extra is not None and extra[1] is not None:
            attrs[name] = extra[1]
    if attrs:
        out["Attributes"] = attrs
    if extra is not None and extra[0] is not None:
        selected = _selected(orjson.loads(extra[0]), attribute_names)
        if selected:
            out["MessageAttributes"] = selected
            out["MD5OfMessageAttributes"] = md5_of_attributes(selected)
    return out


async def delete_message(call: Call, p: Params) -> Result:
    row = await _target(call, p, "consume")
    handle = _receipt(p)
    # A stale handle (the message was received again since, or is gone) changes nothing and is not an
    # error, as in SQS: only the latest receive's handle deletes.
    await call.sqs.delete_messages([handle], _only(row.queue))
    return {}


async def delete_message_batch(call: Call, p: Params) -> Result:
    row = await _target(call, p, "consume")
    entries = _entries(p)
    good: list[tuple[str, tuple[int, str]]] = []
    failed: list[Result] = []
    for e in entries:
        try:
            good.append((e["Id"], _receipt(e)))
        except SqsError as err:
            failed.append(_failure(e["Id"], err))
    if good:
        await call.sqs.delete_messages([h for _, h in good], _only(row.queue))
    return {"Successful": [{"Id": i} for i, _ in good], "Failed": failed}


async def _change(call: Call, queue: str, p: Params) -> None:
    job_id, token = _receipt(p)
    if p.get("VisibilityTimeout") is None:
        raise MissingParameter("The request must contain the parameter VisibilityTimeout.")
    seconds = _int(p, "VisibilityTimeout", 0, MAX_VISIBILITY)
    assert seconds is not None
    if seconds > call.settings.lease_max_seconds:
        raise InvalidParameterValue(f"VisibilityTimeout is at most {call.settings.lease_max_seconds} here.")
    try:
        done = await call.sqs.change_visibility(job_id, token, seconds, _only(queue))
    except JobNotFound:
        raise ReceiptHandleIsInvalid(f"The receipt handle {job_id}:{token} is not a valid receipt handle.") from None
    except (ClaimLost, JobCancelled):
        raise MessageNotInflight("The message referred to is not in flight.") from None
    if isinstance(done, Renewal) and done.cancel_requested:
        raise MessageNotInflight("The message referred to is not in flight (it was purged).")


async def change_message_visibility(call: Call, p: Params) -> Result:
    row = await _target(call, p, "consume")
    await _change(call, row.queue, p)
    return {}


async def change_message_visibility_batch(call: Call, p: Params) -> Result:
    row = await _target(call, p, "consume")
    entries = _entries(p)

    async def one(e: Params) -> Result | SqsError:
        try:
            await _change(call, row.queue, e)
        except SqsError as err:
            return err
        return {"Id": e["Id"]}

    done = await asyncio.gather(*(one(e) for e in entries))
    return {
        "Successful": [d for d in done if not isinstance(d, SqsError)],
        "Failed": [_failure(e["Id"], d) for e, d in zip(entries, done, strict=True) if isinstance(d, SqsError)],
    }


Handler = Callable[[Call, Params], Awaitable[Result]]

ACTIONS: dict[str, Handler] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "PurgeQueue": purge_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
    "CancelMessageMoveTask": cancel_message_move_task,
    "AddPermission": unsupported,
    "RemovePermission": unsupported,
}
