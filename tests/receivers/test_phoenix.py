"""Spans that the official OpenTelemetry SDK exports reach a real receiver, Arize Phoenix,
and read back as they were sent: names, parentage under a remote parent, the trace id,
status, events and the types of the attributes; over OTLP/HTTP and over gRPC alike. And
Phoenix's own page shows such a trace (a picture of it: test-artifacts/receivers/)."""

from __future__ import annotations

import secrets
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tests.receivers.phoenix import DEFAULT_PROJECT, PROJECT_ATTRIBUTE, Phoenix
from tests.receivers.screenshot import VIEWPORT, trace_screenshot

# the first test waits for Phoenix's start: its migrations and imports take most of a
# minute on a busy 2-core machine
pytestmark = pytest.mark.timeout(300)

# one of each attribute type OTLP has, as the gateway's spans carry them
ATTRIBUTES: dict[str, Any] = {
    "boundedcode.task": "fix-the-failing-test",
    "boundedcode.attempt": 3,
    "boundedcode.cache_hit": True,
    "boundedcode.streamed": False,
    "boundedcode.cost_usd": 0.0125,
    "boundedcode.ratio": 2.0,
    "boundedcode.tools": ["read_file", "write_file"],
    "boundedcode.slots": [0, 7],
    "boundedcode.weights": [0.5, 1.0],
    "boundedcode.flags": [True, False],
    "boundedcode.no_tools": [],
    "gen_ai.request.model": "smollm2-135m",
    "gen_ai.usage.input_tokens": 1200,
    "gen_ai.usage.output_tokens": 34,
}
# what Phoenix derives from the gen_ai.* attributes above (tests/receivers/phoenix.py)
DERIVED = {
    "llm.model_name": "smollm2-135m",
    "llm.token_count.prompt": 1200,
    "llm.token_count.completion": 34,
    "llm.token_count.total": 1234,
}
PARENT = "gateway.request"
CHILD = "upstream.call"
CHILD_ERROR = "upstream closed the stream"
# where a person finds the picture of the trace after a run
SCREENSHOT = Path(__file__).resolve().parents[2] / "test-artifacts" / "receivers" / "trace.png"


@pytest.fixture(scope="module")
def phoenix() -> Iterator[Phoenix]:
    with Phoenix() as receiver:
        yield receiver


def test_spans_over_otlp_http_read_back_as_sent(
    phoenix: Phoenix, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the way a deployment points an exporter at a collector: the base URL, to which the
    # exporter adds /v1/traces
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix.otlp_http_endpoint)
    trace_id, remote_span_id = export_trace(HttpSpanExporter(), project="http-export")

    spans = phoenix.spans("http-export", trace_id=trace_id, wait_for=2)

    assert_trace_as_sent(spans, trace_id, remote_span_id)


def test_spans_over_otlp_grpc_read_back_as_sent(phoenix: Phoenix) -> None:
    exporter = GrpcSpanExporter(endpoint=phoenix.otlp_grpc_endpoint, insecure=True)
    trace_id, remote_span_id = export_trace(exporter, project="grpc-export")

    spans = phoenix.spans("grpc-export", trace_id=trace_id, wait_for=2)

    assert_trace_as_sent(spans, trace_id, remote_span_id)


def test_a_span_without_a_project_goes_to_the_default_one(phoenix: Phoenix) -> None:
    exporter = HttpSpanExporter(endpoint=phoenix.otlp_http_endpoint + "/v1/traces")
    trace_id, _ = export_trace(exporter, project=None)

    spans = phoenix.spans(DEFAULT_PROJECT, trace_id=trace_id, wait_for=2)

    assert [span["name"] for span in spans] == [PARENT, CHILD]
    assert DEFAULT_PROJECT in phoenix.projects()
    assert phoenix.spans("http-export", trace_id=trace_id) == []


def test_waiting_for_spans_that_never_come_fails_saying_so(phoenix: Phoenix) -> None:
    with pytest.raises(AssertionError, match=r"0 span\(s\) \[\] in project 'nowhere'"):
        phoenix.spans("nowhere", wait_for=1, timeout_s=0.5)


@pytest.mark.browser
def test_the_ui_shows_the_trace(phoenix: Phoenix) -> None:
    exporter = HttpSpanExporter(endpoint=phoenix.otlp_http_endpoint + "/v1/traces")
    trace_id, _ = export_trace(exporter, project="ui")
    phoenix.spans("ui", trace_id=trace_id, wait_for=2)

    SCREENSHOT.unlink(missing_ok=True)
    # it fails, saving nothing, unless the page shows the span tree and the attributes
    trace_screenshot(phoenix.ui_url, "ui", trace_id, SCREENSHOT)

    header = SCREENSHOT.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (VIEWPORT["width"], VIEWPORT["height"])


def export_trace(exporter: SpanExporter, project: str | None) -> tuple[str, str]:
    """A parent span, child of a remote one named by a W3C traceparent, and its child,
    exported through ``exporter`` from a provider of their own; the trace's id and the
    remote parent's."""
    trace_id, remote_span_id = secrets.token_hex(16), secrets.token_hex(8)
    resource = {"service.name": "boundedcode-gateway-tests"}
    if project is not None:
        resource[PROJECT_ATTRIBUTE] = project
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.receivers")
    remote = TraceContextTextMapPropagator().extract(
        {"traceparent": f"00-{trace_id}-{remote_span_id}-01"}
    )
    try:
        with tracer.start_as_current_span(
            PARENT, context=remote, kind=SpanKind.SERVER, attributes=ATTRIBUTES
        ) as parent:
            parent.add_event("first_token", {"boundedcode.after_ms": 42})
            with tracer.start_as_current_span(CHILD, kind=SpanKind.CLIENT) as child:
                child.set_status(Status(StatusCode.ERROR, CHILD_ERROR))
            parent.set_status(Status(StatusCode.OK))
        assert provider.force_flush(10_000), "the spans were not exported within 10 s"
    finally:
        provider.shutdown()
    return trace_id, remote_span_id


def assert_trace_as_sent(spans: list[dict[str, Any]], trace_id: str, remote_span_id: str) -> None:
    parent, child = spans  # earliest start first
    assert (parent["name"], child["name"]) == (PARENT, CHILD)
    assert {span["trace_id"] for span in spans} == {trace_id}
    assert parent["parent_span_id"] == remote_span_id
    assert child["parent_span_id"] == parent["span_id"]
    assert parent["start_time"] <= child["start_time"] <= child["end_time"] <= parent["end_time"]

    assert (parent["status_code"], parent["status_message"]) == ("OK", "")
    assert (child["status_code"], child["status_message"]) == ("ERROR", CHILD_ERROR)
    # Phoenix's kind is OpenInference's, derived from gen_ai.*; the OTel kind is not kept
    assert (parent["span_kind"], child["span_kind"]) == ("LLM", "UNKNOWN")

    assert typed(parent["attributes"]) == typed({**ATTRIBUTES, **DERIVED})
    assert child["attributes"] == {}
    [event] = parent["events"]
    assert (event["name"], typed(event["attributes"])) == (
        "first_token",
        typed({"boundedcode.after_ms": 42}),
    )


def typed(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Each value with its type, so that 2.0 and 2, or True and 1, differ."""
    return {key: _typed(value) for key, value in attributes.items()}


def _typed(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return ("array", [_typed(item) for item in value])
    return (type(value).__name__, value)
