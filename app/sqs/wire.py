"""The two wire protocols of SQS, read into one shape and written back from it.

AWS JSON 1.0 (`X-Amz-Target: AmazonSQS.<Action>`, a JSON object) is the shape every action works on. The
query protocol (a form: `Action=<Action>&QueueUrl=...`, XML answers) is read into it: its flattened,
1-based lists (`AttributeName.1`, `SendMessageBatchRequestEntry.2.Id`) become lists, its Name/Value and
Key/Value pairs (`Attribute.1.Name`, `MessageAttribute.1.Value.StringValue`, `Tag.1.Key`) become maps; and
an action's JSON-shaped result is written back as the XML the query protocol's SDKs parse."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

import orjson

from app.sqs.errors import InvalidAction, MissingParameter, SqsError

JSON_TYPE = "application/x-amz-json-1.0"
XML_TYPE = "text/xml"
NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"
TARGET_PREFIX = "AmazonSQS."

Params = dict[str, Any]

# --- reading ------------------------------------------------------------------------------------------------


def read_json(target: str, body: bytes) -> tuple[str, Params]:
    if not target.startswith(TARGET_PREFIX):
        raise InvalidAction(f"X-Amz-Target {target!r} is not an SQS action (AmazonSQS.<Action>).")
    try:
        params = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError:
        raise SerializationError("The request body is not valid JSON.") from None
    if not isinstance(params, dict):
        raise SerializationError("The request body must be a JSON object.")
    return target[len(TARGET_PREFIX) :], params


class SerializationError(SqsError):
    """A JSON body that is not an object (the JSON protocol's own client error)."""


def read_query(body: bytes) -> tuple[str, Params]:
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=False, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise InvalidQueryParameter("The form is not valid UTF-8 form encoding.") from None
    flat: dict[str, str] = {}
    for key, value in pairs:
        flat[key] = value
    action = flat.pop("Action", None)
    if not action:
        raise MissingAction("The request must contain the parameter Action.")
    flat.pop("Version", None)
    tree = _unflatten(flat)
    return action, _normalise(tree, action)


class MissingAction(MissingParameter):
    pass


class InvalidQueryParameter(SqsError):
    pass


def _unflatten(flat: Mapping[str, str]) -> dict[str, Any]:
    """`A.1.B=x` -> {"A": {"1": {"B": "x"}}}; a key that is both a value and a prefix keeps the deeper one."""
    root: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = root
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        if not isinstance(node.get(parts[-1]), dict):
            node[parts[-1]] = value
    return root


def _items(node: Any) -> list[Any]:
    """A flattened list's members, by their 1-based index (gaps allowed, as SQS allows)."""
    if not isinstance(node, dict):
        return []
    numbered = [(int(k), v) for k, v in node.items() if k.isascii() and k.isdigit()]  # `²` is a digit to isdigit()
    return [v for _, v in sorted(numbered)]


def _pairs(node: Any, key: str, value: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in _items(node):
        if isinstance(item, dict) and isinstance(item.get(key), str):
            out[item[key]] = item.get(value)
    return out


def _attribute_value(node: Any) -> dict[str, Any]:
    return {k: v for k, v in node.items() if isinstance(v, str)} if isinstance(node, dict) else {}


# Query names of the lists and maps, and the JSON names they become.
_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "TagKey": "TagKeys",
}
_ENTRIES = (
    "SendMessageBatchRequestEntry",
    "DeleteMessageBatchRequestEntry",
    "ChangeMessageVisibilityBatchRequestEntry",
)


def _normalise(tree: dict[str, Any], action: str, entry: bool = False) -> Params:
    out: Params = {}
    for key, node in tree.items():
        if key in _LISTS:
            out[_LISTS[key]] = [v for v in _items(node) if isinstance(v, str)]
        elif key == "Attribute":
            out["Attributes"] = _pairs(node, "Name", "Value")
        elif key in ("MessageAttribute", "MessageSystemAttribute"):
            pairs = _pairs(node, "Name", "Value")
            out[key + "s"] = {k: _attribute_value(v) for k, v in pairs.items()}
        elif key == "Tag":
            out["tags" if action == "CreateQueue" else "Tags"] = _pairs(node, "Key", "Value")
        elif key in _ENTRIES and not entry:
            # One level: entries within an entry mean nothing, and nested thousands deep would recurse past
            # Python's limit (a RecursionError, once a 500).
            out["Entries"] = [_normalise(e, action, True) if isinstance(e, dict) else {} for e in _items(node)]
        elif isinstance(node, str):
            out[key] = node
        # anything else (a nested value no action takes) is left out, as SQS ignores unknown parameters
    return out


# --- writing ------------------------------------------------------------------------------------------------


def request_id() -> str:
    return str(uuid.uuid4())


def json_answer(result: Params) -> bytes:
    return orjson.dumps(result)


def json_error(err: SqsError) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body = orjson.dumps({"__type": f"com.amazonaws.sqs#{err.code}", "message": err.message})
    fault = "Sender" if err.sender else "Receiver"
    return body, [(b"x-amzn-query-error", f"{err.query};{fault}".encode())]


def xml_error(err: SqsError, rid: str) -> bytes:
    return (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{NAMESPACE}"><Error>'
        f"<Type>{'Sender' if err.sender else 'Receiver'}</Type><Code>{escape(err.query)}</Code>"
        f"<Message>{_text(err.message)}</Message><Detail/></Error><RequestId>{rid}</RequestId></ErrorResponse>"
    ).encode()


# The element of each member of a list in a query answer (a member named here is written once per item).
_MEMBER = {
    "QueueUrls": "QueueUrl",
    "queueUrls": "QueueUrl",
    "Messages": "Message",
    "Failed": "BatchResultErrorEntry",
    "Results": "ListMessageMoveTasksResultEntry",
}


def xml_answer(action: str, result: Params, rid: str) -> bytes:
    inner = _xml_members(action, result)
    return (
        f'<?xml version="1.0"?><{action}Response xmlns="{NAMESPACE}"><{action}Result>{inner}</{action}Result>'
        f"<ResponseMetadata><RequestId>{rid}</RequestId></ResponseMetadata></{action}Response>"
    ).encode()


def _xml_members(action: str, doc: Mapping[str, Any]) -> str:
    parts: list[str] = []
    for key, value in doc.items():
        if value is None:
            continue
        if key == "Attributes":
            for name, v in value.items():
                parts.append(f"<Attribute><Name>{_text(name)}</Name><Value>{_text(_scalar(v))}</Value></Attribute>")
        elif key == "MessageAttributes":
            for name, v in value.items():
                fields = "".join(f"<{k}>{_text(_scalar(x))}</{k}>" for k, x in v.items() if isinstance(x, str))
                parts.append(f"<MessageAttribute><Name>{_text(name)}</Name><Value>{fields}</Value></MessageAttribute>")
        elif key == "Tags":
            for name, v in value.items():
                parts.append(f"<Tag><Key>{_text(name)}</Key><Value>{_text(v)}</Value></Tag>")
        elif isinstance(value, list):
            member = _MEMBER.get(key) or f"{action}ResultEntry"  # Successful: <SendMessageBatchResultEntry>
            for item in value:
                body = _xml_members(action, item) if isinstance(item, dict) else _text(_scalar(item))
                parts.append(f"<{member}>{body}</{member}>")
        elif isinstance(value, dict):
            parts.append(f"<{key}>{_xml_members(action, value)}</{key}>")
        else:
            parts.append(f"<{key}>{_text(_scalar(value))}</{key}>")
    return "".join(parts)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# What XML 1.0 cannot hold, even as a character reference.
NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: str) -> str:
    # XML 1.0 text: the body of a message may hold \r, which a parser would turn into \n unless escaped.
    # What XML cannot hold at all (a control character an error message quotes from the request) is
    # written as U+FFFD, so that the SDK parses the answer. SQS requests cannot store one (refused when
    # given); a body enqueued over jobq's own API can, and is then answered changed, unlike its MD5OfBody.
    return NOT_XML.sub("\ufffd", escape(value)).replace("\r", "&#xD;")
