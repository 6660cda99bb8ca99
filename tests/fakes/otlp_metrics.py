"""An OTLP/HTTP metrics endpoint (the benchmark's sink) that decodes what it is sent with
the official protocol messages (``opentelemetry-proto``), for the metrics export's test:
Phoenix, the real receiver the trace tests use, takes no metrics (405 on /v1/metrics)."""

from __future__ import annotations

from typing import Any

from bench.overhead.otlp_sink import OtlpSink
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


class OtlpMetrics:
    """Serves on 127.0.0.1 until ``close``; ``points(name)`` reads what came."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self._sink = OtlpSink(self._received)
        self.url = self._sink.url

    def _received(self, path: str, body: bytes) -> None:
        if path == "/v1/metrics":
            request = ExportMetricsServiceRequest()
            request.ParseFromString(body)
            self.requests.append(request)

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """Each data point of metric ``name``: its attributes, and its value (a sum's or
        gauge's number, a histogram's (count, sum))."""
        out: list[tuple[dict[str, Any], Any]] = []
        for request in list(self.requests):
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if metric.name != name:
                            continue
                        data = getattr(metric, metric.WhichOneof("data") or "sum")
                        for p in data.data_points:
                            attributes = {a.key: _value(a.value) for a in p.attributes}
                            if metric.WhichOneof("data") == "histogram":
                                out.append((attributes, (p.count, p.sum)))
                            else:
                                kind = p.WhichOneof("value")
                                out.append((attributes, getattr(p, kind) if kind else None))
        return out

    def close(self) -> None:
        self._sink.close()
