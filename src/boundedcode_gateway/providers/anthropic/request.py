"""The caller's OpenAI request as an Anthropic Messages API request (pure).

Request in, request out: no I/O, no store access. Earlier thinking blocks reach
this module through ``ThinkingLookup``, which answers only for turns this
profile wrote; everything the caller sent as ``reasoning_content`` is ignored,
since Anthropic takes back only blocks it signed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from boundedcode_gateway.config import ThinkingSettings
from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.policy.structured import RequestedSchema, closed_schema
from boundedcode_gateway.providers.anthropic.versions import (
    NEWEST,
    SAMPLING_FIELDS,
    removed_fields,
)
from boundedcode_gateway.reasoning_store.keys import message_keys
from boundedcode_gateway.wire.chat import (
    SYSTEM_ROLES,
    arguments_object,
    content_parts,
    function_tools,
    image_url_of,
    max_output_tokens,
    parse_data_url,
    stop_sequences,
    system_text,
    text_of,
)

# the answer's limit when neither the caller nor the profile sets one (Anthropic requires one)
DEFAULT_MAX_TOKENS = 8192
# Anthropic's least thinking budget
MIN_THINKING_BUDGET = 1024
# manual-mode budgets for the caller's reasoning_effort
BUDGET_BY_EFFORT = {
    "minimal": 1024,
    "low": 2048,
    "medium": 8192,
    "high": 16384,
    "xhigh": 32768,
    "max": 65536,
}
# adaptive mode's output_config.effort for the caller's reasoning_effort
EFFORT_BY_EFFORT = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
    "max": "max",
}
# cache breakpoints Anthropic allows in one request
MAX_CACHE_BREAKPOINTS = 4
_EPHEMERAL = {"type": "ephemeral"}

# a turn's stored blocks: (position in the assistant content, the block as Anthropic sent it)
ThinkingBlocks = list[tuple[int, dict[str, Any]]]
ThinkingLookup = Callable[[Sequence[str]], ThinkingBlocks | None]


def no_thinking(keys: Sequence[str]) -> ThinkingBlocks | None:
    """A store that knows no turn."""
    return None


@dataclass(slots=True)
class Translated:
    """The Anthropic body, and what the translation changed on its own account."""

    body: dict[str, Any]
    adjustments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AnthropicTarget:
    """What the profile decides for every request: the model, its defaults, and the API
    version the request is written for."""

    model: str
    max_tokens: int | None = None
    thinking: ThinkingSettings | None = None
    api_version: str = NEWEST


# --------------------------------------------------------------------------- content


def _image_block(part: dict[str, Any], where: str) -> dict[str, Any]:
    url = image_url_of(part)
    if url is None:
        raise InvalidRequest(f"{where}: image_url has no url", param="messages")
    inline = parse_data_url(url)
    if inline is not None:
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": inline.media_type, "data": inline.data},
        }
    return {"type": "image", "source": {"type": "url", "url": url}}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A user or tool message's content as Anthropic text and image blocks."""
    blocks: list[dict[str, Any]] = []
    for part in content_parts(content):
        kind = part.get("type", "text")
        if kind == "text":
            if part.get("text"):
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            blocks.append(_image_block(part, where))
        else:
            raise InvalidRequest(
                f"{where}: content of type {kind!r} cannot be sent to Anthropic",
                param="messages",
            )
    return blocks


def _tool_result(msg: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = msg.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest(f"{where}: a tool message needs its tool_call_id", param="messages")
    content = msg.get("content")
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
    if isinstance(content, str):
        result["content"] = content
    else:
        result["content"] = _blocks(content, where)
    return result


def _assistant_blocks(msg: dict[str, Any], where: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    text = text_of(msg.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    for call in msg.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": arguments_object(function.get("arguments"), where),
            }
        )
    return blocks


def _with_thinking(blocks: list[dict[str, Any]], stored: ThinkingBlocks) -> list[dict[str, Any]]:
    """The turn's thinking blocks back at the positions Anthropic wrote them, verbatim."""
    out = list(blocks)
    for position, block in sorted(stored, key=lambda item: item[0]):
        out.insert(min(position, len(out)), block)
    return out


def _messages(messages: list[Any], lookup: ThinkingLookup) -> tuple[list[dict[str, Any]], int]:
    """The conversation as Anthropic turns (same-role turns merged) and how many turns got
    their thinking back."""
    turns: list[dict[str, Any]] = []
    replayed = 0
    for i, msg in enumerate(messages):
        role = msg.get("role")
        where = f"messages[{i}]"
        if role in SYSTEM_ROLES:
            continue
        if role == "assistant":
            blocks = _assistant_blocks(msg, where)
            stored = lookup(message_keys(messages, i))
            if stored:
                blocks = _with_thinking(blocks, stored)
                replayed += 1
            turn_role = "assistant"
        elif role == "tool":
            blocks = [_tool_result(msg, where)]
            turn_role = "user"
        else:
            blocks = _blocks(msg.get("content"), where)
            turn_role = "user"
        if not blocks:
            continue
        if turns and turns[-1]["role"] == turn_role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": turn_role, "content": blocks})
    return turns, replayed


# --------------------------------------------------------------------------- tools


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = []
    for function in function_tools(body):
        tool: dict[str, Any] = {
            "name": function["name"],
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            tool["description"] = function["description"]
        if function.get("strict") is True:
            tool["strict"] = True
        tools.append(tool)
    return tools


def _tool_choice(body: dict[str, Any]) -> dict[str, Any] | None:
    choice = body.get("tool_choice")
    out: dict[str, Any] | None
    if choice == "none":
        out = {"type": "none"}
    elif choice == "required":
        out = {"type": "any"}
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        out = {"type": "tool", "name": name} if isinstance(name, str) else {"type": "auto"}
    elif choice == "auto":
        out = {"type": "auto"}
    else:
        out = None
    if body.get("parallel_tool_calls") is False and (out is None or out["type"] != "none"):
        out = {**(out or {"type": "auto"}), "disable_parallel_tool_use": True}
    return out


# --------------------------------------------------------------------------- thinking


def _thinking(
    body: dict[str, Any], target: AnthropicTarget, max_tokens: int, adjustments: dict[str, Any]
) -> tuple[dict[str, Any] | None, str | None]:
    """``thinking`` and ``output_config.effort``: the caller's reasoning_effort, else the
    profile's setting."""
    settings = target.thinking or ThinkingSettings(mode="off")
    effort = body.get("reasoning_effort")
    if effort == "none":
        return None, None
    if settings.mode == "adaptive":
        level = EFFORT_BY_EFFORT.get(effort) if isinstance(effort, str) else None
        level = level or (EFFORT_BY_EFFORT.get(settings.level) if settings.level else None)
        return {"type": "adaptive"}, level
    if isinstance(effort, str) and effort in BUDGET_BY_EFFORT:
        budget = BUDGET_BY_EFFORT[effort]
    elif settings.mode == "enabled":
        budget = settings.budget_tokens or BUDGET_BY_EFFORT["medium"]
    else:
        return None, None
    # the budget must stay below max_tokens
    budget = min(budget, max_tokens - 1)
    if budget < MIN_THINKING_BUDGET:
        adjustments["thinking"] = "off: max_tokens leaves no room for the least budget"
        return None, None
    return {"type": "enabled", "budget_tokens": budget}, None


# --------------------------------------------------------------------------- caching


def _mark_cache(
    system: list[dict[str, Any]], tools: list[dict[str, Any]], turns: list[dict[str, Any]]
) -> None:
    """Cache breakpoints on the tools, the system prompt, the last turn and the user turn
    before it: the next request of a growing conversation reads everything up to the
    latest of them from Anthropic's cache."""
    if tools:
        tools[-1]["cache_control"] = _EPHEMERAL
    if system:
        system[-1]["cache_control"] = _EPHEMERAL
    left = MAX_CACHE_BREAKPOINTS - bool(tools) - bool(system)
    marked = 0
    for turn in reversed(turns):
        if marked >= min(left, 2):
            break
        if marked == 1 and turn["role"] != "user":
            continue
        for block in reversed(turn["content"]):
            # thinking blocks cannot carry a breakpoint
            if block.get("type") not in ("thinking", "redacted_thinking"):
                block["cache_control"] = _EPHEMERAL
                marked += 1
                break


# --------------------------------------------------------------------------- the request


def _sampling_value(key: str, value: Any) -> Any:
    if key == "temperature":
        # Anthropic's range ends at 1, OpenAI's at 2
        return min(float(value), 1.0)
    if key == "top_k" and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise InvalidRequest("top_k: a whole number of 0 or more is required", param="top_k")
    return value


def _sampling(
    body: dict[str, Any],
    out: dict[str, Any],
    target: AnthropicTarget,
    allowed: bool,
    adjustments: dict[str, Any],
) -> None:
    """The caller's sampling parameters, less those the API version removed (noted with
    the version) and, when ``allowed`` is false, the rest (noted as ``sampling_dropped``)."""
    removed = removed_fields(target.api_version)
    by_version: list[str] = []
    dropped: list[str] = []
    for key in SAMPLING_FIELDS:
        value = body.get(key)
        if value is None:
            continue
        if key in removed:
            by_version.append(key)
        elif not allowed:
            dropped.append(key)
        else:
            out[key] = _sampling_value(key, value)
    if by_version:
        adjustments["dropped_for_api_version"] = {
            "version": target.api_version,
            "fields": by_version,
        }
    if dropped:
        adjustments["sampling_dropped"] = dropped
    stops = stop_sequences(body.get("stop"))
    if stops:
        out["stop_sequences"] = stops


def _check_unsupported(body: dict[str, Any]) -> None:
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        raise InvalidRequest("Anthropic answers one choice per request (n must be 1)", param="n")


def to_anthropic_request(
    body: dict[str, Any],
    target: AnthropicTarget,
    *,
    stream: bool,
    lookup: ThinkingLookup = no_thinking,
    schema: RequestedSchema | None = None,
    sampling: bool = True,
) -> Translated:
    """The Messages API body for an OpenAI chat-completions body, written for the target's
    API version; ``sampling=False`` leaves out temperature, top_p and top_k (a model that
    refuses them)."""
    _check_unsupported(body)
    adjustments: dict[str, Any] = {}
    messages: list[Any] = body["messages"]
    turns, replayed = _messages(messages, lookup)
    if replayed:
        adjustments["thinking_blocks_replayed"] = replayed
    max_tokens = max_output_tokens(body) or target.max_tokens or DEFAULT_MAX_TOKENS
    out: dict[str, Any] = {"model": target.model, "max_tokens": max_tokens}
    text = system_text(messages)
    system = [{"type": "text", "text": text}] if text else []
    tools = _tools(body)
    thinking, effort = _thinking(body, target, max_tokens, adjustments)
    _mark_cache(system, tools, turns)
    if system:
        out["system"] = system
    out["messages"] = turns
    if tools:
        out["tools"] = tools
        choice = _tool_choice(body)
        if choice is not None and thinking is not None and choice["type"] in ("any", "tool"):
            # Anthropic refuses a forced tool while the model thinks
            adjustments["tool_choice"] = f"{choice['type']}→auto"
            choice = {**choice, "type": "auto"}
            choice.pop("name", None)
        if choice is not None:
            out["tool_choice"] = choice
    if thinking is not None:
        out["thinking"] = thinking
    # Anthropic refuses changed sampling while the model thinks
    _sampling(body, out, target, sampling and thinking is None, adjustments)
    output_config: dict[str, Any] = {}
    if effort is not None:
        output_config["effort"] = effort
    if schema is not None:
        output_config["format"] = {"type": "json_schema", "schema": closed_schema(schema.schema)}
    if output_config:
        out["output_config"] = output_config
    user = body.get("user")
    if isinstance(user, str) and user:
        out["metadata"] = {"user_id": user}
    if stream:
        out["stream"] = True
    return Translated(out, adjustments)
