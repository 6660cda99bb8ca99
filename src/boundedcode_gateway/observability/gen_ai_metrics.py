"""Each call's record counted into the GenAI metrics, and the gateway's own Prometheus
families read at each export, made the OpenTelemetry SDK's metric data for its OTLP
exporter.

Counted in plain dictionaries, a few microseconds a call, in the export thread: the
SDK's synchronous instruments cost about 30 µs a measurement (its attribute sets and
locks), ten of them a call, which ``make bench-overhead`` showed was most of what
tracing cost (docs/observability.md). The points handed to the exporter are the SDK's
own data model (``MetricsData``), cumulative, as its readers make them.

Two generations of GenAI metric names are emitted: those of semantic conventions 1.37
to 1.40 (``gen_ai.client.operation.duration``, ``gen_ai.client.token.usage``,
``gen_ai.client.operation.time_to_first_chunk``), which dashboards read today, and those
of semantic-conventions-genai v0.1.0 (``gen_ai.client.inference.*``). With
``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` only the latter.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    Sum,
)
from prometheus_client import CollectorRegistry

from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.observability.attributes import (
    UNKNOWN,
    error_type,
    operation,
    provider,
    server_of,
)

# the conventions' buckets for durations (seconds) and token counts
DURATION_BUCKETS = tuple(0.01 * 2**n for n in range(14))  # 0.01 s to 81.92 s
TOKEN_BUCKETS = tuple(float(4**n) for n in range(14))
LATEST_ONLY = "gen_ai_latest_experimental"
CUMULATIVE = AggregationTemporality.CUMULATIVE
# the attributes of one series, in this order
KEYS = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "error.type",
    "server.address",
    "server.port",
)
Series = tuple[Any, ...]
_UNSET: Any = None


@dataclass(slots=True)
class _Buckets:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0
    low: float = float("inf")
    high: float = float("-inf")

    def add(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value


@dataclass(frozen=True, slots=True, eq=False)
class _Instrument:
    name: str
    unit: str
    description: str
    bounds: tuple[float, ...] | None  # None: a counter


INFERENCE_DURATION = _Instrument(
    "gen_ai.client.inference.duration",
    "s",
    "GenAI client inference operation duration",
    DURATION_BUCKETS,
)
INFERENCE_FIRST_CHUNK = _Instrument(
    "gen_ai.client.inference.time_to_first_chunk",
    "s",
    "Time to receive the first chunk of a streamed answer",
    DURATION_BUCKETS,
)
OPERATION_DURATION = _Instrument(
    "gen_ai.client.operation.duration", "s", "GenAI operation duration", DURATION_BUCKETS
)
OPERATION_FIRST_CHUNK = _Instrument(
    "gen_ai.client.operation.time_to_first_chunk",
    "s",
    "Time to receive the first chunk of a streamed answer",
    DURATION_BUCKETS,
)
TOKEN_USAGE = _Instrument(
    "gen_ai.client.token.usage", "{token}", "Number of input and output tokens used", TOKEN_BUCKETS
)
_USAGE = "gen_ai.client.inference.usage."
USAGE = {
    kind: _Instrument(_USAGE + suffix, "{token}", description, None)
    for kind, suffix, description in (
        ("input", "input_tokens", "Input tokens used"),
        ("output", "output_tokens", "Output tokens used"),
        ("cache_read", "cache_read.input_tokens", "Input tokens served from a cache"),
        ("cache_write", "cache_write.input_tokens", "Input tokens written to a cache"),
        ("reasoning", "reasoning.output_tokens", "Output tokens used for reasoning"),
    )
}
EVALUATED = _Instrument(
    "boundedcode.usage.evaluated_tokens",
    "{token}",
    "Prompt tokens the upstream evaluated rather than read from its cache",
    None,
)


class GenAiMetrics:
    """The GenAI series of one export, added to per record, read as metric data."""

    def __init__(self, latest_only: bool) -> None:
        self._legacy = not latest_only
        self._start_ns = time.time_ns()
        self._histograms: dict[_Instrument, dict[Series, _Buckets]] = {}
        self._counters: dict[_Instrument, dict[Series, float]] = {}

    def _observe(self, instrument: _Instrument, series: Series, value: float) -> None:
        by_series = self._histograms.setdefault(instrument, {})
        buckets = by_series.get(series)
        if buckets is None:
            assert instrument.bounds is not None
            buckets = by_series[series] = _Buckets(instrument.bounds)
        buckets.add(value)

    def _add(self, instrument: _Instrument, series: Series, value: float) -> None:
        by_series = self._counters.setdefault(instrument, {})
        by_series[series] = by_series.get(series, 0) + value

    def record(self, r: CallRecord) -> None:
        last = r.attempt_log[-1] if r.attempt_log else None
        server = server_of(last.get("to") if last is not None else None)
        series: Series = (
            operation(r),
            provider(r),
            # a name no profile has is bounded to one value (callers choose it)
            r.model_profile if r.provider is not None else UNKNOWN,
            r.upstream_model,
            error_type(r),
            server[0] if server is not None else None,
            server[1] if server is not None else None,
        )
        seconds = (r.total_ms or 0.0) / 1000.0
        first = r.ttft_ms / 1000.0 if r.stream and r.ttft_ms is not None else None
        self._observe(INFERENCE_DURATION, series, seconds)
        if first is not None:
            self._observe(INFERENCE_FIRST_CHUNK, series, first)
        if self._legacy:
            self._observe(OPERATION_DURATION, series, seconds)
            if first is not None:
                self._observe(OPERATION_FIRST_CHUNK, series, first)
            if r.prompt_tokens is not None:
                self._observe(TOKEN_USAGE, (*series, "input"), r.prompt_tokens)
            if r.completion_tokens is not None:
                self._observe(TOKEN_USAGE, (*series, "output"), r.completion_tokens)
        for kind, value in (
            ("input", r.prompt_tokens),
            ("output", r.completion_tokens),
            ("cache_read", r.cached_tokens),
            ("cache_write", r.cache_write_tokens),
            ("reasoning", r.reasoning_tokens),
        ):
            if value:
                self._add(USAGE[kind], series, value)
        if r.evaluated_tokens:
            self._add(EVALUATED, series, r.evaluated_tokens)

    def metrics(self, now_ns: int) -> list[Metric]:
        """Every series so far, as the SDK's metric data (cumulative since the start)."""
        out: list[Metric] = []
        for instrument, by_series in self._histograms.items():
            points = [
                HistogramDataPoint(
                    _attributes(series),
                    self._start_ns,
                    now_ns,
                    b.n,
                    b.total,
                    list(b.counts),
                    b.bounds,
                    b.low,
                    b.high,
                )
                for series, b in by_series.items()
            ]
            data = Histogram(points, CUMULATIVE)
            out.append(Metric(instrument.name, instrument.description, instrument.unit, data))
        for instrument, sums in self._counters.items():
            numbers = [
                NumberDataPoint(_attributes(series), self._start_ns, now_ns, value)
                for series, value in sums.items()
            ]
            total = Sum(numbers, CUMULATIVE, True)
            out.append(Metric(instrument.name, instrument.description, instrument.unit, total))
        return out


def _attributes(series: Series) -> dict[str, Any]:
    out = {k: v for k, v in zip(KEYS, series, strict=False) if v is not None}
    if len(series) > len(KEYS):
        out["gen_ai.token.type"] = series[len(KEYS)]
    return out


def prometheus_metrics(registry: CollectorRegistry, start_ns: int, now_ns: int) -> list[Metric]:
    """The families of a Prometheus registry as OpenTelemetry metric data, read now:
    a counter a cumulative sum, a gauge a gauge, a histogram a histogram (its buckets
    made per-bucket counts)."""
    out: list[Metric] = []
    for family in registry.collect():
        if family.type == "counter":
            numbers = [
                NumberDataPoint(dict(s.labels), start_ns, now_ns, s.value)
                for s in family.samples
                if s.name.endswith("_total")
            ]
            total = Sum(numbers, CUMULATIVE, True)
            out.append(Metric(family.name, family.documentation, "", total))
        elif family.type == "gauge":
            numbers = [
                NumberDataPoint(dict(s.labels), start_ns, now_ns, s.value) for s in family.samples
            ]
            out.append(Metric(family.name, family.documentation, "", Gauge(numbers)))
        elif family.type == "histogram":
            points = list(_histogram_points(family.name, family.samples, start_ns, now_ns))
            out.append(Metric(family.name, family.documentation, "", Histogram(points, CUMULATIVE)))
    return out


def _histogram_points(
    name: str, samples: Iterable[Any], start_ns: int, now_ns: int
) -> Iterable[HistogramDataPoint]:
    """One point per label set: Prometheus' cumulative ``le`` buckets made per bucket."""
    by_labels: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in samples:
        kept = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        point = by_labels.setdefault(kept, {"buckets": []})
        if s.name == name + "_bucket":
            point["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name == name + "_count":
            point["count"] = s.value
        elif s.name == name + "_sum":
            point["sum"] = s.value
    for labels, point in by_labels.items():
        cumulative = sorted(point["buckets"])
        bounds = [le for le, _ in cumulative if le != float("inf")]
        counts, before = [], 0.0
        for _, value in cumulative:
            counts.append(int(value - before))
            before = value
        yield HistogramDataPoint(
            dict(labels),
            start_ns,
            now_ns,
            int(point.get("count", 0)),
            point.get("sum", 0.0),
            counts,
            bounds,
            # Prometheus keeps no extremes: left unset (protobuf reads None as unset)
            _UNSET,
            _UNSET,
        )
