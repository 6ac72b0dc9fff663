"""The SQS message actions: send, receive, delete, change visibility, one at a time and in batches; SQS's limits
on bodies and message attributes, and the digests the SDKs verify."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import re
import time
from typing import Any, NamedTuple

import orjson

from app.core.jobs import Renewal
from app.core.sqs import Outgoing
from app.db import tokens
from app.db.rows import ClaimRow
from app.db.sqs import SqsQueueRow
from app.errors import ClaimLost, JobCancelled, JobNotFound
from app.sqs.digests import md5_of_attributes, md5_of_body
from app.sqs.errors import (
    BatchRequestTooLong,
    InvalidAttributeName,
    InvalidMessageContents,
    InvalidParameterValue,
    MessageNotInflight,
    MissingParameter,
    ReceiptHandleIsInvalid,
    SqsError,
)
from app.sqs.params import (
    ACCOUNT,
    MAX_ATTRIBUTES,
    MAX_RECEIVE,
    MAX_VISIBILITY,
    MAX_WAIT,
    Call,
    Params,
    Result,
    failure,
    is_fifo,
    only_queue,
    read_entries,
    read_int,
    read_list,
    read_map,
    read_str,
    target,
)
from app.sqs.queues import READABLE

_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_DATA_TYPE = re.compile(r"(String|Number|Binary)(\.[^\x00-\x1f]{1,250})?")
_TOKEN = re.compile(rf"[A-Za-z0-9_-]{{1,{tokens.MAX_CHARS}}}")  # a claim token, as app/models/fields.py ClaimToken
_GROUP = re.compile(r"[!-~]{1,128}")  # SQS: alphanumerics and punctuation
# The characters SQS accepts in a body and in string attributes (XML's): #x9 #xA #xD #x20-#xD7FF
# #xE000-#xFFFD #x10000-#x10FFFF; anything else is refused (jsonb could not hold NUL anyway).
_BAD_CHAR = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _body(p: Params) -> str:
    body = read_str(p, "MessageBody", required=True)
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
    attrs = read_map(p, "MessageAttributes")
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
        if not isinstance(data_type, str) or not _DATA_TYPE.fullmatch(data_type) or _BAD_CHAR.search(data_type):
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
    if not is_fifo(row) and _PLAIN.issuperset(p):
        # The common message: a body and nothing else (the checks below, short-cut).
        body = _body(p)
        size = len(body.encode())
        if size > row.maximum_message_size:
            raise _too_long(row)
        return _Checked(Outgoing(body, None, row.delay_seconds, None, None), md5_of_body(body), None, size)
    body = _body(p)
    attrs, attrs_size = _message_attributes(p)
    read_map(p, "MessageSystemAttributes")  # AWSTraceHeader: accepted, not kept (jobq carries traceparent)
    size = len(body.encode()) + attrs_size
    if size > row.maximum_message_size:
        raise _too_long(row)
    delay = read_int(p, "DelaySeconds", 0, 900)
    group = read_str(p, "MessageGroupId")
    dedup = read_str(p, "MessageDeduplicationId")
    if group is not None and not _GROUP.fullmatch(group):
        raise InvalidParameterValue(f"Value {group} for parameter MessageGroupId is invalid.")
    if is_fifo(row):
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
    row = await target(call, p, "produce")
    checked = _checked(row, p)
    [sent] = await call.sqs.send(row.queue, [checked.message], is_fifo(row), call.traceparent())
    return _sent(checked, sent.job_id, is_fifo(row))


async def send_message_batch(call: Call, p: Params) -> Result:
    row = await target(call, p, "produce")
    entries = read_entries(p)
    good: list[tuple[str, _Checked]] = []
    failed: list[Result] = []
    for e in entries:
        try:
            good.append((e["Id"], _checked(row, e)))
        except SqsError as err:
            failed.append(failure(e["Id"], err))
    if sum(c.size for _, c in good) > row.maximum_message_size:
        raise BatchRequestTooLong(
            f"Batch requests cannot be longer than {row.maximum_message_size} bytes. You have sent more."
        )
    fifo = is_fifo(row)
    sent = await call.sqs.send(row.queue, [c.message for _, c in good], fifo, call.traceparent()) if good else []
    out: Result = {"Successful": [{"Id": i, **_sent(c, s.job_id, fifo)} for (i, c), s in zip(good, sent, strict=True)]}
    out["Failed"] = failed
    return out


def _handle(handle: Any) -> tuple[int, str]:
    """A receipt handle: `<job id>:<claim token>`."""
    if isinstance(handle, str):
        job, sep, token = handle.partition(":")
        # [0-9], not str.isdigit(): that is true of `²`, which int() refuses.
        if sep and re.fullmatch(r"[0-9]{1,18}", job) and int(job) > 0 and _TOKEN.fullmatch(token):
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
        if name not in _SYSTEM and name not in READABLE:  # old SDKs send queue attribute names too
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
    row = await target(call, p, "consume")
    limit = read_int(p, "MaxNumberOfMessages", 1, MAX_RECEIVE) or 1
    wait = read_int(p, "WaitTimeSeconds", 0, MAX_WAIT)
    visibility = read_int(p, "VisibilityTimeout", 0, MAX_VISIBILITY)
    if visibility is not None and visibility > call.settings.lease_max_seconds:
        raise InvalidParameterValue(f"VisibilityTimeout is at most {call.settings.lease_max_seconds} here.")
    system = _wanted_attributes(read_list(p, "AttributeNames") + read_list(p, "MessageSystemAttributeNames"))
    attribute_names = read_list(p, "MessageAttributeNames")
    read_str(p, "ReceiveRequestAttemptId")
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
    fifo = is_fifo(row)
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
    row = await target(call, p, "consume")
    handle = _receipt(p)
    # A stale handle (the message was received again since, or is gone) changes nothing and is not an
    # error, as in SQS: only the latest receive's handle deletes.
    await call.sqs.delete_messages([handle], only_queue(row.queue))
    return {}


async def delete_message_batch(call: Call, p: Params) -> Result:
    row = await target(call, p, "consume")
    entries = read_entries(p)
    good: list[tuple[str, tuple[int, str]]] = []
    failed: list[Result] = []
    for e in entries:
        try:
            good.append((e["Id"], _receipt(e)))
        except SqsError as err:
            failed.append(failure(e["Id"], err))
    if good:
        await call.sqs.delete_messages([h for _, h in good], only_queue(row.queue))
    return {"Successful": [{"Id": i} for i, _ in good], "Failed": failed}


async def _change(call: Call, queue: str, p: Params) -> None:
    job_id, token = _receipt(p)
    if p.get("VisibilityTimeout") is None:
        raise MissingParameter("The request must contain the parameter VisibilityTimeout.")
    seconds = read_int(p, "VisibilityTimeout", 0, MAX_VISIBILITY)
    assert seconds is not None
    if seconds > call.settings.lease_max_seconds:
        raise InvalidParameterValue(f"VisibilityTimeout is at most {call.settings.lease_max_seconds} here.")
    try:
        done = await call.sqs.change_visibility(job_id, token, seconds, only_queue(queue))
    except JobNotFound:
        raise ReceiptHandleIsInvalid(f"The receipt handle {job_id}:{token} is not a valid receipt handle.") from None
    except (ClaimLost, JobCancelled):
        raise MessageNotInflight("The message referred to is not in flight.") from None
    if isinstance(done, Renewal) and done.cancel_requested:
        raise MessageNotInflight("The message referred to is not in flight (it was purged).")


async def change_message_visibility(call: Call, p: Params) -> Result:
    row = await target(call, p, "consume")
    await _change(call, row.queue, p)
    return {}


async def change_message_visibility_batch(call: Call, p: Params) -> Result:
    row = await target(call, p, "consume")
    entries = read_entries(p)

    async def one(e: Params) -> Result | SqsError:
        try:
            await _change(call, row.queue, e)
        except SqsError as err:
            return err
        return {"Id": e["Id"]}

    done = await asyncio.gather(*(one(e) for e in entries))
    return {
        "Successful": [d for d in done if not isinstance(d, SqsError)],
        "Failed": [failure(e["Id"], d) for e, d in zip(entries, done, strict=True) if isinstance(d, SqsError)],
    }
