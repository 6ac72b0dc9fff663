"""The SQS queue actions: create, find, list, delete, purge, attributes, tags; dead letters and their redrive
(StartMessageMoveTask). What each one does in jobq's terms, and where it differs from SQS: docs/sqs.md."""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Callable
from typing import Any

import orjson

from app.core.sqs import DEFAULTS, NO_REDRIVE_ATTEMPTS, NoSuchQueue, queue_config, tags_of
from app.sqs.errors import (
    InvalidAttributeName,
    InvalidAttributeValue,
    InvalidParameterValue,
    MissingParameter,
    QueueDoesNotExist,
    QueueNameExists,
    ResourceNotFoundException,
    UnsupportedOperation,
)
from app.sqs.params import (
    MAX_TAGS,
    MAX_VISIBILITY,
    MAX_WAIT,
    Call,
    Params,
    Result,
    authorize,
    is_fifo,
    name_of_arn,
    queue_arn,
    queue_url,
    read_int,
    read_list,
    read_map,
    read_str,
    read_strings,
    target,
    valid_name,
)
from app.sqs.wire import NOT_XML

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
READABLE = (
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
    if isinstance(count, str) and re.fullmatch(r"[0-9]{1,4}", count):  # not isdigit(): `²` is one
        count = int(count)
    target = policy.get("deadLetterTargetArn") if isinstance(policy, dict) else None
    if _holds_nul(policy) or NOT_XML.search(text):  # (the latter: GetQueueAttributes answers it as given)
        # The SQL reads every queue's policy as jsonb, which refuses \u0000: one such policy stored would
        # break ListDeadLetterSourceQueues and StartMessageMoveTask for every queue.
        policy, count = None, None
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1000 or not isinstance(target, str):
        raise InvalidParameterValue(
            "Value for parameter RedrivePolicy is invalid. Reason: Redrive policy is not a valid JSON map "
            "with deadLetterTargetArn and maxReceiveCount (1 to 1000)."
        )
    name_of_arn(target, "RedrivePolicy.deadLetterTargetArn")
    return text, count


def _holds_nul(value: Any) -> bool:
    # A walk with a stack, not recursion: the JSON may nest 1,024 deep (orjson's limit), past Python's.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return True
        if isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    return False


async def create_queue(call: Call, p: Params) -> Result:
    name = read_str(p, "QueueName", required=True)
    assert name is not None
    if not valid_name(name):
        raise InvalidParameterValue(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length."
        )
    authorize(call, "admin", name)
    fifo = name.endswith(".fifo")
    attrs = read_map(p, "Attributes")
    asked = attrs.get("FifoQueue")  # a non-string is refused by _queue_attributes below
    if isinstance(asked, str) and asked.lower() == "true" and not fifo:
        raise InvalidParameterValue("The name of a FIFO queue must end with the .fifo suffix.")
    values, config = _queue_attributes(call, attrs, fifo, creating=True)
    tags = _tags(read_strings(p, "tags"))
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
        # Characters XML cannot hold would make ListQueueTags unreadable to the query protocol's SDKs.
        bad = NOT_XML.search(key) or NOT_XML.search(value)
        if not 1 <= len(key) <= 128 or len(value) > 256 or key.startswith("aws:") or bad:
            raise InvalidParameterValue(f"Tag {key!r} is invalid: keys are 1-128 characters, values at most 256.")
    return tags


async def get_queue_url(call: Call, p: Params) -> Result:
    name = read_str(p, "QueueName", required=True)
    assert name is not None
    if not valid_name(name):
        raise QueueDoesNotExist("The specified queue does not exist.")
    authorize(call, None, name)
    try:
        await call.sqs.adopt(name)
    except NoSuchQueue:
        raise QueueDoesNotExist("The specified queue does not exist.") from None
    return {"QueueUrl": queue_url(call, name)}


async def list_queues(call: Call, p: Params) -> Result:
    authorize(call, None, None)
    prefix = read_str(p, "QueueNamePrefix") or ""
    limit = read_int(p, "MaxResults", 1, 1000)
    token = read_str(p, "NextToken")
    after = None
    if token:
        try:
            after = base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise InvalidParameterValue("Invalid NextToken value.") from None
    page = limit or 1000
    # A page of the queues the key may use: read on past those it may not, else a page of others would end
    # the listing early (no NextToken) and hide the key's queues that sort after them.
    names: list[str] = []
    while len(names) <= page:
        batch = await call.sqs.names(prefix, after, page + 1)
        names += [n for n in batch if call.who.allows(n)]
        if len(batch) <= page:
            break
        after = batch[-1]
    out: Result = {"QueueUrls": [queue_url(call, n) for n in names[:page]]}
    if limit is not None and len(names) > page:
        out["NextToken"] = base64.urlsafe_b64encode(names[page - 1].encode()).decode()
    if not out["QueueUrls"]:
        del out["QueueUrls"]
    return out


async def delete_queue(call: Call, p: Params) -> Result:
    row = await target(call, p, "admin")
    await call.sqs.delete(row.queue)
    return {}


async def purge_queue(call: Call, p: Params) -> Result:
    row = await target(call, p, "admin")
    await call.sqs.purge(row.queue)
    return {}


async def get_queue_attributes(call: Call, p: Params) -> Result:
    row = await target(call, p, None)
    names = read_list(p, "AttributeNames")
    for name in names:
        if name != "All" and name not in READABLE:
            raise InvalidAttributeName(f"Unknown Attribute {name}.")
    wanted = set(READABLE) if "All" in names else set(names)
    row = await call.sqs.queue(row.queue, fresh=True)
    attrs: dict[str, str] = {}
    counts: dict[str, Any] = {}
    if any(n.startswith("Approximate") for n in wanted):
        counts = await call.sqs.counts(row.queue)
    fifo = is_fifo(row)
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
    for name in READABLE:
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
    row = await target(call, p, "admin")
    attrs = read_map(p, "Attributes")
    if not attrs:
        raise MissingParameter("The request must contain the parameter Attributes.")
    values, config = _queue_attributes(call, attrs, is_fifo(row), creating=False)
    await call.sqs.set_attributes(row.queue, values, queue_config(**config))
    return {}


async def tag_queue(call: Call, p: Params) -> Result:
    row = await target(call, p, "admin")
    add = _tags(read_strings(p, "Tags"))
    if len({**tags_of(row), **add}) > MAX_TAGS:
        raise InvalidParameterValue(f"Too many tags: a queue has at most {MAX_TAGS}.")
    await call.sqs.tag(row.queue, add, ())
    return {}


async def untag_queue(call: Call, p: Params) -> Result:
    row = await target(call, p, "admin")
    await call.sqs.tag(row.queue, {}, read_list(p, "TagKeys"))
    return {}


async def list_queue_tags(call: Call, p: Params) -> Result:
    row = await target(call, p, None)
    tags = tags_of(await call.sqs.queue(row.queue, fresh=True))
    return {"Tags": tags} if tags else {}


async def list_dead_letter_source_queues(call: Call, p: Params) -> Result:
    row = await target(call, p, None)
    names = [n for n in await call.sqs.dead_letter_sources(row.queue) if call.who.allows(n)]
    return {"queueUrls": [queue_url(call, n) for n in names]}


# --- dead letters: StartMessageMoveTask is a redrive ---------------------------------------------------------


_NO_SOURCE = "The resource that you specified for the SourceArn parameter doesn't exist."


async def start_message_move_task(call: Call, p: Params) -> Result:
    source_arn = read_str(p, "SourceArn", required=True)
    assert source_arn is not None
    source = name_of_arn(source_arn, "SourceArn")
    authorize(call, "admin", source)
    try:
        await call.sqs.queue(source)
    except NoSuchQueue:
        raise ResourceNotFoundException(_NO_SOURCE) from None
    rate = read_int(p, "MaxNumberOfMessagesPerSecond", 1, 500)
    # jobq keeps dead letters where they failed (the source queues' failed jobs) and redrives them there.
    # Only the sources this key may use, as ListDeadLetterSourceQueues lists them: naming another in an
    # AccessDenied would show a key limited to some queues a queue it may not see.
    queues = [q for q in await call.sqs.dead_letter_sources(source) if call.who.allows(q)] or [source]
    destination_arn = read_str(p, "DestinationArn")
    if destination_arn is not None:
        destination = name_of_arn(destination_arn, "DestinationArn")
        if destination not in queues:
            raise UnsupportedOperation(
                "jobq redrives dead letters to the queue they failed in only: give no DestinationArn, or the "
                "ARN of a queue whose RedrivePolicy names the source."
            )
        queues = [destination]
    for q in queues:
        authorize(call, "admin", q)
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
    source_arn = read_str(p, "SourceArn", required=True)
    assert source_arn is not None
    source = name_of_arn(source_arn, "SourceArn")
    authorize(call, None, source)
    read_int(p, "MaxResults", 1, 10)
    try:
        row = await call.sqs.queue(source, fresh=True)
    except NoSuchQueue:
        raise ResourceNotFoundException(_NO_SOURCE) from None
    tasks = [orjson.loads(row.move_task)] if row.move_task else []
    return {"Results": tasks}


async def cancel_message_move_task(call: Call, p: Params) -> Result:
    read_str(p, "TaskHandle", required=True)
    authorize(call, "admin", None)
    raise ResourceNotFoundException("Task does not exist or is already complete: jobq's move tasks finish at once.")


async def unsupported(call: Call, p: Params) -> Result:
    raise UnsupportedOperation("jobq grants access with its API keys' scopes and queue patterns, not SQS policies.")
