"""Anthropic's answers as the caller's OpenAI answers (pure): messages, usage, stop
reasons, thinking blocks to keep, and error bodies.
"""

from __future__ import annotations

from typing import Any

import orjson

from boundedcode_gateway.errors import GatewayError, MalformedResponse
from boundedcode_gateway.json_values import count_or_none
from boundedcode_gateway.providers.upstream_errors import error_from_text, upstream_error
from boundedcode_gateway.upstream.metrics import CallMetrics, CapturedReasoning
from boundedcode_gateway.wire.chat import (
    AnswerMessage,
    completion_body,
    tool_call,
)

# the store's kind for Anthropic's thinking and redacted_thinking blocks
THINKING_KIND = "anthropic_thinking"
THINKING_TYPES = ("thinking", "redacted_thinking")

# the gateway's own convention, no vendor defines it (docs/providers.md, Anthropic)
FINISH_BY_STOP_REASON = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    # a long server-side tool turn paused: what the caller got is a whole answer
    "pause_turn": "stop",
    "model_context_window_exceeded": "length",
}

# an error event in a stream carries no HTTP status: the one its type is documented with
STATUS_BY_ERROR_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


def finish_reason(stop_reason: Any) -> str:
    """OpenAI's ``finish_reason`` for Anthropic's ``stop_reason``."""
    return (
        FINISH_BY_STOP_REASON.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"
    )


def read_usage(usage: Any, metrics: CallMetrics) -> None:
    """Fill token counts from an Anthropic ``usage`` (counts are cumulative; later wins)."""
    if not isinstance(usage, dict):
        return
    fresh = count_or_none(usage.get("input_tokens"))
    written = count_or_none(usage.get("cache_creation_input_tokens"))
    read = count_or_none(usage.get("cache_read_input_tokens"))
    if fresh is not None or written is not None or read is not None:
        metrics.prompt_tokens = (fresh or 0) + (written or 0) + (read or 0)
        metrics.cached_tokens = read or 0
        metrics.cache_write_tokens = written
        # what Anthropic processed rather than read from its cache
        metrics.evaluated_tokens = (fresh or 0) + (written or 0)
    output = count_or_none(usage.get("output_tokens"))
    if output is not None:
        metrics.completion_tokens = output
    details = usage.get("output_tokens_details")
    if isinstance(details, dict):
        reasoning = count_or_none(details.get("reasoning_tokens")) or count_or_none(
            details.get("thinking_tokens")
        )
        if reasoning is not None:
            metrics.reasoning_tokens = reasoning


class AnswerBuilder:
    """Collects one answer's blocks: text, tool calls, thinking shown and thinking kept."""

    __slots__ = ("ids", "kept", "message", "reasoning", "text")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] | None = None
        self.message = AnswerMessage()
        self.ids: list[str] = []
        # (position in the content, the block as Anthropic sent it)
        self.kept: list[tuple[int, dict[str, Any]]] = []

    def add_text(self, text: str) -> None:
        self.text.append(text)

    def add_thinking(self, position: int, block: dict[str, Any]) -> None:
        self.kept.append((position, block))
        if block.get("type") == "thinking":
            if self.reasoning is None:
                self.reasoning = []
            self.reasoning.append(str(block.get("thinking", "")))

    def add_tool(self, call_id: str, name: str, arguments: str) -> None:
        self.ids.append(call_id)
        if self.message.tool_calls is None:
            self.message.tool_calls = []
        self.message.tool_calls.append(tool_call(call_id, name, arguments))

    def captured(self) -> CapturedReasoning | None:
        """The thinking blocks to give back on later requests; None when there were none."""
        if not self.kept:
            return None
        data = [[position, block] for position, block in self.kept]
        return CapturedReasoning(THINKING_KIND, self.ids, "".join(self.text), data)

    def finish(self) -> AnswerMessage:
        self.message.content = "".join(self.text) if self.text or not self.ids else None
        if self.reasoning is not None:
            self.message.reasoning = "".join(self.reasoning)
        return self.message


def from_anthropic_response(raw: bytes, metrics: CallMetrics, capture_content: bool) -> bytes:
    """A non-streamed Messages API answer as OpenAI's ``chat.completion``."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise MalformedResponse("the upstream answered 200 with a body that is not JSON") from None
    content = obj.get("content") if isinstance(obj, dict) else None
    if not isinstance(content, list):
        raise MalformedResponse("the upstream answered 200 with no content blocks")
    answer = AnswerBuilder()
    for position, block in enumerate(content):
        if not isinstance(block, dict):
            raise MalformedResponse("the upstream answered a content block that is not an object")
        kind = block.get("type")
        if kind == "text":
            answer.add_text(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            answer.add_tool(str(block.get("id", "")), str(block.get("name", "")), arguments)
        elif kind in THINKING_TYPES:
            answer.add_thinking(position, block)
    read_usage(obj.get("usage"), metrics)
    model = obj.get("model")
    metrics.upstream_model = model if isinstance(model, str) else None
    finish = finish_reason(obj.get("stop_reason"))
    metrics.finish_reason = finish
    metrics.captured = answer.captured()
    message = answer.finish()
    if capture_content:
        metrics.answer_text = message.content
    return completion_body(obj.get("id"), metrics.upstream_model or "", message, finish, metrics)


def _error_parts(obj: Any) -> tuple[str, str | None, str | None]:
    """(message, Anthropic error type, code) of an error body or stream error event."""
    err = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(err, dict):
        return str(obj), None, None
    kind = err.get("type") if isinstance(err.get("type"), str) else None
    details = err.get("details")
    # a spent budget answers 429 too, and must not be sent again
    code = details.get("error_code") if isinstance(details, dict) else None
    return str(err.get("message") or kind or err), kind, code if isinstance(code, str) else kind


def error_from_anthropic(status: int, raw: bytes, secrets: tuple[str, ...]) -> GatewayError:
    """The gateway error for an Anthropic error answer."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return error_from_text(status, raw, secrets)
    message, kind, code = _error_parts(obj)
    return upstream_error(
        status, message, error_type=kind, code=code if status != 400 else None, secrets=secrets
    )


def error_from_stream_event(obj: Any, secrets: tuple[str, ...]) -> GatewayError:
    """The gateway error for an ``error`` event inside a stream (an overload, mostly)."""
    message, kind, code = _error_parts(obj)
    status = STATUS_BY_ERROR_TYPE.get(kind or "", 502)
    return upstream_error(
        status, message, error_type=kind, code=code if status != 400 else None, secrets=secrets
    )
