"""A call's place in a distributed trace (W3C Trace Context): read from the caller's
``traceparent`` and ``tracestate``, or begun here, and written to the upstreams.

Built once by ingress (``TracePolicy.start``) when the gateway exports traces, carried
on the call's context and record, turned into spans off the request path
(``observability/``). Pure: no I/O, nothing of OpenTelemetry's; the sampling decision is
the SDK's ``ParentBased(TraceIdRatioBased(ratio))`` written out, so that the flag sent
upstream is the one the exported span carries.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from boundedcode_gateway.config import ObservabilitySettings
from boundedcode_gateway.unique_ids import hex_id

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
# version 00's exact form; a later version may append fields after a dash
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
# the W3C limit on a tracestate's members; a longer header is not passed on
MAX_TRACESTATE_CHARS = 512
_LOW_64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class TraceContext:
    """The call's span in its trace: ids as lower-case hex, as the headers write them."""

    trace_id: str
    # the span of the call itself (the gateway's), chosen before anything is sent
    span_id: str
    # the caller's span, when its traceparent named one
    parent_id: str | None
    sampled: bool
    # the caller's tracestate, passed on unchanged
    state: str | None = None
    # a traceparent goes to the upstreams (``observability.propagate``)
    propagate: bool = True
    # the call's messages and answer go on its span (``observability.capture_content``)
    capture_content: bool = False
    # when the call began, in nanoseconds since the epoch (its span's start)
    start_ns: int = field(default_factory=time.time_ns)

    def header(self, span_id: str) -> str:
        """The ``traceparent`` of a request made from span ``span_id`` of this trace."""
        return f"00-{self.trace_id}-{span_id}-{'01' if self.sampled else '00'}"

    def child(self) -> TraceContext:
        """The context of work the call set off after it (its cache repair): a child of
        the call's span, in the same trace."""
        return TraceContext(
            self.trace_id,
            new_span_id(),
            self.span_id,
            self.sampled,
            self.state,
            self.propagate,
            self.capture_content,
        )


def new_span_id() -> str:
    span = hex_id(64)
    return span if span != _ZERO_SPAN else new_span_id()


def read_traceparent(value: str | None) -> tuple[str, str, bool] | None:
    """(trace id, parent span id, sampled) of a valid ``traceparent``; None for one
    that is absent or invalid, which the W3C text says to ignore (a new trace begins)."""
    if value is None:
        return None
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None:
        return None
    version, trace_id, parent_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return trace_id, parent_id, bool(int(flags, 16) & 1)


@dataclass(frozen=True, slots=True)
class TracePolicy:
    """How calls join traces: the sampling ratio of a trace begun here, whether a
    caller's sampled flag decides (parent-based), and what the context carries."""

    ratio: float = 1.0
    parent_based: bool = True
    propagate: bool = True
    capture_content: bool = False

    def sampled(self, trace_id: str) -> bool:
        """The ratio sampler's decision: the trace id's low 64 bits below the bound."""
        if self.ratio >= 1.0:
            return True
        return int(trace_id[16:], 16) & _LOW_64 < round(self.ratio * (1 << 64))

    def start(self, traceparent: str | None, tracestate: str | None) -> TraceContext:
        """The context of one call, a child of the caller's span where it sent one."""
        parent = read_traceparent(traceparent)
        if parent is None:
            trace_id = hex_id(128)
            if trace_id == _ZERO_TRACE:
                trace_id = hex_id(128)
            return TraceContext(
                trace_id,
                new_span_id(),
                None,
                self.sampled(trace_id),
                None,
                self.propagate,
                self.capture_content,
            )
        trace_id, parent_id, parent_sampled = parent
        state = tracestate.strip() if tracestate else None
        if state is not None and (not state or len(state) > MAX_TRACESTATE_CHARS):
            state = None
        return TraceContext(
            trace_id,
            new_span_id(),
            parent_id,
            parent_sampled if self.parent_based else self.sampled(trace_id),
            state,
            self.propagate,
            self.capture_content,
        )


def _env_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"


def exporting(settings: ObservabilitySettings, environ: Mapping[str, str]) -> bool:
    """Whether the gateway exports at all: ``enabled``, else an OTLP endpoint set in the
    file or the environment; never with OTEL_SDK_DISABLED=true."""
    if _env_true(environ.get("OTEL_SDK_DISABLED")):
        return False
    if settings.enabled is not None:
        return settings.enabled
    return bool(
        settings.endpoint
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def _sampler(settings: ObservabilitySettings, environ: Mapping[str, str]) -> tuple[float, bool]:
    """(ratio, parent-based): the file's ``sampling``, else OTEL_TRACES_SAMPLER and its
    argument as the SDK reads them, else always on, following a caller's flag."""
    if settings.sampling is not None:
        return settings.sampling, True
    name = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    parent_based = name.startswith("parentbased_")
    kind = name.removeprefix("parentbased_")
    if kind == "always_off":
        return 0.0, parent_based
    if kind == "traceidratio":
        try:
            ratio = float(environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))
        except ValueError:
            ratio = 1.0
        return min(1.0, max(0.0, ratio)), parent_based
    return 1.0, parent_based


def policy_of(settings: ObservabilitySettings, environ: Mapping[str, str]) -> TracePolicy | None:
    """How calls join traces, or None where no trace is exported (no context is made)."""
    if not exporting(settings, environ):
        return None
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    ratio, parent_based = _sampler(settings, environ)
    return TracePolicy(ratio, parent_based, settings.propagate, settings.capture_content)
