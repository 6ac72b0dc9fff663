"""Tracing a job from its producer to its worker: the enqueue's trace context is stored with the job,
returned on claim, and continued by the Python SDK's Worker (spans kept in memory, no collector)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from jobq_client import Client, JobContext, Worker
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support import LiveServer, wait_until

PRODUCER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def named(finished: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name == name]


def traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_enqueue_claim_and_complete_through_the_sdk_make_one_trace(server_factory, spans) -> None:  # type: ignore[no-untyped-def]
    provider, exporter = spans
    server: LiveServer = server_factory(tracer_provider=provider)
    tracer = provider.get_tracer("test")

    with Client(server.url) as client, tracer.start_as_current_span("signup") as producer:
        job = client.enqueue("emails", {"to": "ada@example.com"})

    seen: list[Any] = []

    def handle(ctx: JobContext) -> str:
        seen.append(trace.get_current_span().get_span_context())
        with tracer.start_as_current_span("smtp send"):
            return "sent"

    # concurrency 2: the claim after the first long-polls, so the result goes by a complete of its own
    worker = Worker(server.url, concurrency=2, wait_seconds=1, tracer_provider=provider)
    worker.register("emails", handle)
    thread = threading.Thread(target=lambda: asyncio.run(worker.arun()))
    thread.start()
    try:
        wait_until(lambda: server.job(job.id)["status"] == "completed", what="the job to complete")
    finally:
        worker.stop()
        thread.join(30)

    finished = exporter.get_finished_spans()
    [enqueue] = named(finished, "POST /queues/{queue}/jobs")
    [process] = named(finished, "process emails")
    [send] = named(finished, "smtp send")
    [complete] = named(finished, "POST /jobs/{job_id}/complete")
    claims = named(finished, "POST /queues/{queue}/claim")

    # one trace: producer -> enqueue (server) -> the worker's job -> its handler's work, and its complete
    trace_id = producer.get_span_context().trace_id
    for span in (enqueue, process, send, complete):
        assert span.context is not None and span.context.trace_id == trace_id, span.name
    assert enqueue.parent is not None and enqueue.parent.span_id == producer.get_span_context().span_id
    assert process.parent is not None and process.parent.span_id == enqueue.context.span_id  # type: ignore[union-attr]
    assert send.parent is not None and send.parent.span_id == process.context.span_id  # type: ignore[union-attr]
    assert complete.parent is not None and complete.parent.span_id == process.context.span_id  # type: ignore[union-attr]
    assert seen == [process.get_span_context()]  # the handler ran inside the job's span

    # the stored context is the enqueue's span, and the claim that handed the job out links to it
    assert server.job(job.id)["traceparent"] == traceparent(enqueue)
    [claimed_it] = [c for c in claims if any(link.context.span_id == enqueue.context.span_id for link in c.links)]  # type: ignore[union-attr]
    assert claimed_it.links[0].attributes == {"jobq.job.id": job.id}

    assert process.kind == trace.SpanKind.CONSUMER and enqueue.kind == trace.SpanKind.SERVER
    assert process.attributes is not None and process.attributes["messaging.message.id"] == str(job.id)
    assert enqueue.attributes is not None and enqueue.attributes["http.response.status_code"] == 201


def test_a_failing_handler_marks_its_span_and_the_retry_stays_in_the_trace(server_factory, spans) -> None:  # type: ignore[no-untyped-def]
    provider, exporter = spans
    server: LiveServer = server_factory(tracer_provider=provider)
    r = server.client.post(
        "/queues/flaky/jobs", json={"payload": 1, "max_attempts": 2}, headers={"traceparent": PRODUCER}
    )
    job_id = r.json()["id"]
    attempts: list[int] = []

    def handle(ctx: JobContext) -> str:
        attempts.append(ctx.attempts)
        if ctx.attempts == 1:
            raise RuntimeError("first try fails")
        return "ok"

    worker = Worker(server.url, concurrency=2, wait_seconds=1, tracer_provider=provider)
    worker.register("flaky", handle)
    thread = threading.Thread(target=lambda: asyncio.run(worker.arun()))
    thread.start()
    try:
        c = server.client
        # The handler's attempt first, then the job: pending before the first claim would also read "pending".
        wait_until(lambda: attempts and c.get(f"/jobs/{job_id}").json()["status"] == "pending", what="a failed try")
        server.run(lambda: _due_now(server, job_id))
        wait_until(lambda: c.get(f"/jobs/{job_id}").json()["status"] == "completed", what="the retry")
    finally:
        worker.stop()
        thread.join(30)
    tries = named(exporter.get_finished_spans(), "process flaky")
    assert len(tries) == 2
    producer_trace = int(PRODUCER.split("-")[1], 16)
    assert all(t.context is not None and t.context.trace_id == producer_trace for t in tries)
    failed, succeeded = sorted(tries, key=lambda s: s.start_time or 0)
    assert failed.status.status_code == trace.StatusCode.ERROR and failed.events[0].name == "exception"
    assert succeeded.status.status_code == trace.StatusCode.UNSET


async def _due_now(server: LiveServer, job_id: int) -> None:
    async with server.services.db.connection() as conn:
        await conn.execute("UPDATE jobq.jobs SET run_at = now() WHERE id = %s", (job_id,))
    server.services.wakeups.jobs_available(["flaky"])


def test_with_tracing_off_the_producer_context_passes_through(server: LiveServer) -> None:
    assert server.services.tracing is None
    one = server.client.post("/queues/q/jobs", json={"payload": 1}, headers={"traceparent": PRODUCER}).json()
    batch = server.client.post(
        "/queues/q/jobs/batch", json={"jobs": [{"payload": 2}, {"payload": 3}]}, headers={"traceparent": PRODUCER}
    ).json()["jobs"]
    bad = server.client.post("/queues/q/jobs", json={"payload": 4}, headers={"traceparent": "00-xyz-01"}).json()
    none = server.enqueue("q", 5)
    assert [one["traceparent"], *(j["traceparent"] for j in batch)] == [PRODUCER] * 3
    assert bad["traceparent"] is None and none["traceparent"] is None  # an invalid header is ignored, not refused
    claimed = {c["id"]: c["traceparent"] for c in server.claim("q", limit=10)}
    assert claimed == {one["id"]: PRODUCER, batch[0]["id"]: PRODUCER, batch[1]["id"]: PRODUCER,
                       bad["id"]: None, none["id"]: None}  # fmt: skip


def test_the_sdk_sends_the_current_context_and_nothing_without_one(server: LiveServer, spans) -> None:  # type: ignore[no-untyped-def]
    provider, _ = spans
    with Client(server.url) as client:
        plain = client.enqueue("q", 1)
        with provider.get_tracer("test").start_as_current_span("producer") as producer:
            traced = client.enqueue("q", 2)
    assert plain.traceparent is None
    assert traced.traceparent == traceparent(producer)  # type: ignore[arg-type]
    with Client(server.url) as client:
        [claim] = client.claim("q", "w", limit=1)
    assert claim.id == plain.id and claim.traceparent is None
