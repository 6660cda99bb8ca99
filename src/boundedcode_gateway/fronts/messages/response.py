"""A chat completion as a Messages API answer (pure), and the pieces the stream shares:
the message id, the stop reason, the usage and the tool call's input.

The answer's reasoning becomes a ``thinking`` block signed by the gateway for the
profile that wrote it (signature.py), so the caller can give it back (request.py
checks the signature); its text a ``text``
block; each tool call a ``tool_use`` block. A stop sequence cannot be told from
the model's own end (the chat form does not say which ended the answer): both are
``end_turn``, with ``stop_sequence`` null.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import orjson

from boundedcode_gateway.fronts.messages.signature import signed_text
from boundedcode_gateway.json_values import count_or_none

# what the gateway signs a thinking block's text with (Sealer.sign)
Sign = Callable[[str], str]

STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_COMPLETION_PREFIX = "chatcmpl-"


def message_id(completion_id: Any) -> str:
    """``msg_`` and the completion's own id (a random one when it has none)."""
    if isinstance(completion_id, str) and completion_id:
        return "msg_" + completion_id.removeprefix(_COMPLETION_PREFIX)
    return "msg_" + secrets.token_hex(12)


def stop_reason(finish_reason: Any) -> str:
    """Anthropic's ``stop_reason`` for OpenAI's ``finish_reason``."""
    if not isinstance(finish_reason, str):
        return "end_turn"
    return STOP_REASON.get(finish_reason, "end_turn")


def usage(chat_usage: Any) -> dict[str, int]:
    """Anthropic's usage for OpenAI's: the prompt split into what was read from a cache and
    the rest (so their sum is the whole prompt), and the completion."""
    prompt = cached = completion = 0
    if isinstance(chat_usage, dict):
        prompt = count_or_none(chat_usage.get("prompt_tokens")) or 0
        completion = count_or_none(chat_usage.get("completion_tokens")) or 0
        details = chat_usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            cached = count_or_none(details.get("cached_tokens")) or 0
    return {
        "input_tokens": max(prompt - cached, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": completion,
    }


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments (a JSON text) as the object ``tool_use.input`` is; ``{}``
    for arguments that are none or not an object, as the gateway completes a call
    without arguments."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def thinking_signature(profile: str, text: str, sign: Sign) -> str:
    """The signature of a thinking block ``profile`` wrote."""
    return sign(signed_text(profile, text))


def _tool_use(call: Any) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return None
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    call_id = call.get("id")
    return {
        "type": "tool_use",
        "id": call_id if isinstance(call_id, str) and call_id else "toolu_" + secrets.token_hex(12),
        "name": str(function.get("name") or ""),
        "input": tool_input(function.get("arguments")),
    }


def to_message(completion: dict[str, Any], profile: str, sign: Sign) -> dict[str, Any]:
    """The Messages answer for a ``chat.completion`` of ``profile``."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") if isinstance(choice, dict) else None
    message = message if isinstance(message, dict) else {}
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        signature = thinking_signature(profile, reasoning, sign)
        content.append({"type": "thinking", "thinking": reasoning, "signature": signature})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        content.append({"type": "text", "text": refusal})
    for call in message.get("tool_calls") or ():
        block = _tool_use(call)
        if block is not None:
            content.append(block)
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    model = completion.get("model")
    return {
        "id": message_id(completion.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model if isinstance(model, str) else "",
        "content": content,
        "stop_reason": "refusal" if refusal else stop_reason(finish),
        "stop_sequence": None,
        "usage": usage(completion.get("usage")),
    }


def answer_body(body: bytes, profile: str, sign: Sign) -> bytes:
    """A whole chat answer's JSON as the Messages answer's."""
    return orjson.dumps(to_message(orjson.loads(body), profile, sign))
