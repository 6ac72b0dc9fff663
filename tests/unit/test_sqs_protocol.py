"""The SQS protocol layer on its own (app/sqs/): the query protocol read into the JSON shape, XML written back,
and an authenticator's refusals answered in SQS's terms in both protocols."""

from __future__ import annotations

import asyncio
import xml.etree.ElementTree as ET
from typing import Any

import orjson
from fastapi import FastAPI

from app.auth.policy import Principal
from app.sqs import wire
from app.sqs.auth import RequestParts, refusing_with_codes
from app.sqs.endpoint import SqsEndpoint, is_sqs_request
from app.sqs.errors import QueueDoesNotExist, Refused

NS = "{http://queue.amazonaws.com/doc/2012-11-05/}"


def test_the_query_protocol_becomes_the_json_shape() -> None:
    form = (
        "Action=SendMessageBatch&Version=2012-11-05&QueueUrl=http%3A%2F%2Fh%2F000000000000%2Fq"
        "&SendMessageBatchRequestEntry.2.Id=b&SendMessageBatchRequestEntry.2.MessageBody=second"
        "&SendMessageBatchRequestEntry.1.Id=a&SendMessageBatchRequestEntry.1.MessageBody=first"
        "&SendMessageBatchRequestEntry.1.MessageAttribute.1.Name=k"
        "&SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType=String"
        "&SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue=v"
    )
    action, params = wire.read_query(form.encode())
    assert action == "SendMessageBatch"
    assert params == {
        "QueueUrl": "http://h/000000000000/q",
        "Entries": [
            {"Id": "a", "MessageBody": "first", "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}}},
            {"Id": "b", "MessageBody": "second"},
        ],
    }
    _, params = wire.read_query(
        b"Action=CreateQueue&QueueName=q&Attribute.1.Name=DelaySeconds&Attribute.1.Value=5"
        b"&Tag.1.Key=team&Tag.1.Value=x&AttributeName.1=All"
    )
    assert params == {
        "QueueName": "q",
        "Attributes": {"DelaySeconds": "5"},
        "tags": {"team": "x"},
        "AttributeNames": ["All"],
    }


def test_xml_answers_keep_what_xml_would_lose() -> None:
    result = {"Messages": [{"Body": "a\r\n<b>&", "Attributes": {"ApproximateReceiveCount": "1"}}]}
    root = ET.fromstring(wire.xml_answer("ReceiveMessage", result, "rid"))
    message = root.find(f"{NS}ReceiveMessageResult/{NS}Message")
    assert message is not None
    assert message.findtext(f"{NS}Body") == "a\r\n<b>&"
    assert message.findtext(f"{NS}Attribute/{NS}Name") == "ApproximateReceiveCount"


def test_errors_in_both_protocols() -> None:
    body, headers = wire.json_error(QueueDoesNotExist("gone"))
    assert orjson.loads(body) == {"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "gone"}
    assert headers == [(b"x-amzn-query-error", b"AWS.SimpleQueueService.NonExistentQueue;Sender")]
    root = ET.fromstring(wire.xml_error(Refused("SignatureDoesNotMatch", "no", 403), "rid"))
    assert root.findtext(f"{NS}Error/{NS}Code") == "SignatureDoesNotMatch"


def test_the_sqs_paths() -> None:
    assert is_sqs_request({"method": "POST", "path": "/"})
    assert is_sqs_request({"method": "POST", "path": "/000000000000/orders.fifo"})
    assert not is_sqs_request({"method": "GET", "path": "/"})
    assert not is_sqs_request({"method": "POST", "path": "/queues/q/jobs"})
    assert not is_sqs_request({"method": "POST", "path": "/12/q"})


class SignatureError(Exception):
    def __init__(self, code: str, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def call(
    endpoint: SqsEndpoint, body: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "state": {"principal": None}}
    asyncio.run(endpoint(scope, receive, send))
    return sent[0]["status"], dict(sent[0]["headers"]), sent[1]["body"]


def test_an_authenticators_refusals_are_answered_in_sqs_terms() -> None:
    seen: list[RequestParts] = []

    async def verify(parts: RequestParts) -> Principal:
        seen.append(parts)
        raise SignatureError("SignatureDoesNotMatch", "The signature does not match.")

    endpoint = SqsEndpoint(None, FastAPI(), 1 << 20, refusing_with_codes(verify, SignatureError))  # type: ignore[arg-type]
    status, headers, body = call(
        endpoint, b"{}", [(b"x-amz-target", b"AmazonSQS.ListQueues"), (b"authorization", b"AWS4-HMAC-SHA256 x")]
    )
    assert status == 403
    assert orjson.loads(body)["__type"] == "com.amazonaws.sqs#SignatureDoesNotMatch"
    assert headers[b"x-amzn-query-error"] == b"SignatureDoesNotMatch;Sender"
    assert seen[0].body == b"{}" and seen[0].path == "/"
    status, _, body = call(endpoint, b"Action=ListQueues", [(b"content-type", b"application/x-www-form-urlencoded")])
    assert status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in body
    # Without an authenticator: SQS's own refusals of an unsigned and of a signed request.
    plain = SqsEndpoint(None, FastAPI(), 1 << 20)  # type: ignore[arg-type]
    assert b"MissingAuthenticationToken" in call(plain, b"Action=ListQueues", [])[2]
    assert b"InvalidClientTokenId" in call(plain, b"Action=ListQueues", [(b"authorization", b"AWS4-HMAC-SHA256 x")])[2]
