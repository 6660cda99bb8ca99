"""What the ``observability:`` block and the standard ``OTEL_*`` environment variables
say together: where spans and metrics go, how, and under which service name. Pure.

The file's value wins where it sets one; what it leaves unset is read from the
environment as the OpenTelemetry SDK documents it. Where neither sets the endpoint or
the headers, the SDK's exporters read ``OTEL_EXPORTER_OTLP_*`` themselves (the signal's
own variables included), so an operator's usual set-up works unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from boundedcode_gateway.config import ObservabilitySettings
from boundedcode_gateway.observability.gen_ai_metrics import LATEST_ONLY
from boundedcode_gateway.trace_context import exporting, policy_of

DEFAULT_SERVICE_NAME = "boundedcode-gateway"
DEFAULT_METRICS_INTERVAL_S = 60.0
HTTP = "http/protobuf"
GRPC = "grpc"


@dataclass(frozen=True, slots=True)
class ExportPlan:
    """One exporting set-up, built again on a reload whose block differs."""

    traces: bool
    metrics: bool
    protocol: str
    # None: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_|METRICS_)ENDPOINT itself
    traces_endpoint: str | None
    metrics_endpoint: str | None
    # None: the exporter reads OTEL_EXPORTER_OTLP_HEADERS itself
    headers: dict[str, str] | None
    # None: OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES), else the gateway's name
    service_name: str | None
    metrics_interval_s: float
    queue_calls: int
    timeout_s: float
    content_max_chars: int
    latest_only: bool


def _protocol(settings: ObservabilitySettings, environ: Mapping[str, str], signal: str) -> str:
    if settings.protocol is not None:
        return settings.protocol
    given = environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", HTTP
    )
    return GRPC if given.strip().lower() == GRPC else HTTP


def _endpoint(base: str | None, protocol: str, path: str) -> str | None:
    """The file's endpoint for one signal: OTLP/HTTP joins the signal's path to it (as
    the SDK does to OTEL_EXPORTER_OTLP_ENDPOINT); gRPC takes it as it is."""
    if base is None:
        return None
    if protocol == GRPC:
        return base
    return base.rstrip("/") + path


def _interval(settings: ObservabilitySettings, environ: Mapping[str, str]) -> float:
    if settings.metrics_interval_s is not None:
        return settings.metrics_interval_s
    try:
        return float(environ["OTEL_METRIC_EXPORT_INTERVAL"]) / 1000.0
    except (KeyError, ValueError):
        return DEFAULT_METRICS_INTERVAL_S


def plan_of(settings: ObservabilitySettings, environ: Mapping[str, str]) -> ExportPlan | None:
    """The export the configuration asks for; None when nothing is exported. Raises
    ``ValueError`` for a header whose environment variable is unset."""
    if not exporting(settings, environ):
        return None
    traces = policy_of(settings, environ) is not None
    metrics = (
        settings.metrics and environ.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() != "none"
    )
    if not traces and not metrics:
        return None
    protocol = _protocol(settings, environ, "TRACES")
    headers: dict[str, str] | None = None
    if settings.headers_env:
        headers = {}
        for header, env in settings.headers_env.items():
            value = environ.get(env)
            if value is None:
                raise ValueError(
                    f"observability.headers_env.{header}: the environment variable {env} is not set"
                )
            headers[header] = value
    opt_in = environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "")
    return ExportPlan(
        traces=traces,
        metrics=metrics,
        protocol=protocol,
        traces_endpoint=_endpoint(settings.endpoint, protocol, "/v1/traces"),
        metrics_endpoint=_endpoint(settings.endpoint, protocol, "/v1/metrics"),
        headers=headers,
        service_name=settings.service_name
        or (None if environ.get("OTEL_SERVICE_NAME") else DEFAULT_SERVICE_NAME),
        metrics_interval_s=_interval(settings, environ),
        queue_calls=settings.queue_calls,
        timeout_s=settings.export_timeout_s,
        content_max_chars=settings.content_max_chars,
        latest_only=LATEST_ONLY in {v.strip() for v in opt_in.split(",")},
    )
