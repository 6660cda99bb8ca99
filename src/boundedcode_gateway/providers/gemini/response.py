"""A Gemini answer as the caller's OpenAI answer, and a Gemini error as the gateway's (pure).

``AnswerParts`` reads a candidate's parts one at a time, so the non-streamed
answer and the stream translator build the same message from the same parts.
Thought parts become ``reasoning_content`` (for display only); signatures are
collected for the store.
"""

from __future__ import annotations

from typing import Any

import orjson

from boundedcode_gateway.errors import GatewayError, MalformedResponse, redact
from boundedcode_gateway.json_values import count_or_none
from boundedcode_gateway.providers.base import RequestOptions
from boundedcode_gateway.providers.gemini.signatures import SignatureCollector
from boundedcode_gateway.providers.upstream_errors import (
    TEXT_CHARS,
    error_from_text,
    upstream_error,
)
from boundedcode_gateway.upstream.metrics import CallMetrics, CaptureLimit
from boundedcode_gateway.wire.chat import (
    SYSTEM_STAMPS,
    AnswerMessage,
    Stamps,
    completion_body,
    tool_call,
)

# Gemini's finishReason → OpenAI's finish_reason ("stop" becomes "tool_calls" with calls)
FINISH_REASONS = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "IMAGE_RECITATION": "content_filter",
    "LANGUAGE": "stop",
    "OTHER": "stop",
    "FINISH_REASON_UNSPECIFIED": "stop",
    "NO_IMAGE": "stop",
    "IMAGE_OTHER": "stop",
}
# the model wrote a function call Gemini could not use: an error, like llama.cpp's 500
BROKEN_CALL_REASONS = frozenset(
    {"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS"}
)
BROKEN_CALL_CODE = "malformed_function_call"


def finish_reason(reason: str, has_calls: bool, message: Any = None) -> str:
    """OpenAI's finish_reason for Gemini's; raises for a function call Gemini refused."""
    if reason in BROKEN_CALL_REASONS:
        detail = f": {message}" if isinstance(message, str) and message else ""
        raise MalformedResponse(
            f"Gemini ended the answer with {reason}{detail}", code=BROKEN_CALL_CODE
        )
    finish = FINISH_REASONS.get(reason, "stop")
    return "tool_calls" if finish == "stop" and has_calls else finish


def _count(usage: dict[str, Any], key: str) -> int:
    return count_or_none(usage.get(key)) or 0


def read_usage(usage: Any, metrics: CallMetrics) -> None:
    """Fill token counts from ``usageMetadata``, as docs/providers.md (Gemini) maps them."""
    if not isinstance(usage, dict):
        return
    metrics.prompt_tokens = _count(usage, "promptTokenCount") + _count(
        usage, "toolUsePromptTokenCount"
    )
    metrics.cached_tokens = _count(usage, "cachedContentTokenCount")
    thoughts = _count(usage, "thoughtsTokenCount")
    metrics.completion_tokens = _count(usage, "candidatesTokenCount") + thoughts
    metrics.reasoning_tokens = thoughts
    metrics.evaluated_tokens = metrics.prompt_tokens - metrics.cached_tokens


class AnswerParts:
    """The answer so far: text, thoughts, function calls and signatures, part by part."""

    __slots__ = (
        "_content",
        "_limit",
        "_native_ids",
        "_reasoning",
        "_stamps",
        "signatures",
        "tool_calls",
    )

    def __init__(self, stamps: Stamps = SYSTEM_STAMPS, limit: CaptureLimit | None = None) -> None:
        self._stamps = stamps
        # a streamed answer's (a whole one is bounded by the size of its body)
        self._limit = limit
        self._content: list[str] = []
        self._reasoning: list[str] | None = None
        self.tool_calls: list[dict[str, Any]] = []
        self._native_ids = False
        self.signatures = SignatureCollector()

    def add(self, part: Any) -> dict[str, Any] | None:
        """Take one part; return its OpenAI delta, or None when it shows nothing."""
        if not isinstance(part, dict):
            raise MalformedResponse("Gemini sent a part that is not an object")
        if self._limit is not None:
            self._limit.take(_text_of(part.get("text")))
            signature = part.get("thoughtSignature")
            if isinstance(signature, str):
                self._limit.take(signature)
        call = part.get("functionCall")
        if isinstance(call, dict):
            index = len(self.tool_calls)
            self.signatures.add(part.get("thoughtSignature"), index)
            return {"tool_calls": [{"index": index, **self._tool_call(call)}]}
        self.signatures.add(part.get("thoughtSignature"), None)
        text = part.get("text")
        if not isinstance(text, str) or not text:
            return None  # a signature-only part, or one the caller has no field for
        if part.get("thought") is True:
            if self._reasoning is None:
                self._reasoning = []
            self._reasoning.append(text)
            return {"reasoning_content": text}
        self._content.append(text)
        return {"content": text}

    def _tool_call(self, call: dict[str, Any]) -> dict[str, Any]:
        call_id = call.get("id")
        if isinstance(call_id, str) and call_id:
            self._native_ids = True
        else:
            call_id = self._stamps.tool_call_id()
        args = call.get("args")
        arguments = orjson.dumps(args if isinstance(args, dict) else {}).decode()
        if self._limit is not None:
            self._limit.take(arguments)
        entry = tool_call(call_id, str(call.get("name", "")), arguments)
        self.tool_calls.append(entry)
        return entry

    @property
    def text(self) -> str:
        return "".join(self._content)

    def message(self) -> AnswerMessage:
        """The whole answer as the caller's message."""
        return AnswerMessage(
            content=self.text if self._content or not self.tool_calls else None,
            reasoning=None if self._reasoning is None else "".join(self._reasoning),
            tool_calls=self.tool_calls or None,
        )

    def finish(self, metrics: CallMetrics, options: RequestOptions) -> None:
        """Note what the store and the schema check keep of the finished answer."""
        if options.capture_reasoning:
            ids = [c["id"] for c in self.tool_calls]
            metrics.captured = self.signatures.captured(ids, self.text, self._native_ids)
        if options.capture_content:
            metrics.answer_text = self.text


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else ""


def first_candidate(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The response's first candidate, if it has one."""
    candidates = obj.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
        return candidates[0]
    return None


def candidate_parts(candidate: dict[str, Any]) -> list[Any]:
    """The parts of a candidate's content (none when it has no content)."""
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else []


def blocked_prompt(obj: dict[str, Any]) -> bool:
    """Gemini refused the prompt itself (``promptFeedback.blockReason``, no candidates)."""
    feedback = obj.get("promptFeedback")
    return isinstance(feedback, dict) and bool(feedback.get("blockReason"))


def from_gemini_response(
    raw: bytes, metrics: CallMetrics, options: RequestOptions, model: str
) -> bytes:
    """The caller's ``chat.completion`` for a non-streamed Gemini answer; fills ``metrics``."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise MalformedResponse("Gemini answered 200 with a body that is not JSON") from None
    if not isinstance(obj, dict):
        raise MalformedResponse("Gemini answered 200 with a body that is not an object")
    read_usage(obj.get("usageMetadata"), metrics)
    version = obj.get("modelVersion")
    metrics.upstream_model = version if isinstance(version, str) else None
    answer = AnswerParts()
    candidate = first_candidate(obj)
    if candidate is None:
        if not blocked_prompt(obj):
            raise MalformedResponse("Gemini answered 200 with no candidates")
        finish = "content_filter"
    else:
        for part in candidate_parts(candidate):
            answer.add(part)
        reason = candidate.get("finishReason")
        finish = finish_reason(
            reason if isinstance(reason, str) else "STOP",
            bool(answer.tool_calls),
            candidate.get("finishMessage"),
        )
    metrics.finish_reason = finish
    answer.finish(metrics, options)
    return completion_body(
        obj.get("responseId"),
        metrics.upstream_model or model,
        answer.message(),
        finish,
        metrics,
    )


# -- errors


def _error_object(obj: Any) -> dict[str, Any] | None:
    # a stream's error may come as a one-element array: [{"error": {...}}]
    if isinstance(obj, list) and obj:
        obj = obj[0]
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        error: dict[str, Any] = obj["error"]
        return error
    return None


def error_from_gemini(status: int, raw: bytes, secrets: tuple[str, ...]) -> GatewayError:
    """The gateway error for Gemini's error answer (an object, or an array of one)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return error_from_text(status, raw, secrets)
    error = _error_object(obj)
    if error is None:
        return upstream_error(
            status, str(obj), error_type=None, code=None, secrets=secrets, max_chars=TEXT_CHARS
        )
    return _gateway_error(status, error, secrets)


def _gateway_error(status: int, error: dict[str, Any], secrets: tuple[str, ...]) -> GatewayError:
    canonical = error.get("status")
    # the key is taken out before the case is folded, which would hide it from redaction
    code = redact(canonical, secrets).lower() if isinstance(canonical, str) and canonical else None
    if status == 503:
        code = "upstream_unavailable"
    message = str(error.get("message") or canonical or "Gemini answered with an error")
    return upstream_error(status, message, error_type=None, code=code, secrets=secrets)


def error_in_stream(obj: Any, secrets: tuple[str, ...]) -> GatewayError | None:
    """The gateway error for an error payload inside a stream; None for an answer chunk."""
    error = _error_object(obj)
    if error is None:
        return None
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    return _gateway_error(status, error, secrets)
