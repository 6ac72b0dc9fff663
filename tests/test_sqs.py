"""The SQS API (app/sqs/, docs/sqs.md) with the real clients: boto3 over AWS JSON 1.0 for every action, and
the query protocol's form requests with their XML answers checked field by field."""

from __future__ import annotations

import base64
import hashlib
import struct
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import httpx
import orjson
import psycopg
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from app.auth.keys import new_key
from app.db import keys as store_keys
from tests.support import LiveServer, settle_long_poll

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

    # MessageRetentionPeriod, when given, is how long the queue keeps dead letters (its failed jobs).
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"MessageRetentionPeriod": "3600"})
    assert server.client.get("/queues/orders/config").json()["retention"]["failed"] == 3600
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["MessageRetentionPeriod"])["Attributes"] == {
        "MessageRetentionPeriod": "3600"
    }

    sqs.tag_queue(QueueUrl=url, Tags={"team": "billing", "env": "test"})
    sqs.untag_queue(QueueUrl=url, TagKeys=["env"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "billing"}

    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as missing:
        sqs.get_queue_url(QueueName="orders")
    assert code_of(missing) == "AWS.SimpleQueueService.NonExistentQueue"
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=url, MessageBody="x")


def test_send_receive_delete(sqs: Any, server: LiveServer, db: psycopg.Connection) -> None:
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

    # On a standard queue a MessageGroupId is the job's group (SQS's fair queues).
    grouped = sqs.send_message(QueueUrl=url, MessageBody="g", MessageGroupId="tenant-1")
    assert server.job(int(grouped["MessageId"]))["group"] == "tenant-1"
    [g] = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["MessageGroupId"])["Messages"]
    assert g["Attributes"] == {"MessageGroupId": "tenant-1"}

    # Once its job is gone (retention), a message's attributes go too.
    assert db.execute("SELECT count(*) FROM jobq.sqs_messages").fetchone() == (1,)
    db.execute("DELETE FROM jobq.jobs")
    server.run(lambda: server.services.maintenance["retention"].run_once())
    assert db.execute("SELECT count(*) FROM jobq.sqs_messages").fetchone() == (0,)


# --- messages -----------------------------------------------------------------------------------------------


def test_a_batch_with_one_bad_entry_sends_the_others(sqs: Any, server: LiveServer) -> None:
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    entries = [
        {"Id": "a", "MessageBody": "first"},
        {"Id": "bad", "MessageBody": "nul \x00 inside"},
        {"Id": "c", "MessageBody": "third", "DelaySeconds": 0},
        {"Id": "d", "MessageBody": "x", "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "nan"}}},
    ]
    out = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert [s["Id"] for s in out["Successful"]] == ["a", "c"]
    assert {f["Id"]: f["Code"] for f in out["Failed"]} == {
        "bad": "InvalidMessageContents",
        "d": "InvalidParameterValue",
    }
    assert all(f["SenderFault"] for f in out["Failed"])
    assert [s["MD5OfMessageBody"] for s in out["Successful"]] == [md5("first"), md5("third")]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert sorted(m["Body"] for m in got) == ["first", "third"]
    deleted = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "one", "ReceiptHandle": got[0]["ReceiptHandle"]},
            {"Id": "broken", "ReceiptHandle": "not-a-handle"},
            {"Id": "two", "ReceiptHandle": got[1]["ReceiptHandle"]},
        ],
    )
    assert [s["Id"] for s in deleted["Successful"]] == ["one", "two"]
    assert [(f["Id"], f["Code"]) for f in deleted["Failed"]] == [("broken", "ReceiptHandleIsInvalid")]
    assert {server.job(int(m["MessageId"]))["status"] for m in got} == {"completed"}


def test_limits_are_sqs_limits(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="q", Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]

    def refused(code: str, call: Any, **kwargs: Any) -> None:
        with pytest.raises(ClientError) as exc:
            call(QueueUrl=url, **kwargs)
        assert code_of(exc) == code, exc.value.response
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400

    refused("InvalidParameterValue", sqs.receive_message, MaxNumberOfMessages=11)
    refused("InvalidParameterValue", sqs.receive_message, MaxNumberOfMessages=0)
    refused("InvalidParameterValue", sqs.receive_message, WaitTimeSeconds=21)
    refused("InvalidParameterValue", sqs.receive_message, VisibilityTimeout=43201)
    refused("InvalidParameterValue", sqs.send_message, MessageBody="x" * 1025)
    refused("InvalidParameterValue", sqs.send_message, MessageBody="x", DelaySeconds=901)
    sqs.send_message(QueueUrl=url, MessageBody="x" * 1024)  # exactly the limit
    many = [{"Id": str(i), "MessageBody": "x"} for i in range(11)]
    refused("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", sqs.send_message_batch, Entries=many)
    refused("AWS.SimpleQueueService.EmptyBatchRequest", sqs.send_message_batch, Entries=[])
    twice = [{"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}]
    refused("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", sqs.send_message_batch, Entries=twice)
    refused(
        "AWS.SimpleQueueService.InvalidBatchEntryId",
        sqs.send_message_batch,
        Entries=[{"Id": "a b", "MessageBody": "x"}],
    )
    big = [{"Id": str(i), "MessageBody": "x" * 600} for i in range(2)]
    refused("AWS.SimpleQueueService.BatchRequestTooLong", sqs.send_message_batch, Entries=big)
    refused("ReceiptHandleIsInvalid", sqs.delete_message, ReceiptHandle="garbage")
    refused("InvalidAttributeName", sqs.get_queue_attributes, AttributeNames=["NoSuchAttribute"])
    refused("InvalidAttributeValue", sqs.set_queue_attributes, Attributes={"DelaySeconds": "-1"})
    refused("InvalidParameterValue", sqs.send_message, MessageBody="x", MessageDeduplicationId="d")
    with pytest.raises(ClientError) as exc:
        sqs.create_queue(QueueName="bad name")
    assert code_of(exc) == "InvalidParameterValue"


def test_a_long_poll_is_woken_by_a_send(server: LiveServer, sqs: Any) -> None:
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    answers: list[Any] = []

    def receive() -> None:
        c = client(server)
        answers.append(c.receive_message(QueueUrl=url, WaitTimeSeconds=20))
        c.close()

    started = time.monotonic()
    waiter = threading.Thread(target=receive)
    waiter.start()
    settle_long_poll(server, "q")
    sqs.send_message(QueueUrl=url, MessageBody="wake up")
    waiter.join(30)
    assert [m["Body"] for m in answers[0]["Messages"]] == ["wake up"]
    assert time.monotonic() - started < 20  # answered by the send, before the poll's deadline


def test_a_lapsed_visibility_timeout_redelivers_and_a_stale_handle_changes_nothing(
    server: LiveServer, sqs: Any, db: psycopg.Connection
) -> None:
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="again")
    [first] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30, AttributeNames=["All"])["Messages"]
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    assert db.execute("SELECT lease_expires_at - now() FROM jobq.jobs").fetchone()[0] <= timedelta(seconds=30)  # type: ignore[index]
    sweep(server)  # the lease lapsed (the rescuer's clock moved on): the message is visible again
    [second] = sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"])["Messages"]
    assert second["MessageId"] == first["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    assert second["ReceiptHandle"] != first["ReceiptHandle"]

    # The first receive's handle deletes nothing (no error, as in SQS) and cannot change the visibility.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    assert server.job(int(first["MessageId"]))["status"] == "running"
    with pytest.raises(ClientError) as exc:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=10)
    assert code_of(exc) == "AWS.SimpleQueueService.MessageNotInflight"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert server.job(int(first["MessageId"]))["status"] == "completed"


def test_change_message_visibility_is_a_heartbeat_and_zero_a_release(
    server: LiveServer, sqs: Any, db: psycopg.Connection
) -> None:
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "a"}, {"Id": "2", "MessageBody": "b"}])
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=10)["Messages"]
    a, b = sorted(got, key=lambda m: m["Body"])
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=a["ReceiptHandle"], VisibilityTimeout=600)
    left = db.execute("SELECT lease_expires_at - now() FROM jobq.jobs WHERE id = %s", (int(a["MessageId"]),)).fetchone()
    assert left is not None and timedelta(seconds=590) < left[0] <= timedelta(seconds=600)
    # 0: visible again at once, the receive not counted against maxReceiveCount (a jobq release).
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=b["ReceiptHandle"], VisibilityTimeout=0)
    assert server.job(int(b["MessageId"]))["status"] == "pending"
    [again] = sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"])["Messages"]
    assert again["Body"] == "b" and again["Attributes"]["ApproximateReceiveCount"] == "1"

    out = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "x", "ReceiptHandle": a["ReceiptHandle"], "VisibilityTimeout": 120},
            {"Id": "stale", "ReceiptHandle": b["ReceiptHandle"], "VisibilityTimeout": 120},
            {"Id": "y", "ReceiptHandle": again["ReceiptHandle"], "VisibilityTimeout": 0},
        ],
    )
    assert sorted(s["Id"] for s in out["Successful"]) == ["x", "y"]
    assert [(f["Id"], f["Code"]) for f in out["Failed"]] == [("stale", "MessageNotInflight")]
    assert server.job(int(b["MessageId"]))["status"] == "pending"


def test_dead_letters_after_max_receive_count_and_their_redrive(server: LiveServer, sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName="work-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = orjson.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}).decode()
    url = sqs.create_queue(QueueName="work", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"] == {
        "RedrivePolicy": policy
    }
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]
    sent = sqs.send_message(QueueUrl=url, MessageBody="poison")
    for _ in range(2):
        assert sqs.receive_message(QueueUrl=url)["Messages"][0]["MessageId"] == sent["MessageId"]
        sweep(server)
    # Received maxReceiveCount times and never deleted: a dead letter (jobq: failed, in its own queue).
    assert sqs.receive_message(QueueUrl=url).get("Messages") is None
    assert server.job(int(sent["MessageId"]))["status"] == "failed"

    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    [task] = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert task["TaskHandle"] == handle and task["Status"] == "COMPLETED"
    assert task["ApproximateNumberOfMessagesMoved"] == 1
    [back] = sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"])["Messages"]
    assert back["MessageId"] == sent["MessageId"] and back["Attributes"]["ApproximateReceiveCount"] == "1"
    with pytest.raises(ClientError) as exc:
        sqs.start_message_move_task(SourceArn="arn:aws:sqs:us-east-1:000000000000:nothing")
    assert code_of(exc) == "ResourceNotFoundException"


def test_purge_cancels_every_message(server: LiveServer, sqs: Any) -> None:
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(5)])
    [held] = sqs.receive_message(QueueUrl=url)["Messages"]
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (counts["ApproximateNumberOfMessages"], counts["ApproximateNumberOfMessagesNotVisible"]) == ("4", "1")
    sqs.purge_queue(QueueUrl=url)
    assert sqs.receive_message(QueueUrl=url).get("Messages") is None
    assert server.job(int(held["MessageId"]))["status"] == "cancelled"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=held["ReceiptHandle"])  # its worker's delete: harmless
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert counts["Attributes"] == {"ApproximateNumberOfMessages": "0"}


def test_delayed_messages(server: LiveServer, sqs: Any, db: psycopg.Connection) -> None:
    url = sqs.create_queue(QueueName="q", Attributes={"DelaySeconds": "600"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="later")  # the queue's default delay
    sqs.send_message(QueueUrl=url, MessageBody="now", DelaySeconds=0)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attrs["ApproximateNumberOfMessages"], attrs["ApproximateNumberOfMessagesDelayed"]) == ("1", "1")
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]] == ["now"]


# --- FIFO ---------------------------------------------------------------------------------------------------


def test_fifo_order_within_a_group_and_one_in_flight(server: LiveServer, sqs: Any) -> None:
    url = sqs.create_queue(QueueName="jobs.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    assert server.client.get("/queues/jobs.fifo/config").json()["ordered"] is True
    seq = []
    for n in range(3):
        for group in ("g1", "g2"):
            out = sqs.send_message(
                QueueUrl=url, MessageBody=f"{group}-{n}", MessageGroupId=group, MessageDeduplicationId=f"{group}-{n}"
            )
            seq.append(int(out["SequenceNumber"]))
    assert seq == sorted(seq)
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="x")
    assert code_of(exc) == "MissingParameter"
    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g1")  # no id, no content-based dedup
    assert code_of(exc) == "InvalidParameterValue"

    seen: dict[str, list[str]] = {"g1": [], "g2": []}
    for _ in range(3):
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
        # One in flight per group: each receive hands out the head of each group, no more.
        assert sorted(m["Attributes"]["MessageGroupId"] for m in got) == ["g1", "g2"]
        assert sqs.receive_message(QueueUrl=url).get("Messages") is None
        for m in got:
            seen[m["Attributes"]["MessageGroupId"]].append(m["Body"])
            assert m["Attributes"]["SequenceNumber"] and m["Attributes"]["MessageDeduplicationId"] == m["Body"]
        sqs.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
        )
    assert seen == {"g1": ["g1-0", "g1-1", "g1-2"], "g2": ["g2-0", "g2-1", "g2-2"]}


def test_fifo_deduplication_lasts_five_minutes(server: LiveServer, sqs: Any, db: psycopg.Connection) -> None:
    url = sqs.create_queue(QueueName="d.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"})[
        "QueueUrl"
    ]
    first = sqs.send_message(QueueUrl=url, MessageBody="once", MessageGroupId="g")
    again = sqs.send_message(QueueUrl=url, MessageBody="once", MessageGroupId="g")  # content-based: a duplicate
    explicit = sqs.send_message(QueueUrl=url, MessageBody="once", MessageGroupId="g", MessageDeduplicationId="other")
    assert again["MessageId"] == first["MessageId"] and again["SequenceNumber"] == first["SequenceNumber"]
    assert explicit["MessageId"] != first["MessageId"]
    batch = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "MessageBody": "b1", "MessageGroupId": "g", "MessageDeduplicationId": "k"},
            {"Id": "b", "MessageBody": "b2", "MessageGroupId": "g", "MessageDeduplicationId": "k"},
        ],
    )
    a, b = batch["Successful"]
    assert a["MessageId"] == b["MessageId"]
    assert db.execute("SELECT count(*) FROM jobq.jobs").fetchone() == (3,)
    expiry = db.execute("SELECT expires_at - now() FROM jobq.sqs_dedup WHERE dedup_id = 'other'").fetchone()
    assert expiry is not None and timedelta(seconds=290) < expiry[0] <= timedelta(seconds=300)

    # Five minutes later (the window moved into the past), the same id sends a new message.
    db.execute("UPDATE jobq.sqs_dedup SET expires_at = now() - interval '1 second' WHERE dedup_id = 'other'")
    later = sqs.send_message(QueueUrl=url, MessageBody="once", MessageGroupId="g", MessageDeduplicationId="other")
    assert later["MessageId"] not in (first["MessageId"], explicit["MessageId"])
    # Expired ids are pruned by the retention service.
    db.execute("UPDATE jobq.sqs_dedup SET expires_at = now() - interval '1 second'")
    server.run(lambda: server.services.maintenance["retention"].run_once())
    assert db.execute("SELECT count(*) FROM jobq.sqs_dedup").fetchone() == (0,)


def test_concurrent_sends_of_one_deduplication_id_make_one_message(server: LiveServer, sqs: Any) -> None:
    url = sqs.create_queue(QueueName="race.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    ids: list[str] = []
    barrier = threading.Barrier(6)

    def send() -> None:
        c = client(server)
        barrier.wait()
        ids.append(
            c.send_message(QueueUrl=url, MessageBody="m", MessageGroupId="g", MessageDeduplicationId="k")["MessageId"]
        )
        c.close()

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ids) == 6 and len(set(ids)) == 1


# --- SQS queues are jobq queues -------------------------------------------------------------------------------


def test_messages_and_jobs_are_one_thing(server: LiveServer, sqs: Any) -> None:
    # A job enqueued over jobq's API, received over SQS: a string payload is the body, any other payload its
    # JSON text (as PostgreSQL writes jsonb).
    server.enqueue("native", payload={"b": [1, 2], "a": "x"})
    server.enqueue("native", payload="plain text")
    url = sqs.get_queue_url(QueueName="native")["QueueUrl"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert sorted(m["Body"] for m in got) == ["plain text", '{"a": "x", "b": [1, 2]}']
    for m in got:
        assert m["MD5OfBody"] == md5(m["Body"])

    # A message sent over SQS, claimed and completed over jobq's API.
    url = sqs.create_queue(QueueName="mixed")["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody='{"not": "parsed"}')
    job = server.claim_one("mixed")
    assert job["id"] == int(sent["MessageId"]) and job["payload"] == '{"not": "parsed"}'
    r = server.client.post(f"/jobs/{job['id']}/complete", json={"claim_token": job["claim_token"]})
    assert r.status_code == 200
    stats = server.client.get("/queues/mixed/stats").json()
    assert stats["counts"]["completed"] == 1
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName="never-used")


def test_permissions_are_not_sqs_policies(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    with pytest.raises(ClientError) as exc:
        sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["1"], Actions=["SendMessage"])
    assert code_of(exc) == "AWS.SimpleQueueService.UnsupportedOperation"


# --- the query protocol -----------------------------------------------------------------------------------------


def query(server: LiveServer, action: str, path: str = "/", **params: str) -> tuple[int, ET.Element]:
    """A query-protocol request as the older SDKs and the CLI send it: a form POST, an XML answer."""
    r = server.client.post(path, data={"Action": action, "Version": "2012-11-05", **params})
    assert r.headers["content-type"] == "text/xml"
    return r.status_code, ET.fromstring(r.content)


def result(root: ET.Element, action: str) -> ET.Element:
    assert root.tag == f"{{{NS['q']}}}{action}Response", ET.tostring(root)
    assert root.findtext("q:ResponseMetadata/q:RequestId", namespaces=NS)
    found = root.find(f"q:{action}Result", NS)
    assert found is not None
    return found


def text(element: ET.Element, path: str) -> str | None:
    return element.findtext(path, namespaces=NS)


def pairs(element: ET.Element, member: str, key: str = "Name", value: str = "Value") -> dict[str, str | None]:
    return {text(e, f"q:{key}") or "": text(e, f"q:{value}") for e in element.findall(f"q:{member}", NS)}


def test_the_query_protocol_for_every_action(server: LiveServer, db: psycopg.Connection) -> None:
    status, root = query(
        server,
        "CreateQueue",
        QueueName="legacy",
        **{"Attribute.1.Name": "VisibilityTimeout", "Attribute.1.Value": "40", "Tag.1.Key": "t", "Tag.1.Value": "v"},
    )
    assert status == 200
    url = text(result(root, "CreateQueue"), "q:QueueUrl")
    assert url == f"{server.url}/000000000000/legacy"
    assert text(result(query(server, "GetQueueUrl", QueueName="legacy")[1], "GetQueueUrl"), "q:QueueUrl") == url
    listed = result(query(server, "ListQueues", QueueNamePrefix="leg")[1], "ListQueues")
    assert [e.text for e in listed.findall("q:QueueUrl", NS)] == [url]

    _, root = query(
        server, "SetQueueAttributes", QueueUrl=url, **{"Attribute.1.Name": "DelaySeconds", "Attribute.1.Value": "0"}
    )
    result(root, "SetQueueAttributes")
    attrs = pairs(
        result(
            query(server, "GetQueueAttributes", QueueUrl=url, **{"AttributeName.1": "All"})[1], "GetQueueAttributes"
        ),
        "Attribute",
    )
    assert attrs["VisibilityTimeout"] == "40" and attrs["QueueArn"] == "arn:aws:sqs:us-east-1:000000000000:legacy"
    result(query(server, "TagQueue", QueueUrl=url, **{"Tag.1.Key": "u", "Tag.1.Value": "w"})[1], "TagQueue")
    result(query(server, "UntagQueue", QueueUrl=url, **{"TagKey.1": "t"})[1], "UntagQueue")
    assert pairs(result(query(server, "ListQueueTags", QueueUrl=url)[1], "ListQueueTags"), "Tag", "Key") == {"u": "w"}

    body = "a <b> & \r\n c"
    _, root = query(
        server,
        "SendMessage",
        QueueUrl=url,
        MessageBody=body,
        **{
            "MessageAttribute.1.Name": "k",
            "MessageAttribute.1.Value.DataType": "String",
            "MessageAttribute.1.Value.StringValue": "v",
            "MessageAttribute.2.Name": "b",
            "MessageAttribute.2.Value.DataType": "Binary",
            "MessageAttribute.2.Value.BinaryValue": base64.b64encode(b"\x01\x02").decode(),
        },
    )
    sent = result(root, "SendMessage")
    attributes = {
        "k": {"DataType": "String", "StringValue": "v"},
        "b": {"DataType": "Binary", "BinaryValue": base64.b64encode(b"\x01\x02").decode()},
    }
    assert text(sent, "q:MD5OfMessageBody") == md5(body)
    assert text(sent, "q:MD5OfMessageAttributes") == md5_of_attributes(attributes)
    _, root = query(
        server,
        "SendMessageBatch",
        QueueUrl=url,
        **{
            "SendMessageBatchRequestEntry.1.Id": "one",
            "SendMessageBatchRequestEntry.1.MessageBody": "first",
            "SendMessageBatchRequestEntry.2.Id": "two",
            "SendMessageBatchRequestEntry.2.MessageBody": "",
        },
    )
    batch = result(root, "SendMessageBatch")
    assert [text(e, "q:Id") for e in batch.findall("q:SendMessageBatchResultEntry", NS)] == ["one"]
    [failed] = batch.findall("q:BatchResultErrorEntry", NS)
    assert (text(failed, "q:Id"), text(failed, "q:Code"), text(failed, "q:SenderFault")) == (
        "two",
        "InvalidParameterValue",
        "true",
    )

    _, root = query(
        server,
        "ReceiveMessage",
        QueueUrl=url,
        MaxNumberOfMessages="10",
        **{"AttributeName.1": "All", "MessageAttributeName.1": "All"},
    )
    messages = result(root, "ReceiveMessage").findall("q:Message", NS)
    by_body = {text(m, "q:Body"): m for m in messages}
    assert set(by_body) == {body, "first"}  # the \r came through the XML (escaped, not normalised away)
    m = by_body[body]
    assert text(m, "q:MD5OfBody") == md5(body)
    assert pairs(m, "Attribute")["ApproximateReceiveCount"] == "1"
    values = {
        text(a, "q:Name"): {v.tag.split("}")[1]: v.text for v in a.findall("q:Value/*", NS)}
        for a in m.findall("q:MessageAttribute", NS)
    }
    assert values == attributes
    assert text(m, "q:MD5OfMessageAttributes") == md5_of_attributes(attributes)
    handle, other = text(m, "q:ReceiptHandle"), text(by_body["first"], "q:ReceiptHandle")
    assert handle and other

    result(
        query(server, "ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout="100")[1],
        "ChangeMessageVisibility",
    )
    _, root = query(
        server,
        "ChangeMessageVisibilityBatch",
        QueueUrl=url,
        **{
            "ChangeMessageVisibilityBatchRequestEntry.1.Id": "x",
            "ChangeMessageVisibilityBatchRequestEntry.1.ReceiptHandle": other,
            "ChangeMessageVisibilityBatchRequestEntry.1.VisibilityTimeout": "100",
        },
    )
    changed = result(root, "ChangeMessageVisibilityBatch")
    assert [text(e, "q:Id") for e in changed.findall("q:ChangeMessageVisibilityBatchResultEntry", NS)] == ["x"]
    result(query(server, "DeleteMessage", QueueUrl=url, ReceiptHandle=handle)[1], "DeleteMessage")
    _, root = query(
        server,
        "DeleteMessageBatch",
        QueueUrl=url,
        **{"DeleteMessageBatchRequestEntry.1.Id": "y", "DeleteMessageBatchRequestEntry.1.ReceiptHandle": other},
    )
    deleted = result(root, "DeleteMessageBatch")
    assert [text(e, "q:Id") for e in deleted.findall("q:DeleteMessageBatchResultEntry", NS)] == ["y"]
    assert db.execute("SELECT count(*) FROM jobq.jobs WHERE status = 'completed'").fetchone() == (2,)

    # POSTed to the queue's URL, without QueueUrl (as the older SDKs do).
    _, root = query(server, "SendMessage", "/000000000000/legacy", MessageBody="by path")
    assert text(result(root, "SendMessage"), "q:MD5OfMessageBody") == md5("by path")
    result(query(server, "PurgeQueue", QueueUrl=url)[1], "PurgeQueue")

    query(server, "CreateQueue", QueueName="legacy-dlq")
    policy = orjson.dumps(
        {"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:legacy-dlq", "maxReceiveCount": 1}
    )
    query(
        server,
        "SetQueueAttributes",
        QueueUrl=url,
        **{"Attribute.1.Name": "RedrivePolicy", "Attribute.1.Value": policy.decode()},
    )
    dlq = f"{server.url}/000000000000/legacy-dlq"
    sources = result(query(server, "ListDeadLetterSourceQueues", QueueUrl=dlq)[1], "ListDeadLetterSourceQueues")
    assert [e.text for e in sources.findall("q:QueueUrl", NS)] == [url]
    arn = "arn:aws:sqs:us-east-1:000000000000:legacy-dlq"
    task = text(result(query(server, "StartMessageMoveTask", SourceArn=arn)[1], "StartMessageMoveTask"), "q:TaskHandle")
    [entry] = result(query(server, "ListMessageMoveTasks", SourceArn=arn)[1], "ListMessageMoveTasks").findall(
        "q:ListMessageMoveTasksResultEntry", NS
    )
    assert (text(entry, "q:TaskHandle"), text(entry, "q:Status")) == (task, "COMPLETED")
    result(query(server, "DeleteQueue", QueueUrl=url)[1], "DeleteQueue")

    # Errors: the query protocol's ErrorResponse.
    status, root = query(server, "GetQueueUrl", QueueName="legacy")
    assert status == 400 and root.tag == f"{{{NS['q']}}}ErrorResponse"
    assert text(root, "q:Error/q:Code") == "AWS.SimpleQueueService.NonExistentQueue"
    assert text(root, "q:Error/q:Type") == "Sender" and text(root, "q:RequestId")
    assert query(server, "NoSuchAction")[1].findtext("q:Error/q:Code", namespaces=NS) == "InvalidAction"
    r = server.client.post("/", data={"QueueName": "x"})
    assert r.status_code == 400 and b"<Code>MissingAction</Code>" in r.content


# --- errors, and what an open service refuses ----------------------------------------------------------------


def json_call(server: LiveServer, action: str, body: bytes | dict[str, Any], **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return server.client.post(
        "/",
        content=content,
        headers={"content-type": "application/x-amz-json-1.0", "x-amz-target": f"AmazonSQS.{action}", **headers},
    )


def test_json_errors_are_sqs_errors_never_a_500(server: LiveServer) -> None:
    r = json_call(server, "GetQueueUrl", {"QueueName": "nope"})
    assert r.status_code == 400
    assert r.json() == {
        "__type": "com.amazonaws.sqs#QueueDoesNotExist",
        "message": "The specified queue does not exist.",
    }
    assert r.headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"
    assert r.headers["content-type"] == "application/x-amz-json-1.0"
    json_call(server, "CreateQueue", {"QueueName": "q"})
    url = f"{server.url}/000000000000/q"
    bad = [
        ("SendMessage", b"not json"),
        ("SendMessage", b"[1, 2]"),
        ("SendMessage", {"QueueUrl": url}),
        ("SendMessage", {"QueueUrl": url, "MessageBody": 5}),
        ("SendMessage", {"QueueUrl": url, "MessageBody": "x", "MessageAttributes": []}),
        ("SendMessage", {"QueueUrl": url, "MessageBody": "x", "MessageAttributes": {"a": {"DataType": "Weird"}}}),
        (
            "SendMessage",
            {
                "QueueUrl": url,
                "MessageBody": "x",
                "MessageAttributes": {"a": {"DataType": "Binary", "BinaryValue": "!!"}},
            },
        ),
        ("SendMessage", b'{"QueueUrl": "%s", "MessageBody": "\\ud800"}' % url.encode()),
        ("SendMessageBatch", {"QueueUrl": url, "Entries": "x"}),
        ("SendMessageBatch", {"QueueUrl": url, "Entries": [1]}),
        ("SendMessageBatch", {"QueueUrl": url}),
        ("ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": "many"}),
        ("ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": True}),
        ("ReceiveMessage", {"QueueUrl": url, "AttributeNames": "All"}),
        ("ReceiveMessage", {"QueueUrl": 7}),
        ("ReceiveMessage", {}),
        ("DeleteMessage", {"QueueUrl": url, "ReceiptHandle": "99999999999999999999:x"}),
        ("DeleteMessage", {"QueueUrl": url, "ReceiptHandle": ["x"]}),
        ("ChangeMessageVisibility", {"QueueUrl": url, "ReceiptHandle": "1:abc"}),
        ("ChangeMessageVisibility", {"QueueUrl": url, "ReceiptHandle": "1:abc", "VisibilityTimeout": 5}),
        ("SetQueueAttributes", {"QueueUrl": url, "Attributes": {"RedrivePolicy": "{}"}}),
        ("SetQueueAttributes", {"QueueUrl": url, "Attributes": {"VisibilityTimeout": 5}}),
        ("SetQueueAttributes", {"QueueUrl": url, "Attributes": {"FifoQueue": "true"}}),
        ("CreateQueue", {"QueueName": "x" * 81}),
        ("CreateQueue", {"QueueName": "plain", "Attributes": {"FifoQueue": "true"}}),
        ("ListQueues", {"NextToken": "%%%"}),
        ("StartMessageMoveTask", {"SourceArn": "not an arn"}),
        ("NoSuchAction", {}),
    ]
    for action, body in bad:
        r = json_call(server, action, body)
        assert r.status_code == 400, (action, body, r.status_code, r.text)
        assert r.json()["__type"].startswith("com.amazonaws.sqs#") and r.json()["message"], (action, body)
        assert r.headers["x-amzn-query-error"].endswith(";Sender")
    r = server.client.post("/", content=b"", headers={"x-amz-target": "DynamoDB_20120810.GetItem"})
    assert r.status_code == 400 and r.json()["__type"] == "com.amazonaws.sqs#InvalidAction"


def test_an_open_service_refuses_cross_site_sqs_requests(server: LiveServer, db: psycopg.Connection) -> None:
    form = {"Action": "CreateQueue", "QueueName": "csrf"}
    # A web page's form: a foreign Origin (refused by the exposure rules before any action runs).
    r = server.client.post("/", data=form, headers={"origin": "https://evil.example"})
    assert r.status_code == 403
    # A browser that sends no Origin still marks the request as cross-site.
    for site in ("cross-site", "same-site"):
        r = server.client.post("/", data=form, headers={"sec-fetch-site": site})
        assert r.status_code == 403 and b"<Code>AccessDenied</Code>" in r.content, site
    assert db.execute("SELECT count(*) FROM jobq.sqs_queues").fetchone() == (0,)
    # What the SDKs send (neither header), and what a browser marks as not cross-site, are answered.
    assert server.client.post("/", data=form).status_code == 200
    assert server.client.post("/", data=form, headers={"sec-fetch-site": "none"}).status_code == 200
    assert db.execute("SELECT count(*) FROM jobq.sqs_queues").fetchone() == (1,)


def test_with_keys_on_sqs_requests_need_a_key(server_factory: Any) -> None:
    key = "k" * 40
    server = server_factory(auth="on", api_key=key)
    # No credentials at all, and an AWS signature this build cannot verify: SQS's own refusals.
    r = json_call(server, "ListQueues", {})
    assert r.status_code == 403 and r.json()["__type"] == "com.amazonaws.sqs#MissingAuthenticationToken"
    signed = client(server)
    with pytest.raises(ClientError) as exc:
        signed.list_queues()
    assert code_of(exc) == "InvalidClientTokenId"
    signed.close()
    r = json_call(server, "ListQueues", {}, authorization="Bearer wrong-key-wrong-key-wrong-key-wrong")
    assert r.status_code == 403 and r.json()["__type"] == "com.amazonaws.sqs#InvalidClientTokenId"
    # A jobq key works as a Bearer token, with its scopes.
    r = json_call(server, "CreateQueue", {"QueueName": "keyed"}, authorization=f"Bearer {key}")
    assert r.status_code == 200, r.text
    # jobq's own routes are unchanged: still 401 problem+json without a key.
    assert server.client.get("/queues").status_code == 401


def test_a_key_limited_to_some_queues_and_scopes(server_factory: Any, db: psycopg.Connection) -> None:
    key = "k" * 40
    server = server_factory(auth="on", api_key=key)
    admin = {"authorization": f"Bearer {key}"}
    token, selector, key_hash = new_key()
    store_keys.api_key_insert(db, "producer", selector, key_hash, ["produce"], ["mine-*"])
    producer = {"authorization": f"Bearer {token}"}
    json_call(server, "CreateQueue", {"QueueName": "mine-a"}, **admin)
    json_call(server, "CreateQueue", {"QueueName": "theirs"}, **admin)
    url = f"{server.url}/000000000000/"
    assert (
        json_call(server, "SendMessage", {"QueueUrl": url + "mine-a", "MessageBody": "x"}, **producer).status_code
        == 200
    )
    r = json_call(server, "SendMessage", {"QueueUrl": url + "theirs", "MessageBody": "x"}, **producer)
    assert r.status_code == 403 and r.json()["__type"] == "com.amazonaws.sqs#AccessDenied"
    r = json_call(server, "ReceiveMessage", {"QueueUrl": url + "mine-a"}, **producer)
    assert r.status_code == 403 and r.json()["__type"] == "com.amazonaws.sqs#AccessDenied"
    listed = json_call(server, "ListQueues", {}, **producer).json()
    assert listed == {"QueueUrls": [url + "mine-a"]}


def test_malformed_query_requests_are_sqs_errors_never_a_500(server: LiveServer) -> None:
    query(server, "CreateQueue", QueueName="q")
    url = f"{server.url}/000000000000/q"
    form = {"content-type": "application/x-www-form-urlencoded"}
    bad = [
        f"Action=SendMessage&QueueUrl={url}&MessageBody=%FF%FE".encode(),  # not UTF-8
        b"\xff\xfe\x00garbage",
        f"Action=SendMessageBatch&QueueUrl={url}&SendMessageBatchRequestEntry.x.Id=1".encode(),
        f"Action=SendMessageBatch&QueueUrl={url}&SendMessageBatchRequestEntry.1=flat".encode(),
        f"Action=SetQueueAttributes&QueueUrl={url}&Attribute.1.Name=DelaySeconds".encode(),
        f"Action=SendMessage&QueueUrl={url}&MessageBody=x&MessageAttribute.1.Name=a&MessageAttribute.1.Value=x".encode(),
        f"Action=ReceiveMessage&QueueUrl={url}&MaxNumberOfMessages=1e3".encode(),
        f"Action=ReceiveMessage&QueueUrl={url}&AttributeName.99999999999999999999999=Nope".encode(),
        f"Action=DeleteMessage&QueueUrl={url}&ReceiptHandle=1:".encode(),
        f"Action=ChangeMessageVisibility&QueueUrl={url}&ReceiptHandle=1:a&VisibilityTimeout=-5".encode(),
        b"Action=GetQueueUrl",
        b"Action=SendMessage&QueueUrl=http://x/000000000000/bad%20name&MessageBody=x",
        b"Action=ListQueues&MaxResults=0",
    ]
    for body in bad:
        r = server.client.post("/", content=body, headers=form)
        assert r.status_code == 400, (body, r.status_code, r.text)
        root = ET.fromstring(r.content)
        assert root.tag == f"{{{NS['q']}}}ErrorResponse" and text(root, "q:Error/q:Code"), (body, r.text)
    # A body over JOBQ_MAX_REQUEST_BYTES is refused while it is read.
    big = server.client.post(
        "/", content=b"Action=ListQueues&x=" + b"a" * (server.settings.max_request_bytes + 1), headers=form
    )
    assert big.status_code in (400, 413)
