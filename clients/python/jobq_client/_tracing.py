"""OpenTelemetry, used only when `opentelemetry-api` is installed (`pip install 'jobq-client[otel]'`):
requests carry the current trace context (W3C `traceparent`), and each job a Worker runs gets a span that
continues the trace of the enqueue that made it (the claim's `traceparent`). Without the package, or
without an SDK configured by the application, this costs next to nothing and records nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the SDK works the same without it
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from jobq_client.models import Claim

VERSION = "0.1.0"
AVAILABLE = trace is not None


def inject(headers: dict[str, str]) -> None:
    """Add the current trace context to a request's headers (the application's propagators: W3C trace
    context and baggage by default). Nothing when no span is current."""
    if trace is not None:
        propagate.inject(headers)


class JobSpans:
    """Makes the span of each job a worker runs: `process <queue>`, kind CONSUMER, the child of the claim's
    `traceparent` (a root span when it has none). `tracer_provider`: the application's, else the global one."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self._tracer = None
        if trace is not None:
            self._tracer = trace.get_tracer("jobq_client", VERSION, tracer_provider=tracer_provider)
            self._w3c = TraceContextTextMapPropagator()

    def start(self, claim: Claim, worker: str) -> tuple[Any, object] | None:
        """The job's span, made current (the handler, its heartbeats and its outcome run inside it);
        pass the result to end()."""
        if self._tracer is None:
            return None
        parent = otel_context.Context()  # not the worker's own context: a job without one starts a trace
        if claim.traceparent:
            parent = self._w3c.extract({"traceparent": claim.traceparent}, context=parent)
        span = self._tracer.start_span(
            f"process {claim.queue}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "jobq",
                "messaging.operation.type": "process",
                "messaging.destination.name": claim.queue,
                "messaging.message.id": str(claim.id),
                "messaging.consumer.group.name": worker,
                "jobq.job.attempt": claim.attempts,
                "jobq.job.max_attempts": claim.max_attempts,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        return span, token

    @staticmethod
    def failed(started: tuple[Any, object] | None, exc: BaseException, retried: bool) -> None:
        if started is not None:
            span = started[0]
            span.record_exception(exc)
            span.set_status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:200])
            span.set_attribute("jobq.job.retried", retried)

    @staticmethod
    def note(started: tuple[Any, object] | None, key: str, value: str) -> None:
        if started is not None:
            started[0].set_attribute(key, value)

    @staticmethod
    def end(started: tuple[Any, object] | None) -> None:
        if started is not None:
            span, token = started
            span.end()
            otel_context.detach(token)  # type: ignore[arg-type]
