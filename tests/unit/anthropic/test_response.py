"""Golden cases: Anthropic answers, stream events and errors in, OpenAI out.

Fixtures follow the Messages API reference and its streaming page (event order,
``signature_delta`` before a thinking block's stop, cumulative usage in
``message_delta``), and the errors page (error body, 529 ``overloaded_error``).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boundedcode_gateway.errors import ContextLengthExceeded, GatewayError, MalformedResponse
from boundedcode_gateway.policy.retry import RetryBudget, decide
from boundedcode_gateway.providers.anthropic.adapter import ANTHROPIC_RETRY
from boundedcode_gateway.providers.anthropic.response import (
    THINKING_KIND,
    error_from_anthropic,
    from_anthropic_response,
)
from boundedcode_gateway.providers.anthropic.stream import AnthropicStreamTranslator
from boundedcode_gateway.providers.base import RequestOptions
from boundedcode_gateway.upstream.metrics import CallMetrics
from tests.fakes.anthropic_api import message_events

THINKING = {
    "type": "thinking",
    "thinking": "The user wants files.",
    "signature": "EqQBCgIYAhIM+/==",
}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}
MESSAGE: dict[str, Any] = {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [
        THINKING,
        REDACTED,
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_01A", "name": "ls", "input": {"path": "src"}},
        {"type": "tool_use", "id": "toolu_01B", "name": "pwd", "input": {}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 12,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 2000,
        "output_tokens": 80,
    },
}
STREAM = RequestOptions(
    stream=True, include_usage=True, return_progress=False, capture_reasoning=True
)
WHOLE = RequestOptions(
    stream=False, include_usage=False, return_progress=False, capture_reasoning=True
)


def test_whole_answer() -> None:
    metrics = CallMetrics()
    out = orjson.loads(from_anthropic_response(orjson.dumps(MESSAGE), metrics, False))
    assert out["id"] == "chatcmpl-msg_01XFDUDYJgAACzvnptvVoYEL"
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": "The user wants files.",
        "tool_calls": [
            {
                "id": "toolu_01A",
                "type": "function",
                "function": {"name": "ls", "arguments": '{"path":"src"}'},
            },
            {"id": "toolu_01B", "type": "function", "function": {"name": "pwd", "arguments": "{}"}},
        ],
    }
    assert out["usage"] == {
        "prompt_tokens": 2112,
        "completion_tokens": 80,
        "total_tokens": 2192,
        "prompt_tokens_details": {"cached_tokens": 2000},
    }
    assert (metrics.prompt_tokens, metrics.cached_tokens, metrics.evaluated_tokens) == (
        2112,
        2000,
        112,
    )
    captured = metrics.captured
    assert captured is not None and captured.kind == THINKING_KIND
    assert captured.tool_call_ids == ["toolu_01A", "toolu_01B"]
    assert captured.data == [[0, THINKING], [1, REDACTED]]


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "stop"),
        ("model_context_window_exceeded", "length"),
    ],
)
def test_stop_reasons(stop: str, finish: str) -> None:
    msg = {**MESSAGE, "content": [{"type": "text", "text": "x"}], "stop_reason": stop}
    out = orjson.loads(from_anthropic_response(orjson.dumps(msg), CallMetrics(), False))
    assert out["choices"][0]["finish_reason"] == finish


def test_malformed_answers_are_named() -> None:
    with pytest.raises(MalformedResponse, match="not JSON"):
        from_anthropic_response(b"<html>", CallMetrics(), False)
    with pytest.raises(MalformedResponse, match="no content"):
        from_anthropic_response(b'{"type":"message"}', CallMetrics(), False)


def _feed(
    events: list[tuple[str, dict[str, Any]]], options: RequestOptions = STREAM
) -> tuple[AnthropicStreamTranslator, list[dict[str, Any]]]:
    t = AnthropicStreamTranslator(options)
    chunks: list[dict[str, Any]] = []
    for name, data in events:
        chunks += [orjson.loads(p) for p in t.feed(name, orjson.dumps(data))]
    return t, chunks


def _assemble(chunks: list[dict[str, Any]]) -> tuple[dict[str, Any], str | None]:
    """What an OpenAI client builds from the chunks (the SDK's accumulation by index)."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if "content" in delta:
                message["content"] = (message["content"] or "") + delta["content"]
            if "reasoning_content" in delta:
                message["reasoning_content"] = (
                    message.get("reasoning_content", "") + delta["reasoning_content"]
                )
            for call in delta.get("tool_calls", ()):
                slot = calls.setdefault(
                    call["index"],
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function", {})
                slot["function"]["name"] += fn.get("name", "") or ""
                slot["function"]["arguments"] += fn.get("arguments", "") or ""
            finish = choice["finish_reason"] or finish
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish


def test_stream_events_in_order() -> None:
    t, chunks = _feed(message_events(MESSAGE))
    assert t.finished and t.content_started
    ids = {c["id"] for c in chunks}
    assert ids == {"chatcmpl-msg_01XFDUDYJgAACzvnptvVoYEL"}  # one stable id
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    message, finish = _assemble(chunks)
    assert finish == "tool_calls"
    assert message["content"] == "Let me look."
    assert [orjson.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [
        {"path": "src"},
        {},
    ]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 2112
    assert t.metrics.captured is not None
    assert t.metrics.captured.data == [[0, THINKING], [1, REDACTED]]


def test_a_stream_without_message_stop_is_not_finished() -> None:
    events = message_events(MESSAGE)[:-1]
    t, _ = _feed(events)
    assert not t.finished


def test_ping_and_unknown_events_are_ignored() -> None:
    t = AnthropicStreamTranslator(STREAM)
    assert t.feed("ping", b'{"type":"ping"}') == ()
    assert t.feed("future_event", b'{"type":"future_event"}') == ()


def test_error_event_is_an_error_with_its_documented_status() -> None:
    t = AnthropicStreamTranslator(STREAM)
    with pytest.raises(GatewayError) as info:
        t.feed(
            "error", b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
        )
    assert info.value.http_status == 529 and info.value.message == "Overloaded"


def test_empty_signed_thinking_is_kept_whole() -> None:
    block = {"type": "thinking", "thinking": "", "signature": "c2lnbmF0dXJl"}
    msg = {**MESSAGE, "content": [block, {"type": "text", "text": "Hi"}], "stop_reason": "end_turn"}
    t, chunks = _feed(message_events(msg))
    assert t.metrics.captured is not None and t.metrics.captured.data == [[0, block]]
    assert all("reasoning_content" not in c["choices"][0]["delta"] for c in chunks if c["choices"])


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=40),
    text=st.text(min_size=0, max_size=60),
    thought=st.text(min_size=0, max_size=60),
    args=st.dictionaries(st.text(max_size=5), st.text(max_size=10), max_size=3),
)
def test_stream_and_whole_answer_give_the_same_message(
    sizes: list[int], text: str, thought: str, args: dict[str, str]
) -> None:
    content: list[dict[str, Any]] = [{"type": "thinking", "thinking": thought, "signature": "sig"}]
    if text:
        content.append({"type": "text", "text": text})
    content.append({"type": "tool_use", "id": "toolu_x", "name": "edit", "input": args})
    msg = {**MESSAGE, "content": content}
    whole_metrics = CallMetrics()
    whole = orjson.loads(from_anthropic_response(orjson.dumps(msg), whole_metrics, False))
    t, chunks = _feed(message_events(msg, iter(sizes * 50)))
    streamed, finish = _assemble(chunks)
    expected = whole["choices"][0]["message"]
    assert finish == whole["choices"][0]["finish_reason"]
    assert streamed["content"] == expected["content"]
    assert streamed.get("reasoning_content", "") == expected.get("reasoning_content", "")
    assert [orjson.loads(c["function"]["arguments"]) for c in streamed["tool_calls"]] == [
        orjson.loads(c["function"]["arguments"]) for c in expected["tool_calls"]
    ]
    assert t.metrics.captured is not None and whole_metrics.captured is not None
    assert t.metrics.captured.data == whole_metrics.captured.data
    assert t.metrics.captured.text == whole_metrics.captured.text


def _error(status: int, kind: str, message: str, **extra: Any) -> GatewayError:
    body = {
        "type": "error",
        "error": {"type": kind, "message": message, **extra},
        "request_id": "req_1",
    }
    return error_from_anthropic(status, orjson.dumps(body), ("sk-ant-secret",))


def test_errors() -> None:
    overflow = _error(
        400, "invalid_request_error", "prompt is too long: 208656 tokens > 200000 maximum"
    )
    assert isinstance(overflow, ContextLengthExceeded)
    assert overflow.to_body()["error"]["code"] == "context_length_exceeded"
    auth = _error(401, "authentication_error", "invalid x-api-key sk-ant-secret")
    assert auth.http_status == 401 and auth.type == "authentication_error"
    assert "sk-ant-secret" not in auth.message
    bad = _error(400, "invalid_request_error", "messages: roles must alternate")
    assert (bad.http_status, bad.type, bad.code) == (400, "invalid_request_error", None)
    not_json = error_from_anthropic(502, b"<html>bad gateway</html>", ())
    assert not_json.http_status == 502 and "bad gateway" in not_json.message


def _retried(error: GatewayError) -> bool:
    return decide(
        status=error.http_status,
        code=error.code,
        retryable=error.retryable,
        headers={},
        attempt=1,
        elapsed_s=0.0,
        rules=ANTHROPIC_RETRY,
        budget=RetryBudget(),
    ).retry


def test_overload_and_rate_limits_are_retried_but_a_spent_budget_is_not() -> None:
    assert _retried(_error(529, "overloaded_error", "Overloaded"))
    assert _retried(
        _error(429, "rate_limit_error", "Number of request tokens has exceeded your rate limit")
    )
    assert _retried(_error(500, "api_error", "Internal server error"))
    spent = _error(
        429,
        "rate_limit_error",
        "spend limit reached",
        details={"error_code": "enforced_spend_limit_reached"},
    )
    assert not _retried(spent)
    assert not _retried(_error(400, "invalid_request_error", "bad"))
