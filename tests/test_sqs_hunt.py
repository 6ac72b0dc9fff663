"""SQS requests found by a bug hunt (issue 23) that once broke the endpoint: each is answered with the SQS
error an SDK expects, never a 500 nor an answer its parser cannot read."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import psycopg

from app.auth.keys import new_key
from app.db import keys as store_keys
from tests.support import LiveServer
from tests.test_sqs import json_call

FORM = {"content-type": "application/x-www-form-urlencoded"}


def form(server: LiveServer, body: bytes) -> ET.Element:
    r = server.client.post("/", content=body, headers=FORM)
    assert r.status_code < 500, (body, r.status_code, r.text)
    return ET.fromstring(r.content)  # parses: what the query protocol's SDKs must do


def test_non_ascii_digits_are_refused_not_a_500(server: LiveServer) -> None:
    # str.isdigit() is true of `²`, which int() refuses: receipt handles, maxReceiveCount, list indexes.
    json_call(server, "CreateQueue", {"QueueName": "q"})
    url = f"{server.url}/000000000000/q"
    r = json_call(server, "DeleteMessage", {"QueueUrl": url, "ReceiptHandle": "\u00b2:abc"})
    assert r.status_code == 400 and r.json()["__type"] == "com.amazonaws.sqs#ReceiptHandleIsInvalid"
    r = json_call(
        server, "ChangeMessageVisibility", {"QueueUrl": url, "ReceiptHandle": "\u00b2:a", "VisibilityTimeout": 1}
    )
    assert r.status_code == 400 and r.json()["__type"] == "com.amazonaws.sqs#ReceiptHandleIsInvalid"
    policy = '{"maxReceiveCount": "\u00b2", "deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:q"}'
    r = json_call(server, "CreateQueue", {"QueueName": "src", "Attributes": {"RedrivePolicy": policy}})
    assert r.status_code == 400 and r.json()["__type"] == "com.amazonaws.sqs#InvalidParameterValue"
    root = form(server, f"Action=SendMessage&QueueUrl={url}&MessageBody=x&MessageAttribute.%C2%B2.Name=a".encode())
    assert root.tag.endswith("SendMessageResponse")  # the odd index is no list member: left out, as SQS does


def test_a_queue_attribute_that_is_not_a_string_is_refused(server: LiveServer) -> None:
    for attrs in ({"FifoQueue": 5}, {"FifoQueue": None}, {"FifoQueue": ["true"]}, {"DelaySeconds": 5}):
        r = json_call(server, "CreateQueue", {"QueueName": "typed", "Attributes": attrs})
        assert r.status_code == 400, (attrs, r.text)
        assert r.json()["__type"] == "com.amazonaws.sqs#InvalidAttributeValue", (attrs, r.text)


def test_a_redrive_policy_holding_nul_is_refused_and_breaks_no_other_queue(server: LiveServer) -> None:
    # Every queue's RedrivePolicy is read as jsonb, which refuses \u0000: one stored would fail the lookup
    # of dead-letter sources for every queue, whoever owns it.
    url = f"{server.url}/000000000000/"
    for name in ("a1", "b1", "b1-src"):
        assert json_call(server, "CreateQueue", {"QueueName": name}).status_code == 200
    arn = "arn:aws:sqs:us-east-1:000000000000:"
    good = f'{{"maxReceiveCount": 3, "deadLetterTargetArn": "{arn}b1"}}'
    assert (
        json_call(
            server, "SetQueueAttributes", {"QueueUrl": url + "b1-src", "Attributes": {"RedrivePolicy": good}}
        ).status_code
        == 200
    )
    for bad in (
        '{"maxReceiveCount": 3, "deadLetterTargetArn": "arn:aws:sqs:us-east-1\\u0000:000000000000:a1"}',
        f'{{"maxReceiveCount": 3, "deadLetterTargetArn": "{arn}a1", "x": ["\\u0000"]}}',
        f'{{"maxReceiveCount": 3, "deadLetterTargetArn": "{arn}a1", "x": {"[" * 1000}"\\u0000"{"]" * 1000}}}',
    ):
        r = json_call(server, "SetQueueAttributes", {"QueueUrl": url + "a1", "Attributes": {"RedrivePolicy": bad}})
        assert r.status_code == 400 and r.json()["__type"] == "com.amazonaws.sqs#InvalidParameterValue", r.text
    r = json_call(server, "ListDeadLetterSourceQueues", {"QueueUrl": url + "b1"})
    assert r.status_code == 200 and r.json() == {"queueUrls": [url + "b1-src"]}, r.text
    r = json_call(server, "StartMessageMoveTask", {"SourceArn": arn + "b1"})
    assert r.status_code == 200, r.text


def test_an_underscore_in_a_dead_letter_queue_name_matches_itself_only(server: LiveServer) -> None:
    url = f"{server.url}/000000000000/"
    for name in ("dl_q", "dlxq", "src"):
        assert json_call(server, "CreateQueue", {"QueueName": name}).status_code == 200
    policy = '{"maxReceiveCount": 3, "deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:dlxq"}'
    r = json_call(server, "SetQueueAttributes", {"QueueUrl": url + "src", "Attributes": {"RedrivePolicy": policy}})
    assert r.status_code == 200
    assert json_call(server, "ListDeadLetterSourceQueues", {"QueueUrl": url + "dlxq"}).json() == {
        "queueUrls": [url + "src"]
    }
    assert json_call(server, "ListDeadLetterSourceQueues", {"QueueUrl": url + "dl_q"}).json() == {"queueUrls": []}


def test_query_answers_stay_xml_whatever_the_request_holds(server: LiveServer) -> None:
    # XML 1.0 cannot hold a control character, not even as &#1;: an error quoting one, or a value stored
    # with one, would be an answer the query protocol's SDKs fail to parse instead of an SQS error.
    json_call(server, "CreateQueue", {"QueueName": "q"})
    url = f"{server.url}/000000000000/q"
    for body in (
        f"Action=SendMessage&QueueUrl={url}&MessageBody=x&MessageGroupId=%01",
        f"Action=DeleteMessage&QueueUrl={url}&ReceiptHandle=%01%EF%BF%BF",
        "Action=Nope%01",
        f"Action=SendMessage&QueueUrl={url}&MessageBody=x&MessageAttribute.1.Name=a%01",
    ):
        root = form(server, body.encode())
        assert root.tag.endswith("ErrorResponse"), body
    # Values kept and answered later: refused when given.
    r = json_call(server, "TagQueue", {"QueueUrl": url, "Tags": {"k": "v\x01"}})
    assert r.status_code == 400 and r.json()["__type"] == "com.amazonaws.sqs#InvalidParameterValue"
    assert form(server, f"Action=TagQueue&QueueUrl={url}&Tag.1.Key=k%01&Tag.1.Value=v".encode()).tag.endswith(
        "ErrorResponse"
    )
    assert form(server, f"Action=ListQueueTags&QueueUrl={url}".encode()).tag.endswith("ListQueueTagsResponse")
    attrs = {"a": {"DataType": "String.\uffff", "StringValue": "v"}}
    r = json_call(server, "SendMessage", {"QueueUrl": url, "MessageBody": "x", "MessageAttributes": attrs})
    assert r.status_code == 400 and r.json()["__type"] == "com.amazonaws.sqs#InvalidParameterValue"
    policy = '{"maxReceiveCount": 3, "deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:q", "x": "\uffff"}'
    r = json_call(server, "SetQueueAttributes", {"QueueUrl": url, "Attributes": {"RedrivePolicy": policy}})
    assert r.status_code == 400 and r.json()["__type"] == "com.amazonaws.sqs#InvalidParameterValue"
    r = json_call(server, "StartMessageMoveTask", {"SourceArn": "arn:aws:sqs:us-east-1\x01:000000000000:q"})
    assert r.status_code == 400 and r.json()["__type"] == "com.amazonaws.sqs#InvalidParameterValue"
    listed = form(server, b"Action=ListMessageMoveTasks&SourceArn=arn:aws:sqs:us-east-1:000000000000:q")
    assert listed.tag.endswith("ListMessageMoveTasksResponse")


def test_a_move_task_names_no_queue_outside_the_keys_patterns(server_factory: Any, db: psycopg.Connection) -> None:
    key = "k" * 40
    server = server_factory(auth="on", api_key=key)
    admin = {"authorization": f"Bearer {key}"}
    token, selector, key_hash = new_key()
    store_keys.api_key_insert(db, "a-admin", selector, key_hash, ["produce", "consume", "admin"], ["a*"])
    mine = {"authorization": f"Bearer {token}"}
    url, arn = f"{server.url}/000000000000/", "arn:aws:sqs:us-east-1:000000000000:"
    for name in ("a-dlq", "a-src", "b1"):
        assert json_call(server, "CreateQueue", {"QueueName": name}, **admin).status_code == 200
    policy = f'{{"maxReceiveCount": 1, "deadLetterTargetArn": "{arn}a-dlq"}}'
    for name in ("a-src", "b1"):  # b1's owner points its dead letters at a queue of the a-admin's
        r = json_call(
            server, "SetQueueAttributes", {"QueueUrl": url + name, "Attributes": {"RedrivePolicy": policy}}, **admin
        )
        assert r.status_code == 200
    assert json_call(server, "ListDeadLetterSourceQueues", {"QueueUrl": url + "a-dlq"}, **mine).json() == {
        "queueUrls": [url + "a-src"]
    }
    r = json_call(server, "StartMessageMoveTask", {"SourceArn": arn + "a-dlq"}, **mine)
    assert r.status_code == 200 and "b1" not in r.text, r.text
    r = json_call(server, "StartMessageMoveTask", {"SourceArn": arn + "a-dlq", "DestinationArn": arn + "b1"}, **mine)
    assert r.status_code == 400 and "b1" not in r.json()["message"], r.text


def test_list_queues_pages_past_queues_the_key_may_not_see(server_factory: Any, db: psycopg.Connection) -> None:
    key = "k" * 40
    server = server_factory(auth="on", api_key=key)
    admin = {"authorization": f"Bearer {key}"}
    token, selector, key_hash = new_key()
    store_keys.api_key_insert(db, "two", selector, key_hash, ["consume"], ["a1", "x1"])
    mine = {"authorization": f"Bearer {token}"}
    url = f"{server.url}/000000000000/"
    for name in ("a1", "b1", "b2", "b3", "x1"):
        assert json_call(server, "CreateQueue", {"QueueName": name}, **admin).status_code == 200
    first = json_call(server, "ListQueues", {"MaxResults": 1}, **mine).json()
    assert first["QueueUrls"] == [url + "a1"] and "NextToken" in first, first
    second = json_call(server, "ListQueues", {"MaxResults": 1, "NextToken": first["NextToken"]}, **mine).json()
    assert second == {"QueueUrls": [url + "x1"]}
    assert json_call(server, "ListQueues", {"MaxResults": 2}, **mine).json() == {"QueueUrls": [url + "a1", url + "x1"]}


def test_batch_entries_nested_in_entries_are_left_out(server: LiveServer) -> None:
    json_call(server, "CreateQueue", {"QueueName": "q"})
    url = f"{server.url}/000000000000/q"
    deep = ".".join(["SendMessageBatchRequestEntry.1"] * 2000)  # fits the request size; deeper than recursion may go
    root = form(server, f"Action=SendMessageBatch&QueueUrl={url}&{deep}.Id=a&{deep}.MessageBody=x".encode())
    assert root.tag.endswith("ErrorResponse")  # the one entry has no Id of its own
    entry = "SendMessageBatchRequestEntry.1"
    body = f"Action=SendMessageBatch&QueueUrl={url}&{entry}.Id=a&{entry}.MessageBody=x&{entry}.{entry}.Id=b"
    root = form(server, body.encode())
    assert root.tag.endswith("SendMessageBatchResponse")
    assert [e.text for e in root.iter() if e.tag.endswith("}Id")] == ["a"]
