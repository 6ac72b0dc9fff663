"""The SQS API beside jobq's own (issue 23, item 6): SendMessageBatch of 10 against a batch enqueue of 10, and
an SQS-style drain (ReceiveMessage 10 + DeleteMessageBatch, AWS JSON 1.0) against claim 10 + batch complete,
on the same service and queue. Every answer is checked, as in bench/phases.py."""

from __future__ import annotations

from typing import Any

import orjson

from bench.harness import HOST, PAYLOAD, PhaseError, expect
from bench.loadgen import Connection

QUEUE = "bench"
BODY = orjson.dumps(PAYLOAD).decode()  # the same bytes a jobq enqueue carries, as a message body


def target(action: str) -> bytes:
    return b"X-Amz-Target: AmazonSQS.%s\r\n" % action.encode()


SEND_BATCH, RECEIVE, DELETE_BATCH, CREATE = (
    target(a) for a in ("SendMessageBatch", "ReceiveMessage", "DeleteMessageBatch", "CreateQueue")
)


def queue_url(port: int) -> str:
    return f"http://{HOST}:{port}/000000000000/{QUEUE}"


async def create_queue(port: int) -> None:
    conn = await Connection(HOST, port).open()
    try:
        status, raw = await conn.post("/", orjson.dumps({"QueueName": QUEUE}), CREATE)
        expect(status, raw, 200)
    finally:
        await conn.close()


def _answer(status: int, raw: bytes) -> dict[str, Any]:
    expect(status, raw, 200)
    doc: dict[str, Any] = orjson.loads(raw)
    if doc.get("Failed"):
        raise PhaseError(f"entries failed: {doc['Failed']!r:.300}")
    return doc


class SendBatch:
    """SendMessageBatch of 10 messages; counts messages sent."""

    def __init__(self, port: int, size: int = 10) -> None:
        self.port = port
        self.size = size
        entries = [{"Id": str(i), "MessageBody": BODY} for i in range(size)]
        self.body = orjson.dumps({"QueueUrl": queue_url(port), "Entries": entries})

    async def __call__(self, conn: Connection, counter: list[int]) -> None:
        doc = _answer(*await conn.post("/", self.body, SEND_BATCH))
        if len(doc.get("Successful", ())) != self.size:
            raise PhaseError(f"SendMessageBatch answered {doc!r:.300}")
        counter[0] += self.size


class Drain:
    """ReceiveMessage of 10, then DeleteMessageBatch of what came; counts messages deleted."""

    def __init__(self, port: int, size: int = 10) -> None:
        self.port = port
        self.url = queue_url(port)
        self.receive = orjson.dumps({"QueueUrl": self.url, "MaxNumberOfMessages": size, "VisibilityTimeout": 60})

    async def __call__(self, conn: Connection, counter: list[int]) -> None:
        messages = _answer(*await conn.post("/", self.receive, RECEIVE)).get("Messages", [])
        if not messages:
            raise PhaseError("the queue ran dry: preload more jobs (--preload)")
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        body = orjson.dumps({"QueueUrl": self.url, "Entries": entries})
        doc = _answer(*await conn.post("/", body, DELETE_BATCH))
        if len(doc.get("Successful", ())) != len(entries):
            raise PhaseError(f"DeleteMessageBatch answered {doc!r:.300}")
        counter[0] += len(entries)
