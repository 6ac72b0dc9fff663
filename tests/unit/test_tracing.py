"""Tracing's configuration and trace contexts (app/observability/tracing.py), without a server."""

from __future__ import annotations

import logging
import sys

import pytest

from app.observability.tracing import Tracing, from_environment, parse_traceparent, requested

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("header", "stored"),
    [
        (VALID, VALID),
        (f" {VALID} ", VALID),
        ("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", VALID),  # a later version: 4 fields read
        (VALID + "-extra", None),  # version 00 has exactly four
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", None),
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", None),
        ("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", None),  # upper case is not W3C
        ("00-0af7651916cd43dd-b7ad6b7169203331-01", None),
        ("", None),
    ],
)
def test_a_traceparent_is_stored_only_when_valid(header: str, stored: str | None) -> None:
    assert parse_traceparent(header.encode()) == stored


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "jobq"}, False),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_tracing_is_off_unless_the_standard_variables_ask(env: dict[str, str], on: bool) -> None:
    assert (requested(env) is not None) is on


def test_console_and_otlp_exporters_start_and_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "jobq-eu")
    console = from_environment()
    assert isinstance(console, Tracing) and console.owned
    assert console.provider.resource.attributes["service.name"] == "jobq-eu"  # type: ignore[attr-defined]
    console.shutdown()
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    otlp = from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"})  # nothing is sent before a span
    assert otlp is not None
    processors = otlp.provider._active_span_processor._span_processors  # type: ignore[attr-defined]
    assert [type(p._batch_processor._exporter).__name__ for p in processors] == ["OTLPSpanExporter"]
    assert otlp.provider.resource.attributes["service.name"] == "jobq"  # type: ignore[attr-defined]
    otlp.shutdown()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "no span exporter 'zipkin' is installed"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "'http/json' is not supported"),
    ],
)
def test_an_exporter_that_cannot_start_leaves_tracing_off_with_a_warning(
    env: dict[str, str], says: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert from_environment(env) is None
    assert says in caplog.text and "Running without tracing" in caplog.text


def test_without_the_sdk_the_service_runs_untraced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in [m for m in sys.modules if m.startswith("opentelemetry.sdk")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)  # what `import` finds when it is not installed
    caplog.set_level(logging.WARNING)
    assert from_environment({"OTEL_TRACES_EXPORTER": "otlp"}) is None
    assert "pip install 'jobq[otel]'" in caplog.text
