"""OpenAI's chat-completions shapes, read and written for whatever translates (pure).

The Anthropic and Gemini adapters read the caller's request through these
helpers and build the caller's answer (a completion, or stream chunks with one
stable id) through them, so both speak exactly the same OpenAI on the way out; the
fronts read the chat answers they translate back with the same helpers.
"""

from __future__ import annotations

import binascii
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.json_values import is_int
from boundedcode_gateway.upstream.metrics import CallMetrics

SYSTEM_ROLES = ("system", "developer")


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


@dataclass(frozen=True, slots=True)
class DataUrl:
    """An inline ``data:`` URL of an image: its media type and base64 payload."""

    media_type: str
    data: str


def parse_data_url(url: str) -> DataUrl | None:
    """``data:image/png;base64,AAAA`` → its parts; None for any other URL."""
    if not url.startswith("data:"):
        return None
    head, sep, data = url[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        return None
    try:
        binascii.a2b_base64(data[:64] + "=" * (-len(data[:64]) % 4))
    except binascii.Error:
        return None
    return DataUrl(head.removesuffix(";base64") or "application/octet-stream", data)


def image_url_of(part: dict[str, Any]) -> str | None:
    """The URL of an ``image_url`` part (an object with ``url``, or the bare string)."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    return url if isinstance(url, str) else None


def content_parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as a list of OpenAI parts (a string is one text part)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return [p for p in content if isinstance(p, dict)]
    return []


def system_text(messages: list[Any]) -> str:
    """The text of every system and developer message, in order, one paragraph each."""
    texts = (
        text_of(msg.get("content"))
        for msg in messages
        if isinstance(msg, dict) and msg.get("role") in SYSTEM_ROLES
    )
    return "\n\n".join(t for t in texts if t)


def arguments_object(arguments: Any, where: str) -> dict[str, Any]:
    """A tool call's ``arguments`` (a JSON string) as the object the native APIs want."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    try:
        value = orjson.loads(arguments)
    except (orjson.JSONDecodeError, TypeError):
        raise InvalidRequest(
            f"{where}: the tool call's arguments are not valid JSON", param="messages"
        ) from None
    if not isinstance(value, dict):
        raise InvalidRequest(
            f"{where}: the tool call's arguments must be a JSON object", param="messages"
        )
    return value


def tool_names_by_id(messages: list[Any]) -> dict[str, str]:
    """The function name of every tool call in the history, by its id."""
    names: dict[str, str] = {}
    for msg in messages:
        if not isinstance(msg, dict) or msg.get("role") != "assistant":
            continue
        for call in msg.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                function = call.get("function") or {}
                names[call["id"]] = str(function.get("name", ""))
    return names


def max_output_tokens(body: dict[str, Any]) -> int | None:
    """The caller's limit on the answer: ``max_completion_tokens``, else ``max_tokens``."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if is_int(value):
            return value
    return None


def stop_sequences(stop: Any) -> list[str]:
    """OpenAI's ``stop`` (a string or a list) as a list."""
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list):
        return [s for s in stop if isinstance(s, str) and s]
    return []


def function_tools(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The ``function`` object of each function tool the caller offers."""
    for tool in body.get("tools") or ():
        if isinstance(tool, dict) and tool.get("type", "function") == "function":
            function = tool.get("function")
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                yield function


def usage_object(metrics: CallMetrics) -> dict[str, Any]:
    """OpenAI's ``usage`` from normalised metrics."""
    prompt = metrics.prompt_tokens or 0
    completion = metrics.completion_tokens or 0
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": metrics.cached_tokens or 0},
    }
    if metrics.reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": metrics.reasoning_tokens}
    return usage


def _random_hex() -> str:
    return secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class Stamps:
    """Where an answer's time and the ids the gateway makes come from: the system clock and
    random ids, or fixed ones, with which a translator's output is the same on every run."""

    clock: Callable[[], float] = time.time
    random_hex: Callable[[], str] = _random_hex

    def created(self) -> int:
        return int(self.clock())

    def completion_id(self, upstream_id: Any) -> str:
        """The caller's completion id: the upstream's own answer id when it sent one."""
        if isinstance(upstream_id, str) and upstream_id:
            return "chatcmpl-" + upstream_id
        return "chatcmpl-" + self.random_hex()

    def tool_call_id(self) -> str:
        """An id in OpenAI's form for a tool call the upstream left without one."""
        return "call_" + self.random_hex()


SYSTEM_STAMPS = Stamps()


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One entry of ``message.tool_calls``."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@dataclass(slots=True)
class AnswerMessage:
    """A whole answer as the caller sees it, built up from a provider's blocks or parts."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def to_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def completion_body(
    upstream_id: Any,
    model: str,
    message: AnswerMessage,
    finish: str,
    metrics: CallMetrics,
    stamps: Stamps = SYSTEM_STAMPS,
) -> bytes:
    """A non-streamed ``chat.completion`` (its id from the upstream's answer id, if any)."""
    return orjson.dumps(
        {
            "id": stamps.completion_id(upstream_id),
            "object": "chat.completion",
            "created": stamps.created(),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message.to_message(),
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": usage_object(metrics),
        }
    )


class ChunkWriter:
    """Writes ``chat.completion.chunk`` payloads of one answer: one id, one ``created``."""

    __slots__ = ("_head", "_role_sent")

    def __init__(self, upstream_id: Any, model: str, stamps: Stamps = SYSTEM_STAMPS) -> None:
        self._head = (
            b'{"id":'
            + orjson.dumps(stamps.completion_id(upstream_id))
            + b',"object":"chat.completion.chunk","created":'
            + str(stamps.created()).encode()
            + b',"model":'
            + orjson.dumps(model)
        )
        self._role_sent = False

    def delta(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        """A chunk with one choice; the first carries the assistant role."""
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return self._head + b',"choices":[' + orjson.dumps(choice) + b"]}"

    def usage(self, metrics: CallMetrics) -> bytes:
        """The closing usage chunk (``stream_options.include_usage``): no choices."""
        return self._head + b',"choices":[],"usage":' + orjson.dumps(usage_object(metrics)) + b"}"
