"""The SQS API (app/sqs/, docs/sqs.md) with the real clients: boto3 over AWS JSON 1.0 for every action, and
the query protocol's form requests with their XML answers checked field by field."""

from __future__ import annotations

import base64
import hashlib
import struct
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support import LiveServer

NS = {"q": "http://queue.amazonaws.com/doc/2012-11-05/"}
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def client(server: LiveServer) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret",
        config=Config(retries={"max_attempts": 0}, read_timeout=60),
    )


@pytest.fixture
def sqs(server: LiveServer) -> Iterator[Any]:
    c = client(server)
    yield c
    c.close()


def code_of(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


def md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """AWS's MD5 of message attributes, written out independently of app/sqs/digests.py (botocore does not
    check it; the Java and JavaScript SDKs do, by this algorithm)."""
    raw = b""
    for name in sorted(attributes):
        value = attributes[name]
        kind = value["DataType"]
        raw += struct.pack("!I", len(name.encode())) + name.encode()
        raw += struct.pack("!I", len(kind.encode())) + kind.encode()
        if "BinaryValue" in value:
            data = value["BinaryValue"]
            data = data if isinstance(data, bytes) else base64.b64decode(data)
            raw += b"\x02" + struct.pack("!I", len(data)) + data
        else:
            text = value["StringValue"].encode()
            raw += b"\x01" + struct.pack("!I", len(text)) + text
    return hashlib.md5(raw).hexdigest()


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def sweep(server: LiveServer, now: datetime = FAR_FUTURE) -> Any:
    return server.run(lambda: server.services.maintenance["rescuer"].run_once(now=now))


# --- queues -------------------------------------------------------------------------------------------------


def test_queue_lifecycle(sqs: Any, server: LiveServer) -> None:
    url = sqs.create_queue(QueueName="orders", Attributes={"VisibilityTimeout": "45", "DelaySeconds": "0"})["QueueUrl"]
    assert url == f"{server.url}/000000000000/orders"
    # Creating it again with the same attributes answers with the same URL; with others, it is refused.
    assert sqs.create_queue(QueueName="orders", Attributes={"DelaySeconds": "0"})["QueueUrl"] == url
    with pytest.raises(ClientError) as exc:
        sqs.create_queue(QueueName="orders", Attributes={"DelaySeconds": "5"})
    assert code_of(exc) == "QueueAlreadyExists"
    assert sqs.get_queue_url(QueueName="orders")["QueueUrl"] == url
    sqs.create_queue(QueueName="other")
    assert sqs.list_queues()["QueueUrls"] == [url, f"{server.url}/000000000000/other"]
    assert sqs.list_queues(QueueNamePrefix="ord")["QueueUrls"] == [url]
    page = sqs.list_queues(MaxResults=1)
    assert page["QueueUrls"] == [url] and "NextToken" in page
    assert sqs.list_queues(MaxResults=1, NextToken=page["NextToken"])["QueueUrls"] == [
        f"{server.url}/000000000000/other"
    ]

    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "45"
    assert attrs["QueueArn"] == "arn:aws:sqs:us-east-1:000000000000:orders"
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert attrs["MaximumMessageSize"] == "262144"
    assert abs(int(attrs["CreatedTimestamp"]) - time.time()) < 60
    assert "FifoQueue" not in attrs
    # VisibilityTimeout is the queue's jobq lease.
    assert server.client.get("/queues/orders/config").json()["lease_seconds"] == 45

    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "60", "ReceiveMessageWaitTimeSeconds": "3"})
    attrs = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["VisibilityTimeout", "ReceiveMessageWaitTimeSeconds"]
    )
    assert attrs["Attributes"] == {"VisibilityTimeout": "60", "ReceiveMessageWaitTimeSeconds": "3"}

    sqs.tag_queue(QueueUrl=url, Tags={"team": "billing", "env": "test"})
    sqs.untag_queue(QueueUrl=url, TagKeys=["env"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "billing"}

    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as missing:
        sqs.get_queue_url(QueueName="orders")
    assert code_of(missing) == "AWS.SimpleQueueService.NonExistentQueue"
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=url, MessageBody="x")


def test_send_receive_delete(sqs: Any, server: LiveServer) -> None:
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    body = 'line one\r\nline "two" \t é 𝄞 <xml> & {"json": 1}'
    attributes = {
        "kind": {"DataType": "String", "StringValue": "order"},
        "count": {"DataType": "Number", "StringValue": "12.5"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01binary\xff"},
        "custom": {"DataType": "String.custom", "StringValue": "c"},
    }
    sent = sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == md5(body)
    assert sent["MD5OfMessageAttributes"] == md5_of_attributes(attributes)

    got = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"]
    )
    [m] = got["Messages"]
    assert m["MessageId"] == sent["MessageId"]
    assert m["Body"] == body
    assert m["MD5OfBody"] == md5(body)
    assert m["MessageAttributes"] == attributes
    assert m["MD5OfMessageAttributes"] == md5_of_attributes(attributes)
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert abs(int(m["Attributes"]["SentTimestamp"]) / 1000 - time.time()) < 60

    # The message is a job: running, its payload the body as a JSON string.
    job = server.job(int(m["MessageId"]))
    assert job["status"] == "running" and job["payload"] == body and job["queue"] == "q"
    assert sqs.receive_message(QueueUrl=url).get("Messages") is None  # in flight: not visible
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert server.job(int(m["MessageId"]))["status"] == "completed"
