"""Calls exported over OTLP, off the request path: each published record (a view of the
record bus) is queued, and a thread of its own makes its spans and metric points and
hands them to the OpenTelemetry SDK's OTLP exporters.

The queue is bounded: past ``queue_calls`` records waiting, a record's spans are dropped
and counted (``/metrics``), never waited for; a collector that is down or slow costs the
thread its time, never a call its. The SDK's own ``BatchSpanProcessor`` is not used
because its drops are not countable from here, and because building the spans in the
export thread keeps that work off the event loop too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from boundedcode_gateway import __version__
from boundedcode_gateway.config import ObservabilitySettings
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.observability.gen_ai_metrics import GenAiMetrics, prometheus_metrics
from boundedcode_gateway.observability.plan import GRPC, ExportPlan, plan_of
from boundedcode_gateway.observability.spans import SpanMaker

log = logging.getLogger(__name__)

SCOPE = InstrumentationScope("boundedcode_gateway", __version__)
# records made into spans at a time: a small batch, so that the export thread holds the
# interpreter in short stretches (the work is pure Python)
BATCH_RECORDS = 32
# spans sent in one export: a request costs the exporter about 0.75 ms of CPU whatever
# it carries, so spans wait for others rather than each small batch making one; twice
# this many cost no less CPU and hold the interpreter longer (docs/observability.md)
EXPORT_SPANS = 128
# how long a record, or a span made of it, may wait for others before it goes
SCHEDULE_S = 1.0
# what a close waits for the last batches at most
CLOSE_WAIT_S = 5.0


def _exporters(plan: ExportPlan) -> tuple[SpanExporter | None, MetricExporter | None]:
    """The SDK's OTLP exporters of the plan's protocol (imported only when used)."""
    options: list[dict[str, Any]] = [
        {"endpoint": plan.traces_endpoint, "timeout": plan.timeout_s},
        {"endpoint": plan.metrics_endpoint, "timeout": plan.timeout_s},
    ]
    if plan.protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        for given in options:
            given["insecure"] = _insecure(given["endpoint"])
            # gRPC metadata: pairs
            given["headers"] = tuple(plan.headers.items()) if plan.headers is not None else None
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
            OTLPMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
            OTLPSpanExporter,
        )

        for given in options:
            given["headers"] = plan.headers
    spans = OTLPSpanExporter(**options[0]) if plan.traces else None
    metrics = OTLPMetricExporter(**options[1]) if plan.metrics else None
    return spans, metrics


def _insecure(endpoint: str | None) -> bool | None:
    """gRPC without TLS for an http:// endpoint the file gave; else the SDK decides
    (OTEL_EXPORTER_OTLP_INSECURE, the endpoint's scheme)."""
    if endpoint is None:
        return None
    return endpoint.startswith("http://")


class _GatewayResource(Resource):
    """The SDK's resource, its hash kept: the span encoder hashes the resource of every
    span to group them, and the SDK's hash writes its attributes out as JSON each time
    (about 10 µs a span); a resource never changes once made."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other)

    def __hash__(self) -> int:
        return self._hash


def resource_of(plan: ExportPlan) -> Resource:
    """The gateway as the service the telemetry comes from; OTEL_RESOURCE_ATTRIBUTES and
    OTEL_SERVICE_NAME are read by the SDK, the file's ``service_name`` wins over them."""
    attributes: dict[str, Any] = {SERVICE_VERSION: __version__}
    if plan.service_name is not None:
        attributes[SERVICE_NAME] = plan.service_name
    resource = Resource.create(attributes)
    if plan.service_name is not None:
        resource = resource.merge(Resource({SERVICE_NAME: plan.service_name}))
    return _GatewayResource(resource)


class CallExport:
    """One plan's export: its queue, its thread, its exporters."""

    def __init__(
        self,
        plan: ExportPlan,
        registry: CollectorRegistry | None,
        exporters: tuple[SpanExporter | None, MetricExporter | None] | None = None,
    ) -> None:
        """``exporters``: the plan's OTLP ones unless given (another SDK exporter)."""
        self.plan = plan
        self.dropped = 0  # records whose spans the full queue refused
        self.exported = 0  # spans the collector took
        self.failed = 0  # spans an export failed to deliver
        self.metrics_failed = 0  # metric exports that failed
        self._queue: deque[CallRecord] = deque()
        # spans made and not yet sent, and since when the first of them waits
        self._held: list[ReadableSpan] = []
        self._held_since = 0.0
        self._content: OrderedDict[str, tuple[Any, str | None]] = OrderedDict()
        self._content_lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._resource = resource_of(plan)
        self._spans, self._metric_exporter = (
            exporters if exporters is not None else _exporters(plan)
        )
        self._maker = SpanMaker(self._resource, SCOPE)
        self._registry = registry
        self._metrics = GenAiMetrics(plan.latest_only) if self._metric_exporter else None
        self._started_ns = time.time_ns()
        self._metrics_due = time.monotonic() + plan.metrics_interval_s
        # flushes asked for, and done: a flush exports the metrics at once
        self._flushes_asked = 0
        self._flushes_done = 0
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def offer(self, record: CallRecord) -> None:
        """Queue a record (on the event loop: an append, never a wait)."""
        if len(self._queue) >= self.plan.queue_calls:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "observability: the export queue is full; %d calls' spans dropped so far",
                    self.dropped,
                )
            self._forget_content(record.call_id)
            return
        self._queue.append(record)
        if len(self._queue) >= BATCH_RECORDS:
            self._wake.set()

    def keep(self, call_id: str, messages: Any, answer: str | None) -> None:
        """A traced call's content, until its record's spans are made."""
        with self._content_lock:
            self._content[call_id] = (messages, answer)
            while len(self._content) > self.plan.queue_calls:
                self._content.popitem(last=False)

    def _forget_content(self, call_id: str) -> tuple[Any, str | None] | None:
        with self._content_lock:
            return self._content.pop(call_id, None)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._next_due_s())
            self._wake.clear()
            closing, asked = self._closing, self._flushes_asked
            # a close or a flush sends whatever is held, the metrics with it
            now_asked = closing or asked > self._flushes_done
            # what is queued now, not what comes meanwhile: calls that trickle in wait for
            # a batch of their own rather than each making an export
            pending = len(self._queue)
            while pending > 0:
                batch = self._take(min(pending, BATCH_RECORDS))
                pending -= len(batch)
                self._make(batch)
                if len(self._held) >= EXPORT_SPANS:
                    self._send()
                # the interpreter back to the event loop between two batches
                time.sleep(0)
            if self._held and (now_asked or time.monotonic() >= self._held_since + SCHEDULE_S):
                self._send()
            if self._metrics is not None and (now_asked or time.monotonic() >= self._metrics_due):
                self._export_metrics()
                self._metrics_due = time.monotonic() + self.plan.metrics_interval_s
            self._flushes_done = asked
            if closing:
                return

    def _export_metrics(self) -> None:
        exporter, metrics = self._metric_exporter, self._metrics
        if exporter is None or metrics is None:
            return
        now = time.time_ns()
        points = metrics.metrics(now)
        try:
            if self._registry is not None:
                points += prometheus_metrics(self._registry, self._started_ns, now)
            data = MetricsData(
                [ResourceMetrics(self._resource, [ScopeMetrics(SCOPE, points, "")], "")]
            )
            result = exporter.export(data, timeout_millis=self.plan.timeout_s * 1000)
        except Exception:
            log.exception("observability: exporting the metrics failed")
            result = MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self.metrics_failed += 1

    def _take(self, n: int) -> list[CallRecord]:
        batch: list[CallRecord] = []
        while self._queue and len(batch) < n:
            batch.append(self._queue.popleft())
        return batch

    def _next_due_s(self) -> float:
        """How long the thread may sleep: until the metrics, or the held spans, are due."""
        due = self._metrics_due
        if self._held:
            due = min(due, self._held_since + SCHEDULE_S)
        return min(SCHEDULE_S, max(0.0, due - time.monotonic()))

    def _make(self, records: Iterable[CallRecord]) -> None:
        """Count the records' metrics and hold their spans."""
        max_chars = self.plan.content_max_chars
        for record in records:
            try:
                if self._metrics is not None:
                    self._metrics.record(record)
                content = self._forget_content(record.call_id)
                if self._spans is not None:
                    if not self._held:
                        self._held_since = time.monotonic()
                    self._held.extend(self._maker.spans(record, content, max_chars))
            except Exception:
                log.exception("observability: the call %s could not be exported", record.call_id)

    def _send(self) -> None:
        spans, self._held = self._held, []
        if self._spans is None:
            return
        try:
            result = self._spans.export(spans)
        except Exception:
            log.exception("observability: exporting %d spans failed", len(spans))
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            self.failed += len(spans)

    def flush(self, timeout_s: float = CLOSE_WAIT_S) -> bool:
        """Wait until every record queued so far is exported, and the metrics with them
        (tests, shutdown); False on timeout."""
        deadline = time.monotonic() + timeout_s
        self._flushes_asked += 1
        asked = self._flushes_asked
        self._wake.set()
        while self._flushes_done < asked and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._flushes_done >= asked

    def close(self) -> None:
        """Export what is queued (within a bound), then stop; blocking: off the loop."""
        self._closing = True
        self._wake.set()
        self._thread.join(CLOSE_WAIT_S)
        if self._spans is not None:
            self._spans.shutdown()
        if self._metric_exporter is not None:
            self._metric_exporter.shutdown()


class Observability:
    """The gateway's export, swapped whole when a reload changes ``observability:``; the
    record bus and the calls hand to it whatever export is current."""

    def __init__(self, settings: ObservabilitySettings, environ: Mapping[str, str]) -> None:
        # checked now, so that a configuration that cannot export does not start
        self._plan = plan_of(settings, environ)
        self._registry: CollectorRegistry | None = None
        self.export: CallExport | None = None
        self._retired_dropped = 0
        self._retired_exported = 0
        self._retired_failed = 0

    def start(self, registry: CollectorRegistry | None = None) -> None:
        """Begin exporting (the gateway's Prometheus counters read from ``registry``)."""
        self._registry = registry
        if self._plan is not None and self.export is None:
            self.export = CallExport(self._plan, registry)

    def offer(self, record: CallRecord) -> None:
        export = self.export
        if export is not None:
            export.offer(record)

    def keep(self, call_id: str, messages: Any, answer: str | None) -> None:
        export = self.export
        if export is not None:
            export.keep(call_id, messages, answer)

    def use(self, settings: ObservabilitySettings, environ: Mapping[str, str]) -> CallExport | None:
        """Export from now on as ``settings`` say; the export they replace is handed back
        for closing (None when they say what they said). Raises ``ValueError`` for a
        setting that cannot be applied, the running export kept."""
        plan = plan_of(settings, environ)
        old = self.export
        if plan == self._plan:
            return None
        self._plan = plan
        self.export = CallExport(plan, self._registry) if plan is not None else None
        if old is not None:
            self._retired_dropped += old.dropped
            self._retired_exported += old.exported
            self._retired_failed += old.failed
        return old

    def counts(self) -> tuple[int, int, int]:
        """(calls dropped, spans exported, spans failed) since the start."""
        export = self.export
        now = (export.dropped, export.exported, export.failed) if export else (0, 0, 0)
        return (
            self._retired_dropped + now[0],
            self._retired_exported + now[1],
            self._retired_failed + now[2],
        )

    def close(self) -> None:
        if self.export is not None:
            self.export.close()


class ExportCollector(Collector):
    """The export's counts on ``/metrics``."""

    def __init__(self, observability: Observability) -> None:
        self._observability = observability

    def collect(self) -> Iterable[Metric]:
        dropped, exported, failed = self._observability.counts()
        prefix = "boundedcode_gateway_otlp_"
        yield GaugeMetricFamily(
            prefix + "export_enabled",
            "Whether calls are exported over OTLP (observability:)",
            value=1 if self._observability.export is not None else 0,
        )
        yield CounterMetricFamily(
            prefix + "calls_dropped",
            "Calls whose spans were dropped because the export queue was full",
            value=dropped,
        )
        yield CounterMetricFamily(
            prefix + "spans_exported", "Spans the OTLP collector took", value=exported
        )
        yield CounterMetricFamily(
            prefix + "spans_failed", "Spans an OTLP export failed to deliver", value=failed
        )
