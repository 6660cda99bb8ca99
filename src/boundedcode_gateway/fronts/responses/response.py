"""A chat completion as a Responses API ``Response`` object, and the pieces of one that
the stream translator shares, so a streamed answer ends in the same object (pure).

The output items are those of one chat answer, in this order: a ``reasoning`` item
when the model reasoned (its text as ``reasoning_text`` content, no summary, and the
text sealed in ``encrypted_content``), a ``message`` item with one ``output_text``
part when there is text, another with a ``refusal`` part when the model refused
(OpenAI's chat ``refusal``), and a ``function_call`` item per tool call. The request's
own settings that a ``Response`` repeats come from the ``Echo`` made with the
request (request.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from boundedcode_gateway.fronts.responses.sealed import seal_reasoning
from boundedcode_gateway.fronts.responses.tools import NO_NAMES, ToolNames
from boundedcode_gateway.fronts.sealing import Sealer
from boundedcode_gateway.json_values import count_or_none
from boundedcode_gateway.wire.chat import SYSTEM_STAMPS, Stamps, text_of

JSON = dict[str, Any]

# finish reasons that leave a response incomplete, and the reason it gives
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


@dataclass(frozen=True, slots=True)
class Echo:
    """The request's settings a ``Response`` repeats (the gateway keeps no responses, so
    they come from the request itself)."""

    model: str
    instructions: str | None = None
    tools: list[JSON] = field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    reasoning: JSON | None = None
    text: JSON = field(default_factory=lambda: {"format": {"type": "text"}})
    metadata: JSON | None = None
    user: str | None = None
    truncation: str = "disabled"
    # the flat names of namespaced functions, to give their calls back by namespace
    names: ToolNames = NO_NAMES


@dataclass(frozen=True, slots=True)
class Frame:
    """One response's identity and echo: what every ``Response`` object of it repeats."""

    echo: Echo
    id: str
    created_at: int

    @classmethod
    def new(cls, echo: Echo, stamps: Stamps = SYSTEM_STAMPS) -> Frame:
        return cls(echo, "resp_" + stamps.random_hex(), stamps.created())

    def response(
        self,
        status: str,
        output: list[JSON],
        usage: JSON | None = None,
        *,
        error: JSON | None = None,
        incomplete: str | None = None,
        completed_at: int | None = None,
    ) -> JSON:
        """The ``Response`` object in ``status`` with this output."""
        echo = self.echo
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": completed_at,
            "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete is not None else None,
            "instructions": echo.instructions,
            "max_output_tokens": echo.max_output_tokens,
            "model": echo.model,
            "output": output,
            "parallel_tool_calls": echo.parallel_tool_calls,
            "reasoning": echo.reasoning,
            "temperature": echo.temperature,
            "text": echo.text,
            "tool_choice": echo.tool_choice,
            "tools": echo.tools,
            "top_p": echo.top_p,
            "truncation": echo.truncation,
            "usage": usage,
            "user": echo.user,
            "metadata": echo.metadata if echo.metadata is not None else {},
        }


def item_id(prefix: str, stamps: Stamps) -> str:
    """An output item's id: ``rs_``, ``msg_`` or ``fc_`` and random hex."""
    return f"{prefix}_{stamps.random_hex()}"


def final_status(finish_reason: Any) -> tuple[str, str | None]:
    """(the response's status, its incomplete reason) for a chat finish reason."""
    reason = INCOMPLETE_REASONS.get(finish_reason) if isinstance(finish_reason, str) else None
    return ("incomplete", reason) if reason is not None else ("completed", None)


def reasoning_item(rid: str, text: str, status: str, encrypted_content: str | None = None) -> JSON:
    item: JSON = {
        "id": rid,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }
    if encrypted_content is not None:
        item["encrypted_content"] = encrypted_content
    return item


def output_text(text: str) -> JSON:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(mid: str, text: str, status: str) -> JSON:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [output_text(text)],
    }


def refusal_part(text: str) -> JSON:
    return {"type": "refusal", "refusal": text}


def refusal_item(mid: str, text: str, status: str) -> JSON:
    """A refusal (OpenAI's chat ``refusal``) as a message of its own."""
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [refusal_part(text)],
    }


def function_call_item(
    fid: str, call_id: str, name: str, arguments: str, status: str, names: ToolNames = NO_NAMES
) -> JSON:
    """A call as the caller offered the tool: a flat name of a namespaced function is
    given back as its own name and ``namespace``, as OpenAI gives such a call."""
    own, namespace = names.called(name)
    item: JSON = {
        "id": fid,
        "type": "function_call",
        "call_id": call_id,
        "name": own,
        "arguments": arguments,
        "status": status,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def sealed(sealer: Sealer, model: str, reasoning: str) -> str:
    """The reasoning item's ``encrypted_content``."""
    return seal_reasoning(sealer, model, reasoning)


def from_chat_usage(usage: Any) -> JSON | None:
    """The Responses ``usage`` of a chat completion's ``usage``; None when it has none."""
    if not isinstance(usage, dict):
        return None
    prompt = count_or_none(usage.get("prompt_tokens")) or 0
    completion = count_or_none(usage.get("completion_tokens")) or 0
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    cached = reasoning = None
    if isinstance(prompt_details, dict):
        cached = count_or_none(prompt_details.get("cached_tokens"))
    if isinstance(completion_details, dict):
        reasoning = count_or_none(completion_details.get("reasoning_tokens"))
    return {
        "input_tokens": prompt,
        # the chat usage does not say what was written to a cache
        "input_tokens_details": {"cached_tokens": cached or 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning or 0},
        "total_tokens": prompt + completion,
    }


def _tool_call_parts(call: Any) -> tuple[str, str, str] | None:
    """(id, name, arguments) of a chat tool call; None for one that is not a function call."""
    if not isinstance(call, dict):
        return None
    function = call.get("function")
    if not isinstance(function, dict):
        return None
    call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
    return (
        call_id if isinstance(call_id, str) else "",
        name if isinstance(name, str) else "",
        arguments if isinstance(arguments, str) else "",
    )


def output_of_message(
    message: JSON,
    status: str,
    sealer: Sealer,
    model: str,
    stamps: Stamps = SYSTEM_STAMPS,
    names: ToolNames = NO_NAMES,
) -> list[JSON]:
    """The output items of one chat answer's message."""
    items: list[JSON] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        encrypted = sealed(sealer, model, reasoning)
        items.append(reasoning_item(item_id("rs", stamps), reasoning, status, encrypted))
    text = text_of(message.get("content"))
    if text:
        items.append(message_item(item_id("msg", stamps), text, status))
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        items.append(refusal_item(item_id("msg", stamps), refusal, status))
    for call in message.get("tool_calls") or ():
        parts = _tool_call_parts(call)
        if parts is not None:
            items.append(function_call_item(item_id("fc", stamps), *parts, status, names))
    return items


def from_chat_completion(
    completion: Any, frame: Frame, sealer: Sealer, stamps: Stamps = SYSTEM_STAMPS
) -> JSON:
    """The ``Response`` of a whole chat completion."""
    choices = completion.get("choices") if isinstance(completion, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") if isinstance(choice, dict) else None
    status, incomplete = final_status(choice.get("finish_reason") if choice else None)
    output = []
    if isinstance(message, dict):
        echo = frame.echo
        output = output_of_message(message, status, sealer, echo.model, stamps, echo.names)
    usage = from_chat_usage(completion.get("usage") if isinstance(completion, dict) else None)
    return frame.response(
        status, output, usage, incomplete=incomplete, completed_at=stamps.created()
    )
