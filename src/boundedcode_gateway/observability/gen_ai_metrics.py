"""Each call's record counted into the GenAI metrics, and the gateway's own Prometheus
counters read into OpenTelemetry, so that an OTLP backend gets what ``/metrics`` serves.

Two generations of GenAI metric names are emitted: those of semantic conventions 1.37
to 1.40 (``gen_ai.client.operation.duration``, ``gen_ai.client.token.usage``,
``gen_ai.client.operation.time_to_first_chunk``), which dashboards read today, and those
of semantic-conventions-genai v0.1.0 (``gen_ai.client.inference.*``). With
``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` only the latter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation
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


class GenAiMetrics:
    """The GenAI instruments of one meter, and what one record adds to them."""

    def __init__(self, meter: Meter, latest_only: bool) -> None:
        self._legacy = not latest_only
        if self._legacy:
            self._duration = meter.create_histogram(
                "gen_ai.client.operation.duration",
                "s",
                "GenAI operation duration",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            )
            self._tokens = meter.create_histogram(
                "gen_ai.client.token.usage",
                "{token}",
                "Number of input and output tokens used",
                explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
            )
            self._ttfc = meter.create_histogram(
                "gen_ai.client.operation.time_to_first_chunk",
                "s",
                "Time to receive the first chunk of a streamed answer",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            )
        self._inference = meter.create_histogram(
            "gen_ai.client.inference.duration",
            "s",
            "GenAI client inference operation duration",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._first_chunk = meter.create_histogram(
            "gen_ai.client.inference.time_to_first_chunk",
            "s",
            "Time to receive the first chunk of a streamed answer",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        usage = "gen_ai.client.inference.usage."
        self._usage = {
            "input": meter.create_counter(usage + "input_tokens", "{token}"),
            "output": meter.create_counter(usage + "output_tokens", "{token}"),
            "cache_read": meter.create_counter(usage + "cache_read.input_tokens", "{token}"),
            "cache_write": meter.create_counter(usage + "cache_write.input_tokens", "{token}"),
            "reasoning": meter.create_counter(usage + "reasoning.output_tokens", "{token}"),
        }
        # the gateway's own: what the conventions have no name for
        self._evaluated = meter.create_counter(
            "boundedcode.usage.evaluated_tokens",
            "{token}",
            "Prompt tokens the upstream evaluated rather than read from its cache",
        )

    def record(self, r: CallRecord) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation(r),
            "gen_ai.provider.name": provider(r),
            # a name no profile has is bounded to one value (callers choose it)
            "gen_ai.request.model": r.model_profile if r.provider is not None else UNKNOWN,
        }
        if r.upstream_model:
            attributes["gen_ai.response.model"] = r.upstream_model
        err = error_type(r)
        if err is not None:
            attributes["error.type"] = err
        last = r.attempt_log[-1] if r.attempt_log else None
        server = server_of(last.get("to") if last is not None else None)
        if server is not None:
            attributes["server.address"], attributes["server.port"] = server
        seconds = (r.total_ms or 0.0) / 1000.0
        self._inference.record(seconds, attributes)
        first = r.ttft_ms / 1000.0 if r.stream and r.ttft_ms is not None else None
        if first is not None:
            self._first_chunk.record(first, attributes)
        if self._legacy:
            self._duration.record(seconds, attributes)
            if first is not None:
                self._ttfc.record(first, attributes)
            if r.prompt_tokens is not None:
                self._tokens.record(r.prompt_tokens, {**attributes, "gen_ai.token.type": "input"})
            if r.completion_tokens is not None:
                tokens = {**attributes, "gen_ai.token.type": "output"}
                self._tokens.record(r.completion_tokens, tokens)
        for kind, value in (
            ("input", r.prompt_tokens),
            ("output", r.completion_tokens),
            ("cache_read", r.cached_tokens),
            ("cache_write", r.cache_write_tokens),
            ("reasoning", r.reasoning_tokens),
        ):
            if value:
                self._usage[kind].add(value, attributes)
        if r.evaluated_tokens:
            self._evaluated.add(r.evaluated_tokens, attributes)


# how long one reading of the Prometheus registry serves the callbacks of one collection
SNAPSHOT_S = 1.0


class PrometheusBridge:
    """The families of a Prometheus registry as observable OpenTelemetry instruments:
    counters as counters, gauges as gauges, a histogram as its count and sum. The registry
    is read once per collection, whatever the number of families."""

    def __init__(self, registry: CollectorRegistry, meter: Meter) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._read_at = 0.0
        self._samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in registry.collect():
            self._instrument(meter, family.name, family.type, family.documentation)

    def _instrument(self, meter: Meter, name: str, kind: str, doc: str) -> None:
        if kind == "counter":
            meter.create_observable_counter(name, [self._reader(name + "_total")], "", doc)
        elif kind == "gauge":
            meter.create_observable_gauge(name, [self._reader(name)], "", doc)
        elif kind == "histogram":
            meter.create_observable_counter(name + "_count", [self._reader(name + "_count")])
            meter.create_observable_counter(name + "_sum", [self._reader(name + "_sum")])

    def _reader(self, sample: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(v, labels) for labels, v in self._snapshot().get(sample, [])]

        return observe

    def _snapshot(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at > SNAPSHOT_S:
                samples: dict[str, list[tuple[dict[str, str], float]]] = {}
                for family in self._registry.collect():
                    for s in family.samples:
                        samples.setdefault(s.name, []).append((dict(s.labels), s.value))
                self._samples, self._read_at = samples, now
            return self._samples
