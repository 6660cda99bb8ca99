"""A call's record made the spans of its trace: the call's own (a server span, a child of
the caller's where it sent a traceparent), a client span per attempt (the first, each
retry, resend, failover and continuation; the upstream was told its id), and the slot's
save and restore where the call waited on them. Built after the call, off the request
path, with the times the record holds; a cache repair's record is its call's child.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.observability.attributes import (
    attempt_attributes,
    call_attributes,
    content_attributes,
    span_name,
)
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE
from boundedcode_gateway.trace_context import TraceContext

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_MS = 1_000_000  # nanoseconds


class SpanMaker:
    """Makes the spans of each record, under one resource and instrumentation scope."""

    def __init__(self, resource: Resource, scope: InstrumentationScope) -> None:
        self._resource = resource
        self._scope = scope

    def _span(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        start: int,
        end: int,
        status: Status,
    ) -> ReadableSpan:
        return ReadableSpan(
            name,
            context,
            parent,
            self._resource,
            attributes,
            kind=kind,
            status=status,
            start_time=start,
            end_time=max(start, end),
            instrumentation_scope=self._scope,
        )

    def spans(
        self, r: CallRecord, content: tuple[Any, str | None] | None, max_chars: int
    ) -> list[ReadableSpan]:
        """The record's spans; none for a call outside a sampled trace."""
        t = r.trace
        if t is None or not t.sampled:
            return []
        trace_id = int(t.trace_id, 16)
        state = TraceState.from_header([t.state]) if t.state else TraceState()
        own = SpanContext(trace_id, int(t.span_id, 16), False, SAMPLED, state)
        parent = None
        if t.parent_id is not None:
            # a caller's span is remote; a cache repair's parent is the call's, made here
            remote = r.purpose != REPAIR_PURPOSE
            parent = SpanContext(trace_id, int(t.parent_id, 16), remote, SAMPLED, state)
        start = t.start_ns
        end = start + int((r.total_ms or 0.0) * _MS)
        attributes = call_attributes(r)
        if content is not None:
            attributes.update(content_attributes(content[0], content[1], max_chars))
        if r.status == "error":
            status = Status(StatusCode.ERROR, r.error_message or r.error_code)
        else:
            status = Status(StatusCode.UNSET)
        out = [
            self._span(span_name(r), own, parent, SpanKind.SERVER, attributes, start, end, status)
        ]
        if len(r.attempt_log) > 1:
            out.extend(self._attempts(r, own, state, start, end))
        if r.slot_save_ms or r.slot_restore_ms is not None:
            out.extend(self._slot(r, t, own, state))
        return out

    def _attempts(
        self, r: CallRecord, own: SpanContext, state: TraceState, start: int, end: int
    ) -> list[ReadableSpan]:
        """A client span per attempt, where there were several."""
        out: list[ReadableSpan] = []
        for index, entry in enumerate(r.attempt_log, 1):
            span = entry.get("span")
            if not isinstance(span, str) or "at_ms" not in entry:
                continue
            at = start + int(entry["at_ms"] * _MS)
            done = start + int(entry["end_ms"] * _MS) if "end_ms" in entry else end
            context = SpanContext(own.trace_id, int(span, 16), False, SAMPLED, state)
            name = f"{entry.get('kind') or 'first'} attempt {r.upstream_model or r.model_profile}"
            failed = entry.get("status") != 200
            status = Status(StatusCode.ERROR, entry.get("code")) if failed else Status()
            attributes = attempt_attributes(r, entry, index)
            out.append(
                self._span(name, context, own, SpanKind.CLIENT, attributes, at, done, status)
            )
        return out

    def _slot(
        self, r: CallRecord, t: TraceContext, own: SpanContext, state: TraceState
    ) -> list[ReadableSpan]:
        """The call's wait for its slot: the slot's earlier conversation saved, then the
        call's own restored, both before its first request was sent."""
        first = r.attempt_log[0] if r.attempt_log else {}
        at = t.start_ns + int(first.get("at_ms", 0.0) * _MS)
        sent = t.start_ns + int(first.get("sent_ms", first.get("at_ms", 0.0)) * _MS)
        where = {"boundedcode.server": r.server or "", "boundedcode.slot": r.slot or 0}
        out: list[ReadableSpan] = []
        if r.slot_save_ms:
            context = SpanContext(own.trace_id, _span_id(t, 1), False, SAMPLED, state)
            save_end = at + int(r.slot_save_ms * _MS)
            out.append(
                self._span(
                    "slot_save", context, own, SpanKind.INTERNAL, where, at, save_end, Status()
                )
            )
        if r.slot_restore_ms is not None:
            context = SpanContext(own.trace_id, _span_id(t, 2), False, SAMPLED, state)
            attributes = {**where, "boundedcode.restored_tokens": r.restored_tokens or 0}
            if r.restore_failure:
                attributes["boundedcode.restore_failure"] = r.restore_failure
            begin = sent - int(r.slot_restore_ms * _MS)
            out.append(
                self._span(
                    "slot_restore",
                    context,
                    own,
                    SpanKind.INTERNAL,
                    attributes,
                    begin,
                    sent,
                    Status(),
                )
            )
        return out


def _span_id(t: TraceContext, n: int) -> int:
    """A span id of the call's own work, derived from its span's (unique within the
    trace, never zero): the slot's spans need no id sent anywhere."""
    return ((int(t.span_id, 16) + n * 0x9E3779B97F4A7C15) % ((1 << 64) - 1)) + 1
