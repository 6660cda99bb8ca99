"""Golden tests: Gemini's answers and errors as the caller's OpenAI answers and errors."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from boundedcode_gateway.errors import ContextLengthExceeded, MalformedResponse, UpstreamFailure
from boundedcode_gateway.providers.base import RequestOptions
from boundedcode_gateway.providers.gemini.response import (
    error_from_gemini,
    finish_reason,
    from_gemini_response,
)
from boundedcode_gateway.providers.gemini.signatures import SIGNATURE_KIND
from boundedcode_gateway.upstream.metrics import CallMetrics

CAPTURE = RequestOptions(
    stream=False,
    include_usage=False,
    return_progress=False,
    capture_reasoning=True,
    capture_content=True,
)
USAGE = {
    "promptTokenCount": 120,
    "cachedContentTokenCount": 100,
    "candidatesTokenCount": 30,
    "thoughtsTokenCount": 12,
    "toolUsePromptTokenCount": 5,
    "totalTokenCount": 167,
}


def answer(parts: list[Any], finish: str = "STOP", **extra: Any) -> bytes:
    candidate = {"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}
    return orjson.dumps(
        {
            "candidates": [candidate],
            "usageMetadata": USAGE,
            "modelVersion": "gemini-3-pro-preview",
            "responseId": "abc123",
            **extra,
        }
    )


def translate(raw: bytes, options: RequestOptions = CAPTURE) -> tuple[dict[str, Any], CallMetrics]:
    metrics = CallMetrics()
    out = orjson.loads(from_gemini_response(raw, metrics, options, "gemini-3"))
    return out, metrics


def test_golden_text_answer() -> None:
    raw = answer(
        [
            {"text": "Thinking about it.", "thought": True},
            {"text": "Hello"},
            {"text": ", world.", "thoughtSignature": "U0lH"},
        ]
    )
    out, metrics = translate(raw)
    assert out["id"] == "chatcmpl-abc123"
    assert out["object"] == "chat.completion"
    assert out["model"] == "gemini-3-pro-preview"
    assert out["choices"] == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Hello, world.",
                "reasoning_content": "Thinking about it.",
            },
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert out["usage"] == {
        "prompt_tokens": 125,
        "completion_tokens": 42,
        "total_tokens": 167,
        "prompt_tokens_details": {"cached_tokens": 100},
        "completion_tokens_details": {"reasoning_tokens": 12},
    }
    assert metrics.evaluated_tokens == 25
    assert metrics.captured is not None
    assert metrics.captured.kind == SIGNATURE_KIND
    assert (metrics.captured.tool_call_ids, metrics.captured.text) == ([], "Hello, world.")
    assert metrics.captured.data == {"slots": [[-1, "U0lH"]], "ids": False}
    assert metrics.answer_text == "Hello, world."


def test_golden_parallel_calls() -> None:
    raw = answer(
        [
            {
                "functionCall": {"name": "read", "args": {"path": "a"}},
                "thoughtSignature": "Rklyc3Q=",
            },
            {"functionCall": {"name": "list", "args": {}}},
        ]
    )
    out, metrics = translate(raw)
    message = out["choices"][0]["message"]
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    assert message["content"] is None
    calls = message["tool_calls"]
    assert [(c["type"], c["function"]) for c in calls] == [
        ("function", {"name": "read", "arguments": '{"path":"a"}'}),
        ("function", {"name": "list", "arguments": "{}"}),
    ]
    assert all(c["id"].startswith("call_") and len(c["id"]) == 29 for c in calls)
    assert calls[0]["id"] != calls[1]["id"]
    assert metrics.captured is not None
    assert metrics.captured.tool_call_ids == [c["id"] for c in calls]
    assert metrics.captured.data == {"slots": [[0, "Rklyc3Q="]], "ids": False}


def test_geminis_own_call_ids_are_kept() -> None:
    raw = answer([{"functionCall": {"id": "fc-7", "name": "f", "args": {}}}])
    out, metrics = translate(raw)
    assert out["choices"][0]["message"]["tool_calls"][0]["id"] == "fc-7"
    assert metrics.captured is not None and metrics.captured.data == {"slots": [], "ids": True}


def test_nothing_captured_when_not_asked_or_nothing_to_keep() -> None:
    plain = RequestOptions(stream=False, include_usage=False, return_progress=False)
    _, metrics = translate(answer([{"text": "x", "thoughtSignature": "U0lH"}]), plain)
    assert metrics.captured is None and metrics.answer_text is None
    _, metrics = translate(answer([{"text": "x"}]))
    assert metrics.captured is None


@pytest.mark.parametrize(
    ("reason", "calls", "expected"),
    [
        ("STOP", False, "stop"),
        ("STOP", True, "tool_calls"),
        ("MAX_TOKENS", True, "length"),
        ("SAFETY", False, "content_filter"),
        ("RECITATION", False, "content_filter"),
        ("PROHIBITED_CONTENT", False, "content_filter"),
        ("SPII", False, "content_filter"),
        ("BLOCKLIST", False, "content_filter"),
        ("IMAGE_SAFETY", False, "content_filter"),
        ("OTHER", False, "stop"),
        ("LANGUAGE", False, "stop"),
        ("SOMETHING_NEW", False, "stop"),
    ],
)
def test_finish_reasons(reason: str, calls: bool, expected: str) -> None:
    assert finish_reason(reason, calls) == expected


@pytest.mark.parametrize(
    "reason", ["MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS"]
)
def test_refused_function_calls_are_errors(reason: str) -> None:
    raw = orjson.dumps(
        {"candidates": [{"finishReason": reason, "finishMessage": "Malformed function call: x"}]}
    )
    with pytest.raises(MalformedResponse) as info:
        translate(raw)
    assert info.value.code == "malformed_function_call"
    assert reason in info.value.message and "Malformed function call: x" in info.value.message


def test_blocked_prompt_is_a_content_filter_answer() -> None:
    raw = orjson.dumps({"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": USAGE})
    out, _ = translate(raw)
    assert out["choices"][0]["finish_reason"] == "content_filter"
    assert out["choices"][0]["message"]["content"] == ""


@pytest.mark.parametrize("raw", [b"not json", b"[]", b"{}", b'{"candidates": []}'])
def test_malformed_answers(raw: bytes) -> None:
    with pytest.raises(MalformedResponse):
        translate(raw)


def error(status: int, message: str, canonical: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": canonical}}


def test_context_overflow() -> None:
    body = error(
        400,
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
        "INVALID_ARGUMENT",
    )
    exc = error_from_gemini(400, orjson.dumps(body), ())
    assert isinstance(exc, ContextLengthExceeded)
    assert exc.to_body()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("as_array", [False, True])
def test_error_shape_and_array_form(as_array: bool) -> None:
    body: Any = error(429, "Resource has been exhausted (e.g. check quota).", "RESOURCE_EXHAUSTED")
    raw = orjson.dumps([body] if as_array else body)
    exc = error_from_gemini(429, raw, ())
    assert isinstance(exc, UpstreamFailure)
    assert exc.http_status == 429
    assert exc.to_body() == {
        "error": {
            "message": "Resource has been exhausted (e.g. check quota).",
            "type": "rate_limit_error",
            "param": None,
            "code": "resource_exhausted",
        }
    }


def test_unavailable_and_secrets() -> None:
    body = error(503, "The model is overloaded; key AIzaSECRET", "UNAVAILABLE")
    exc = error_from_gemini(503, orjson.dumps(body), ("AIzaSECRET",))
    assert exc.http_status == 503 and exc.code == "upstream_unavailable"
    assert "AIzaSECRET" not in exc.message and "***" in exc.message


def test_error_that_is_not_json() -> None:
    exc = error_from_gemini(502, b"<html>Bad Gateway</html>", ())
    assert exc.http_status == 502 and "Bad Gateway" in exc.message
