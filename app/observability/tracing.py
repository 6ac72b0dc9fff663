"""OpenTelemetry tracing, optional: a span per request, and the trace context a job carries from its
producer to its worker.

Off unless the standard variables ask for it: OTEL_TRACES_EXPORTER (other than `none`), or an OTLP
endpoint (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT); OTEL_SDK_DISABLED=true wins.
On, it needs the OpenTelemetry SDK (`pip install 'jobq[otel]'`); without it the service logs a warning and
runs untraced. Everything else is the SDK's own configuration: OTEL_SERVICE_NAME (default `jobq`),
OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_EXPORTER_OTLP_*, OTEL_BSP_*, OTEL_PROPAGATORS. A
tracer provider that is already installed (`opentelemetry-instrument jobq serve`) is used as it is.

Nothing here is imported from `opentelemetry` until tracing is on, and with tracing off the request path
pays nothing for it: the ASGI layer tests one attribute per request (app/observability/logs.py Observability).

The job's trace context: an enqueue stores one W3C `traceparent` with its jobs, returned on claim, so that
the worker's span continues the producer's trace. With tracing on it is the enqueue request's span; with it
off, the producer's own `traceparent` header passes through as it came (a valid one), so producer and
worker still join up across an untraced jobq."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from starlette.types import Scope

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, TracerProvider

log = logging.getLogger("jobq.tracing")

VERSION = "0.1.0"
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[ -~]*)?")
_ZERO_TRACE, _ZERO_SPAN = b"0" * 32, b"0" * 16

TraceContext = Callable[[Scope], "str | None"]


def parse_traceparent(value: bytes) -> str | None:
    """A W3C traceparent as stored: version 00, lower-case hex; None for one that is not valid (ignored,
    as the W3C says, never refused). A later version's first four fields are read as version 00's."""
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None or m[1] == b"ff" or m[2] == _ZERO_TRACE or m[3] == _ZERO_SPAN or (m[1] == b"00" and m[5]):
        return None
    return f"00-{m[2].decode()}-{m[3].decode()}-{m[4].decode()}"


def incoming_traceparent(scope: Scope) -> str | None:
    """The request's own `traceparent` header, when valid: the job context with tracing off."""
    for name, value in scope["headers"]:
        if name == b"traceparent":
            return parse_traceparent(value)
    return None


def requested(environ: Mapping[str, str]) -> str | None:
    """The variable that turns tracing on, or None when it is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return None if exporter == "none" else f"OTEL_TRACES_EXPORTER={exporter}"
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if environ.get(name, "").strip():
            return name
    return None


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    """A span exporter by its OTEL_TRACES_EXPORTER name, from the exporters installed (entry points);
    `otlp` follows OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL, http/protobuf by default as the specification says."""
    from importlib.metadata import entry_points

    if name == "otlp":
        protocol = (
            environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
        ).strip() or "http/protobuf"
        name = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}.get(protocol, "")
        if not name:
            raise ValueError(f"OTLP protocol {protocol!r} is not supported for traces (http/protobuf or grpc)")
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        raise ImportError(f"no span exporter {name!r} is installed (jobq[otel] brings otlp over http/protobuf)")
    exporter: SpanExporter = next(iter(found)).load()()
    return exporter


class Tracing:
    """The request spans' tracer, and the provider behind it (shut down at stop when jobq made it)."""

    def __init__(self, provider: TracerProvider, *, owned: bool) -> None:
        from opentelemetry import context as otel_context
        from opentelemetry import propagate, trace

        self.provider = provider
        self.owned = owned
        self.tracer = provider.get_tracer("jobq", VERSION)
        self._trace = trace
        self._context = otel_context
        self._extract = propagate.extract
        self._server = trace.SpanKind.SERVER
        self._error = trace.StatusCode.ERROR

    def start(self, scope: Scope) -> tuple[Span, object]:
        """The request's span, current until finish(); its parent is the caller's, from its headers."""
        carrier: dict[str, str] = {}
        for name, value in scope["headers"]:
            if name in (b"traceparent", b"tracestate", b"baggage"):
                carrier[name.decode()] = value.decode("latin-1")
        parent: Context | None = self._extract(carrier) if carrier else None
        span = self.tracer.start_span(
            scope["method"],
            context=parent,
            kind=self._server,
            attributes={
                "http.request.method": scope["method"],
                "url.path": scope["path"],
                "url.scheme": scope.get("scheme", "http"),
            },
        )
        token = self._context.attach(self._trace.set_span_in_context(span, parent))
        return span, token

    def finish(self, span: Span, token: object, method: str, route: str, status: int, request_id: str) -> None:
        span.update_name(f"{method} {route}")  # the route is known once the request was routed
        span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        span.set_attribute("jobq.request_id", request_id)
        if status >= 500:
            span.set_status(self._error)
        span.end()
        with suppress(ValueError):  # a context switched under us (it should not): never fail the request
            self._context.detach(token)  # type: ignore[arg-type]

    def job_context(self, scope: Scope) -> str | None:
        """The traceparent an enqueue stores: this request's span (the current one)."""
        ctx = self._trace.get_current_span().get_span_context()
        if not ctx.is_valid:
            return incoming_traceparent(scope)
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def link_jobs(self, jobs: Iterable[Any]) -> None:
        """A claim's span links to the enqueue of each job it hands out (rows with `id`, `traceparent`): the
        claim belongs to the worker's trace, or to none, yet shows in each job's."""
        span = self._trace.get_current_span()
        for job in jobs:
            if job.traceparent:
                _, trace_id, span_id, flags = job.traceparent.split("-")
                linked = self._trace.SpanContext(
                    int(trace_id, 16),
                    int(span_id, 16),
                    is_remote=True,
                    trace_flags=self._trace.TraceFlags(int(flags, 16)),
                )
                span.add_link(linked, {"jobq.job.id": job.id})

    def shutdown(self) -> None:
        """Export what is left; only a provider jobq made is shut down."""
        if self.owned:
            self.provider.shutdown()  # type: ignore[attr-defined]


def from_environment(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """Tracing as the OTEL_* variables configure it, or None (off, or the SDK missing: then a warning)."""
    environ = os.environ if environ is None else environ
    why = requested(environ)
    if why is None:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("tracing is asked for (%s) but the OpenTelemetry SDK is not installed: "
                    "pip install 'jobq[otel]'. Running without tracing.", why)  # fmt: skip
        return None
    installed = trace.get_tracer_provider()
    if isinstance(installed, TracerProvider):  # opentelemetry-instrument, or the embedding application's
        log.info("tracing on (%s): the tracer provider already installed", why)
        return Tracing(installed, owned=False)
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    try:
        exporters = [_exporter(n, environ) for n in names if n and n != "none"]
    except (ImportError, ValueError) as exc:
        log.warning("tracing is asked for (%s) but cannot start: %s. Running without tracing.", why, exc)
        return None
    resource = Resource.create({"service.version": VERSION})
    if str(resource.attributes.get("service.name", "unknown_service")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "jobq"}))
    provider = TracerProvider(resource=resource)  # sampler and limits from OTEL_TRACES_SAMPLER, ...
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing on (%s): exporting to %s", why, ", ".join(type(e).__name__ for e in exporters) or "nothing")
    return Tracing(provider, owned=True)


def provided(provider: Any) -> Tracing:
    """Tracing through a provider the caller made (tests, an embedding application); not shut down here."""
    return Tracing(provider, owned=False)
