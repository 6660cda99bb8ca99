"""Pure translation between the caller's OpenAI request and an OpenAI-shaped upstream.

Request in, request out; response in, response out; error body in, gateway
error out. No I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

from boundedcode_gateway.errors import GatewayError, MalformedResponse
from boundedcode_gateway.json_values import count_or_none
from boundedcode_gateway.policy.reasoning import (
    REASONING_FIELD,
    REASONING_KIND,
    Lookup,
    no_lookup,
    outgoing_messages,
)
from boundedcode_gateway.policy.structured import RequestedSchema, strict_schema
from boundedcode_gateway.providers.base import RequestOptions
from boundedcode_gateway.providers.openai_compat.dialects import Dialect
from boundedcode_gateway.providers.upstream_errors import (
    MESSAGE_CHARS,
    TEXT_CHARS,
    upstream_error,
)
from boundedcode_gateway.reasoning_store.keys import tool_call_ids
from boundedcode_gateway.upstream.metrics import CallMetrics, CapturedReasoning
from boundedcode_gateway.wire.chat import SYSTEM_STAMPS, Stamps, text_of


def _named_tool_to_required(out: dict[str, Any]) -> None:
    # llama-server treats an object tool_choice as "auto"; "required" over the one
    # named tool forces the same call
    choice = out.get("tool_choice")
    if not isinstance(choice, dict):
        return
    name = (choice.get("function") or {}).get("name")
    tools = out.get("tools") or []
    named = [
        t for t in tools if isinstance(t, dict) and (t.get("function") or {}).get("name") == name
    ]
    if named:
        out["tool_choice"] = "required"
        out["tools"] = named
    else:
        out["tool_choice"] = "auto"


def to_openai_compat_request(
    body: dict[str, Any],
    *,
    model: str,
    dialect: Dialect,
    options: RequestOptions,
    takes_reasoning: bool,
    profile: str = "",
    lookup: Lookup | None = None,
    required_on_tool_turns: bool = False,
    schema: RequestedSchema | None = None,
    send_schema: bool = True,
) -> dict[str, Any]:
    """The upstream's request: the caller's body with the gateway's few changes.

    Fields the gateway does not interpret pass through unchanged. ``lookup`` finds a
    turn's stored reasoning (see ``policy/reasoning.py``); ``schema`` is the one the caller
    asked for, in its ``response_format``, sent in the dialect's form or, without
    ``send_schema``, left out.
    """
    out = dict(body)
    out["model"] = model
    if options.stream:
        stream_options = dict(out.get("stream_options") or {})
        stream_options["include_usage"] = True
        out["stream_options"] = stream_options
        if dialect.prompt_progress:
            # metered whatever the caller asked; relayed only to callers who asked
            out["return_progress"] = True
    messages = outgoing_messages(
        body["messages"],
        takes_reasoning,
        profile=profile,
        lookup=lookup or no_lookup,
        required_on_tool_turns=required_on_tool_turns,
    )
    if messages is not body["messages"]:
        out["messages"] = messages
    if dialect.tool_choice_string_only:
        _named_tool_to_required(out)
    if schema is not None:
        if send_schema:
            out["response_format"] = schema_response_format(schema, dialect.strict_schema)
        else:
            del out["response_format"]
    return out


def schema_response_format(schema: RequestedSchema, strict: bool) -> dict[str, Any]:
    """``response_format`` in the target's form: OpenAI's strict one, or llama.cpp's, which
    reads only ``json_schema.schema``."""
    if not strict:
        return {
            "type": "json_schema",
            "json_schema": {"name": schema.name, "schema": schema.schema},
        }
    return {
        "type": "json_schema",
        "json_schema": {
            "name": schema.name,
            "schema": strict_schema(schema.schema),
            "strict": True,
        },
    }


def read_usage(usage: dict[str, Any], metrics: CallMetrics) -> None:
    """Fill token counts from an OpenAI ``usage`` object."""
    metrics.prompt_tokens = count_or_none(usage.get("prompt_tokens"))
    metrics.completion_tokens = count_or_none(usage.get("completion_tokens"))
    prompt_details = usage.get("prompt_tokens_details")
    if isinstance(prompt_details, dict):
        metrics.cached_tokens = count_or_none(prompt_details.get("cached_tokens"))
    completion_details = usage.get("completion_tokens_details")
    if isinstance(completion_details, dict):
        metrics.reasoning_tokens = count_or_none(completion_details.get("reasoning_tokens"))
    if metrics.evaluated_tokens is None and metrics.prompt_tokens is not None:
        metrics.evaluated_tokens = metrics.prompt_tokens - (metrics.cached_tokens or 0)


def read_timings(timings: dict[str, Any], metrics: CallMetrics) -> None:
    """Fill llama.cpp's own measurements: evaluated prompt tokens, prefill and decode times."""
    prompt_n = count_or_none(timings.get("prompt_n"))
    if prompt_n is not None:
        metrics.evaluated_tokens = prompt_n
    if metrics.cached_tokens is None:
        metrics.cached_tokens = count_or_none(timings.get("cache_n"))
    prompt_ms = timings.get("prompt_ms")
    predicted_ms = timings.get("predicted_ms")
    if isinstance(prompt_ms, int | float):
        metrics.prefill_ms = float(prompt_ms)
    if isinstance(predicted_ms, int | float):
        metrics.decode_ms = float(predicted_ms)


def read_progress(progress: dict[str, Any], metrics: CallMetrics) -> None:
    """Prompt size and cache hit from llama.cpp's ``prompt_progress``, before usage arrives."""
    total = count_or_none(progress.get("total"))
    cache = count_or_none(progress.get("cache"))
    if total is None or cache is None:
        return
    metrics.prompt_tokens = total
    metrics.cached_tokens = cache
    metrics.evaluated_tokens = total - cache
    processed = count_or_none(progress.get("processed"))
    if processed is not None:
        metrics.prompt_processed = processed


def read_answer_metrics(obj: dict[str, Any], metrics: CallMetrics) -> None:
    """Usage, timings and model of one response or chunk object."""
    usage = obj.get("usage")
    if isinstance(usage, dict):
        read_usage(usage, metrics)
    timings = obj.get("timings")
    if isinstance(timings, dict):
        read_timings(timings, metrics)
    if metrics.upstream_model is None and isinstance(obj.get("model"), str):
        metrics.upstream_model = obj["model"]


def complete_tool_call_head(call: dict[str, Any], stamps: Stamps = SYSTEM_STAMPS) -> bool:
    """Give a tool call (or its first stream delta) an id and a type where missing."""
    changed = False
    if not call.get("id"):
        call["id"] = stamps.tool_call_id()
        changed = True
    if not call.get("type"):
        call["type"] = "function"
        changed = True
    return changed


def complete_tool_call(call: dict[str, Any]) -> bool:
    """Give one tool call an id, a type and arguments (``{}``) where missing; True if changed."""
    changed = complete_tool_call_head(call)
    function = call.get("function")
    if isinstance(function, dict) and not function.get("arguments"):
        function["arguments"] = "{}"
        changed = True
    return changed


def _complete_tool_calls(choices: list[Any]) -> bool:
    changed = False
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict):
                changed = complete_tool_call(call) or changed
    return changed


def capture_from_message(message: Any) -> CapturedReasoning | None:
    """The reasoning of an answer message and what finds it again; None when it had none."""
    if not isinstance(message, dict):
        return None
    reasoning = message.get(REASONING_FIELD)
    if not isinstance(reasoning, str):
        return None
    return CapturedReasoning(
        REASONING_KIND, tool_call_ids(message), text_of(message.get("content")), reasoning
    )


def answer_message(message: dict[str, Any]) -> dict[str, Any]:
    """An answer as a caller sends it back: role, content, reasoning and tool calls only."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    reasoning = message.get(REASONING_FIELD)
    if isinstance(reasoning, str):
        out[REASONING_FIELD] = reasoning
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = calls
    return out


def from_openai_compat_response(
    raw: bytes,
    metrics: CallMetrics,
    capture: bool = False,
    capture_content: bool = False,
    capture_answer: bool = False,
) -> bytes:
    """Check a non-streamed answer and measure it; the bytes go to the caller unchanged
    unless a tool call needed its id, type or arguments filled in."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise MalformedResponse("the upstream answered 200 with a body that is not JSON") from None
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponse("the upstream answered 200 with no choices")
    read_answer_metrics(obj, metrics)
    finish = choices[0].get("finish_reason")
    metrics.finish_reason = finish if isinstance(finish, str) else None
    changed = _complete_tool_calls(choices)
    message = choices[0].get("message")
    if capture:
        metrics.captured = capture_from_message(message)
    if capture_content and isinstance(message, dict):
        metrics.answer_text = text_of(message.get("content"))
    if capture_answer and isinstance(message, dict):
        metrics.answer_message = answer_message(message)
    return orjson.dumps(obj) if changed else raw


def _error_fields(raw: bytes) -> tuple[str, str | None, Any, str | None, int]:
    """(message, type, code, param, the message's length limit) from an OpenAI-,
    llama.cpp- or FastAPI-style error body."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = raw.decode("utf-8", "replace").strip()
        message = text or "the upstream answered with an empty error body"
        return message, None, None, None, TEXT_CHARS
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        param = err.get("param")
        return (
            str(err.get("message") or err),
            err.get("type") if isinstance(err.get("type"), str) else None,
            err.get("code"),
            param if isinstance(param, str) else None,
            MESSAGE_CHARS,
        )
    if isinstance(err, str):
        return err, None, None, None, MESSAGE_CHARS
    if isinstance(obj, dict) and isinstance(obj.get("message"), str):
        # vLLM and SGLang: {"object": "error", "message", "type", "param", "code": 400}
        kind = obj.get("type")
        kind = kind if isinstance(kind, str) else None
        return obj["message"], kind, obj.get("code"), None, MESSAGE_CHARS
    if isinstance(obj, dict) and "detail" in obj:
        return str(obj["detail"]), None, None, None, MESSAGE_CHARS
    return str(obj), None, None, None, TEXT_CHARS


def error_from_openai_compat(status: int, raw: bytes, secrets: tuple[str, ...]) -> GatewayError:
    """The gateway error for an upstream error answer, in OpenAI's shape."""
    message, error_type, code, param, max_chars = _error_fields(raw)
    if not isinstance(code, str):
        # llama.cpp puts the HTTP status in "code"; OpenAI's codes are strings
        code = "upstream_unavailable" if status == 503 else None
    return upstream_error(
        status,
        message,
        error_type=error_type,
        code=code,
        param=param,
        secrets=secrets,
        max_chars=max_chars,
    )


def error_from_stream_event(error: Any, secrets: tuple[str, ...]) -> GatewayError:
    """The gateway error for a ``data: {"error": ...}`` event inside a stream."""
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    return error_from_openai_compat(status, orjson.dumps({"error": error}), secrets)
