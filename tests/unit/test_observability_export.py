"""The export off the request path: a record is queued, never waited for; a full queue
drops and counts; a collector that hangs holds up its thread alone. The plan reads the
file, then the standard OTEL_* variables."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from boundedcode_gateway.config import ObservabilitySettings
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.observability.export import EXPORT_SPANS, SCHEDULE_S, CallExport
from boundedcode_gateway.observability.plan import plan_of
from boundedcode_gateway.trace_context import TracePolicy

PLAN = plan_of(ObservabilitySettings(enabled=True, metrics=False, queue_calls=10), {})


class Held(SpanExporter):
    """An exporter that hangs until let go, as a collector that stopped reading would."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(30)
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def _record(n: int) -> CallRecord:
    r = CallRecord(f"call_{n}", "2026-12-06T10:00:00.000Z", "t", "agent_turn", "m")
    r.trace = TracePolicy().start(None, None)
    r.status, r.http_status, r.total_ms = "ok", 200, 1.0
    return r


def test_a_hung_collector_drops_past_the_queue_and_counts_never_waiting() -> None:
    assert PLAN is not None
    held = Held()
    export = CallExport(PLAN, None, (held, None))
    try:
        export.offer(_record(0))
        export.flush(0.0)  # wakes the thread, which takes the record and hangs
        assert held.entered.wait(10)
        for n in range(1, 14):  # ten fit in the queue, three do not
            export.offer(_record(n))
        assert export.dropped == 3
        held.release.set()
        assert export.flush(10)
        assert export.exported == 11 and len(held.spans) == 11
        assert {s.attributes["boundedcode.call_id"] for s in held.spans if s.attributes} == {
            f"call_{n}" for n in range(11)
        }
    finally:
        held.release.set()
        export.close()


def test_content_kept_for_a_dropped_call_is_forgotten() -> None:
    assert PLAN is not None
    held = Held()
    export = CallExport(replace(PLAN, queue_calls=1), None, (held, None))
    try:
        export.offer(_record(0))
        export.flush(0.0)
        assert held.entered.wait(10)
        export.offer(_record(1))
        export.keep("call_2", [{"role": "user", "content": "secret"}], "answer")
        export.offer(_record(2))  # dropped: its content goes with it
        assert export.dropped == 1 and export._forget_content("call_2") is None
    finally:
        held.release.set()
        export.close()


class Sizes(SpanExporter):
    """An exporter that notes how many spans each export carried."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.sent = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.sizes.append(len(spans))
        self.sent.set()
        return SpanExportResult.SUCCESS


def test_spans_go_in_few_exports_whatever_the_calls_batches() -> None:
    # an export costs the exporter a request, whatever it carries: calls queued at once
    # make as few as EXPORT_SPANS allows, not one per batch of records
    assert PLAN is not None
    calls = EXPORT_SPANS + EXPORT_SPANS // 2
    sizes = Sizes()
    export = CallExport(replace(PLAN, queue_calls=1000), None, (sizes, None))
    try:
        for n in range(calls):
            export.offer(_record(n))
        assert export.flush(10)
        # the first once EXPORT_SPANS are made (the batch that reaches it rounds it up)
        assert len(sizes.sizes) == 2 and sizes.sizes[0] >= EXPORT_SPANS, sizes.sizes
        assert sum(sizes.sizes) == calls
    finally:
        export.close()


def test_a_lone_call_is_sent_within_its_schedule_unasked() -> None:
    assert PLAN is not None
    sizes = Sizes()
    export = CallExport(PLAN, None, (sizes, None))
    try:
        export.offer(_record(0))
        assert sizes.sent.wait(SCHEDULE_S * 3)
        assert sizes.sizes == [1]
    finally:
        export.close()


def test_the_file_wins_and_the_environment_fills_in() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_SERVICE_NAME": "from-env",
        "OTEL_METRIC_EXPORT_INTERVAL": "5000",
        "LANGFUSE_AUTH": "Basic abc",
    }
    plan = plan_of(ObservabilitySettings(), env)
    assert plan is not None and plan.protocol == "grpc"
    # the SDK's exporters read the environment's endpoint and headers themselves
    assert plan.traces_endpoint is None and plan.headers is None
    assert plan.service_name is None and plan.metrics_interval_s == 5.0
    file = ObservabilitySettings(
        endpoint="http://127.0.0.1:6006/",
        protocol="http/protobuf",
        headers_env={"Authorization": "LANGFUSE_AUTH"},
        service_name="gw",
    )
    plan = plan_of(file, env)
    assert plan is not None and plan.protocol == "http/protobuf"
    assert plan.traces_endpoint == "http://127.0.0.1:6006/v1/traces"
    assert plan.metrics_endpoint == "http://127.0.0.1:6006/v1/metrics"
    assert plan.headers == {"Authorization": "Basic abc"} and plan.service_name == "gw"
    assert plan_of(ObservabilitySettings(), {}) is None
    latest = {**env, "OTEL_SEMCONV_STABILITY_OPT_IN": "http, gen_ai_latest_experimental"}
    latest_plan = plan_of(ObservabilitySettings(), latest)
    assert latest_plan is not None and latest_plan.latest_only


def test_a_header_from_an_unset_variable_is_refused_by_name() -> None:
    settings = ObservabilitySettings(enabled=True, headers_env={"x-api-key": "MISSING_VAR"})
    with pytest.raises(ValueError, match="MISSING_VAR is not set"):
        plan_of(settings, {})
