"""A call's record as OpenTelemetry attributes: the GenAI semantic conventions' names
(semantic-conventions-genai v0.1.0, ``gen_ai.client.inference``) and the gateway's own
under ``boundedcode.``. Pure: the record in, plain dicts out; golden-tested.

Never a key: the caller is named by its key's name, an error by the gateway's words
(which the record already holds redacted).
"""

from __future__ import annotations

from typing import Any

import orjson

from boundedcode_gateway.metering.records import (
    SLOT_SAVE_PURPOSE,
    TOKEN_COUNT_PURPOSE,
    CallRecord,
)
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE

Attributes = dict[str, Any]

# the semantic conventions' provider names, by the profile's provider kind; a kind they
# do not list keeps a name of its own
PROVIDER_NAMES = {
    "openai": "openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
    "local": "llama.cpp",
    "openai-compatible": "openai_compatible",
}
# a call routed to no provider (refused before it had a profile)
UNKNOWN = "_OTHER"
CHAT = "chat"


def operation(record: CallRecord) -> str:
    """``gen_ai.operation.name``: a caller's call is a chat; the gateway's own work is
    named for what it is (custom values, as the conventions allow)."""
    purpose = record.purpose
    if purpose == REPAIR_PURPOSE:
        return "text_completion"
    if purpose == TOKEN_COUNT_PURPOSE:
        return "count_tokens"
    if purpose == SLOT_SAVE_PURPOSE:
        return "slot_save"
    return CHAT


def provider(record: CallRecord) -> str:
    return PROVIDER_NAMES.get(record.provider or "", record.provider or UNKNOWN)


def span_name(record: CallRecord) -> str:
    """``{gen_ai.operation.name} {gen_ai.request.model}``; the cache repair by its name."""
    if record.purpose == REPAIR_PURPOSE:
        return f"cache_repair {record.model_profile}"
    return f"{operation(record)} {record.model_profile}"


def error_type(record: CallRecord) -> str | None:
    """``error.type``: the gateway's error code (low cardinality), else the HTTP status."""
    if record.status != "error":
        return None
    return record.error_code or str(record.http_status)


def server_of(to: str | None) -> tuple[str, int] | None:
    """(address, port) of an attempt's host:port."""
    if not to:
        return None
    host, _, port = to.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def _put(out: Attributes, key: str, value: Any) -> None:
    if value is not None:
        out[key] = value


def call_attributes(r: CallRecord) -> Attributes:
    """The call span's attributes."""
    out: Attributes = {
        "gen_ai.operation.name": operation(r),
        "gen_ai.provider.name": provider(r),
        "gen_ai.request.model": r.model_profile,
        "gen_ai.request.stream": r.stream,
        "boundedcode.call_id": r.call_id,
        "boundedcode.task": r.task,
        "boundedcode.purpose": r.purpose,
        "boundedcode.front": r.front,
        "boundedcode.profile": r.model_profile,
    }
    # what every plain call would say alike is left out (each attribute costs its export)
    if r.http_status != 200:
        out["http.response.status_code"] = r.http_status
    if r.attempts != 1:
        out["boundedcode.attempts"] = r.attempts
    if r.retried:
        out["boundedcode.retried"] = True
    _put(out, "gen_ai.conversation.id", r.task)
    _put(out, "gen_ai.response.model", r.upstream_model)
    if r.finish_reason:
        out["gen_ai.response.finish_reasons"] = (r.finish_reason,)
    _put(out, "gen_ai.usage.input_tokens", r.prompt_tokens)
    _put(out, "gen_ai.usage.output_tokens", r.completion_tokens)
    _put(out, "gen_ai.usage.cache_read.input_tokens", r.cached_tokens)
    _put(out, "gen_ai.usage.cache_write.input_tokens", r.cache_write_tokens)
    _put(out, "gen_ai.usage.reasoning.output_tokens", r.reasoning_tokens)
    if r.stream and r.ttft_ms is not None:
        out["gen_ai.response.time_to_first_chunk"] = r.ttft_ms / 1000.0
    _put(out, "error.type", error_type(r))
    last = r.attempt_log[-1] if r.attempt_log else None
    server = server_of(last.get("to") if last is not None else None)
    if server is not None:
        out["server.address"], out["server.port"] = server
    _put(out, "boundedcode.caller", r.caller)
    _put(out, "boundedcode.evaluated_tokens", r.evaluated_tokens)
    _put(out, "boundedcode.reusable_tokens", r.reusable_tokens)
    _put(out, "boundedcode.miss_cause", r.miss_cause)
    if r.miss_at is not None:
        _put(out, "boundedcode.miss_at.message", r.miss_at.get("message"))
        _put(out, "boundedcode.miss_at.char", r.miss_at.get("char"))
    _put(out, "boundedcode.server", r.server)
    _put(out, "boundedcode.slot", r.slot)
    if not r.stream:
        # a whole answer's, from the server's own timings (the conventions' is streamed only)
        _put(out, "boundedcode.ttft_ms", r.ttft_ms)
    _put(out, "boundedcode.prefill_ms", r.prefill_ms)
    _put(out, "boundedcode.decode_ms", r.decode_ms)
    _put(out, "boundedcode.restored_tokens", r.restored_tokens)
    _put(out, "boundedcode.slot_restore_ms", r.slot_restore_ms)
    _put(out, "boundedcode.slot_save_ms", r.slot_save_ms)
    _put(out, "boundedcode.restore_failure", r.restore_failure)
    _put(out, "boundedcode.cost_usd", r.cost_usd)
    _put(out, "boundedcode.structured_output", r.structured_output)
    if r.error_code in BUDGET_CODES:
        # whose budget refused it: the caller's key (or token), else the task's
        out["boundedcode.budget_holder"] = r.caller or f"task:{r.task}"
    return out


BUDGET_CODES = frozenset({"budget_exceeded", "budget_store_unavailable"})


def attempt_attributes(r: CallRecord, entry: dict[str, Any], index: int) -> Attributes:
    """One attempt's span: a client call to the upstream."""
    out: Attributes = {
        "gen_ai.operation.name": operation(r),
        "gen_ai.provider.name": provider(r),
        "gen_ai.request.model": r.upstream_model or r.model_profile,
        "boundedcode.attempt": index,
        "boundedcode.attempt.kind": entry.get("kind") or "first",
    }
    status = entry.get("status")
    if isinstance(status, int):
        out["http.response.status_code"] = status
        if status != 200:
            out["error.type"] = entry.get("code") or str(status)
    server = server_of(entry.get("to"))
    if server is not None:
        out["server.address"], out["server.port"] = server
    return out


def _text_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append({"type": "text", "content": part["text"]})
            elif isinstance(part, dict):
                parts.append({"type": str(part.get("type", "unknown"))})
    return parts


def input_messages(messages: Any) -> list[dict[str, Any]]:
    """Chat messages in the conventions' shape: a role and its parts."""
    out: list[dict[str, Any]] = []
    if not isinstance(messages, list):
        return out
    for m in messages:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", "user"))
        parts = _text_parts(m.get("content"))
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    parts.append(
                        {
                            "type": "tool_call",
                            "id": call.get("id"),
                            "name": fn.get("name"),
                            "arguments": fn.get("arguments"),
                        }
                    )
        if role == "tool":
            parts = [
                {
                    "type": "tool_call_response",
                    "id": m.get("tool_call_id"),
                    "response": m.get("content"),
                }
            ]
        out.append({"role": role, "parts": parts})
    return out


def clipped_json(value: Any, max_chars: int) -> str:
    """``value`` as JSON, cut to ``max_chars`` characters (a cut one is marked)."""
    text = orjson.dumps(value, default=str).decode()
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + "…[truncated]"


def content_attributes(messages: Any, answer: str | None, max_chars: int) -> Attributes:
    """``gen_ai.input.messages`` and ``gen_ai.output.messages``, each cut to ``max_chars``."""
    out: Attributes = {"gen_ai.input.messages": clipped_json(input_messages(messages), max_chars)}
    if answer is not None:
        output = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
        out["gen_ai.output.messages"] = clipped_json(output, max_chars)
    return out
