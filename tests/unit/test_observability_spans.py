"""A call's record made its spans: golden cases of the names, parentage, kinds, times and
attributes, the content only when kept, nothing of an unsampled trace."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import StatusCode

from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.observability.attributes import call_attributes
from boundedcode_gateway.observability.spans import SpanMaker
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE
from boundedcode_gateway.trace_context import TraceContext

TRACE = TraceContext(
    "0af7651916cd43dd8448eb211c80319c",
    "1111111111111111",
    "b7ad6b7169203331",
    True,
    "vendor=abc",
    start_ns=1_000_000_000,
)
MAKER = SpanMaker(Resource({"service.name": "gw"}), InstrumentationScope("test"))


def _record(**fields: object) -> CallRecord:
    r = CallRecord("call_1", "2026-12-06T10:00:00.000Z", "t1", "agent_turn", "local")
    r.provider, r.upstream_model, r.stream, r.status, r.http_status = (
        "local",
        "smollm2",
        True,
        "ok",
        200,
    )
    r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.evaluated_tokens = 900, 800, 20, 100
    r.reasoning_tokens, r.ttft_ms, r.total_ms, r.attempts = 5, 120.0, 500.0, 2
    r.miss_cause, r.miss_at, r.reusable_tokens = "prefix_changed", {"message": 3, "char": 17}, 850
    r.server, r.slot, r.restored_tokens, r.slot_restore_ms = "local-0", 1, 700, 30.0
    r.trace = TRACE
    r.attempt_log = [
        {
            "status": 502,
            "code": "upstream_stream_broken",
            "kind": "first",
            "to": "127.0.0.1:8081",
            "at_ms": 1.0,
            "sent_ms": 40.0,
            "end_ms": 200.0,
            "span": "2222222222222222",
        },
        {
            "status": 200,
            "code": None,
            "kind": "resend",
            "to": "127.0.0.1:8082",
            "at_ms": 201.0,
            "sent_ms": 202.0,
            "end_ms": 499.0,
            "span": "3333333333333333",
        },
    ]
    for key, value in fields.items():
        setattr(r, key, value)
    return r


def test_a_resent_call_is_a_server_span_with_a_client_span_per_attempt() -> None:
    spans = MAKER.spans(_record(), None, 100)
    call, first, resend, restore = spans
    assert call.name == "chat local" and call.kind is SpanKind.SERVER
    assert call.context is not None and call.parent is not None
    assert f"{call.context.trace_id:032x}" == TRACE.trace_id
    assert f"{call.parent.span_id:016x}" == "b7ad6b7169203331" and call.parent.is_remote
    assert call.start_time == 1_000_000_000 and call.end_time == 1_500_000_000
    assert call.context.trace_state.get("vendor") == "abc"
    assert [s.name for s in (first, resend)] == ["first attempt smollm2", "resend attempt smollm2"]
    for attempt, span_id in ((first, "2222222222222222"), (resend, "3333333333333333")):
        assert attempt.kind is SpanKind.CLIENT and attempt.parent == call.context
        assert attempt.context is not None and f"{attempt.context.span_id:016x}" == span_id
    assert first.status.status_code is StatusCode.ERROR
    assert first.attributes is not None and first.attributes["error.type"] == (
        "upstream_stream_broken"
    )
    assert resend.attributes is not None and resend.attributes["server.port"] == 8082
    assert first.start_time == 1_001_000_000 and first.end_time == 1_200_000_000
    # the restore ended when the first request went out
    assert restore.name == "slot_restore" and restore.parent == call.context
    assert restore.start_time == 1_010_000_000 and restore.end_time == 1_040_000_000
    assert (
        restore.attributes is not None and restore.attributes["boundedcode.restored_tokens"] == 700
    )


def test_the_call_span_holds_the_conventions_and_the_gateways_own() -> None:
    attributes = call_attributes(_record())
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "llama.cpp",
        "gen_ai.request.model": "local",
        "gen_ai.request.stream": True,
        "gen_ai.conversation.id": "t1",
        "gen_ai.response.model": "smollm2",
        "gen_ai.usage.input_tokens": 900,
        "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_read.input_tokens": 800,
        "gen_ai.usage.reasoning.output_tokens": 5,
        "gen_ai.response.time_to_first_chunk": 0.12,
        "server.address": "127.0.0.1",
        "server.port": 8082,
        "boundedcode.call_id": "call_1",
        "boundedcode.task": "t1",
        "boundedcode.purpose": "agent_turn",
        "boundedcode.front": "chat",
        "boundedcode.profile": "local",
        "boundedcode.attempts": 2,
        "boundedcode.evaluated_tokens": 100,
        "boundedcode.reusable_tokens": 850,
        "boundedcode.miss_cause": "prefix_changed",
        "boundedcode.miss_at.message": 3,
        "boundedcode.miss_at.char": 17,
        "boundedcode.server": "local-0",
        "boundedcode.slot": 1,
        "boundedcode.restored_tokens": 700,
        "boundedcode.slot_restore_ms": 30.0,
    }


def test_a_refused_call_is_an_error_span_that_names_the_budget() -> None:
    r = _record(
        status="error",
        http_status=429,
        error_code="budget_exceeded",
        error_message="the task's budget of $1.00 is spent",
        attempt_log=[],
        caller="ci-key",
        slot_restore_ms=None,
    )
    [span] = MAKER.spans(r, None, 100)
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "the task's budget of $1.00 is spent"
    assert span.attributes is not None
    assert span.attributes["error.type"] == "budget_exceeded"
    assert span.attributes["boundedcode.budget_holder"] == "ci-key"


def test_content_is_on_the_span_only_when_kept_and_cut_to_its_bound() -> None:
    [without] = MAKER.spans(_record(attempt_log=[], slot_restore_ms=None), None, 100)
    assert without.attributes is not None
    assert not any(k.startswith("gen_ai.input") for k in without.attributes)
    messages = [{"role": "user", "content": "x" * 500}]
    [kept] = MAKER.spans(_record(attempt_log=[], slot_restore_ms=None), (messages, "ok"), 100)
    assert kept.attributes is not None
    text = kept.attributes["gen_ai.input.messages"]
    assert isinstance(text, str) and text.startswith('[{"role":"user","parts":[{"type":"text"')
    assert len(text) == 100 + len("…[truncated]")
    assert kept.attributes["gen_ai.output.messages"] == (
        '[{"role":"assistant","parts":[{"type":"text","content":"ok"}]}]'
    )


def test_a_call_sent_once_is_one_span_its_upstream_a_child_of_it() -> None:
    r = _record(attempts=1, slot_restore_ms=None)
    r.attempt_log = r.attempt_log[1:]
    [span] = MAKER.spans(r, None, 100)
    assert span.attributes is not None
    assert "boundedcode.attempts" not in span.attributes
    assert "http.response.status_code" not in span.attributes  # a 200 says nothing


def test_an_unsampled_or_untraced_call_has_no_span() -> None:
    unsampled = TraceContext("0" * 31 + "1", "1" * 16, None, False)
    assert MAKER.spans(_record(trace=unsampled), None, 100) == []
    assert MAKER.spans(_record(trace=None), None, 100) == []


def test_a_cache_repair_is_a_child_of_its_call_in_the_same_trace() -> None:
    child = TRACE.child()
    r = _record(purpose=REPAIR_PURPOSE, trace=child, attempt_log=[], slot_restore_ms=None)
    [span] = MAKER.spans(r, None, 100)
    assert span.name == "cache_repair local"
    assert span.parent is not None and f"{span.parent.span_id:016x}" == TRACE.span_id
    assert not span.parent.is_remote
    assert span.attributes is not None
    assert span.attributes["gen_ai.operation.name"] == "text_completion"
