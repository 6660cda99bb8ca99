"""A Messages API request as the chat-completions body the gateway answers (pure).

Every field is taken, ignored or refused, by name: what the chat form can carry is
mapped to it; what changes nothing in the answer the gateway gives is ignored
(``IGNORED``); anything else, a field Anthropic added later included, is a 400
naming it, never dropped in silence. docs/fronts.md lists each.

Thinking blocks the caller gives back go back as the assistant turn's
``reasoning_content`` only when their signature is the gateway's for the profile the
request names (``verify``, signature.py): the text is then exactly what that model
wrote. Any other thinking block, and every
``redacted_thinking`` block, is dropped; the reasoning store still restores the
turn's reasoning where the profile wrote it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from boundedcode_gateway import discard
from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.fronts.messages.signature import signed_text
from boundedcode_gateway.json_values import is_int, is_number

VERSION_HEADER = "anthropic-version"
# the versions of the Messages API this front speaks
VERSIONS = frozenset({"2023-06-01"})

# top-level fields that change nothing in the answer the gateway gives
IGNORED = frozenset({"service_tier", "cache_control", "inference_geo", "container"})
_TAKEN = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "metadata",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "output_format",
        "context_management",
    }
)
_TOOL_TAKEN = frozenset({"name", "description", "input_schema", "strict", "type"})
# a tool's keys that change nothing but how Anthropic caches or streams it
_TOOL_IGNORED = frozenset({"cache_control", "eager_input_streaming"})

# reasoning_effort for a thinking budget: the largest whose budget (Anthropic's adapter,
# BUDGET_BY_EFFORT) the caller's reaches; the three levels every reasoning API takes
_EFFORT_BUDGETS = (("high", 16384), ("medium", 8192))
_LOWEST_EFFORT = "low"
# output_config.effort as reasoning_effort
_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
# marks a tool result Anthropic's caller flagged as an error (the chat form has no flag)
ERROR_MARK = "Error: "

# (signed text, signature) → whether the gateway signed that text
Verify = Callable[[str, str], bool]


def _invalid(param: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {problem}", param=param, code="invalid_value")


def _unsupported(param: str, what: str) -> InvalidRequest:
    return InvalidRequest(
        f"{param}: {what} is not supported by this gateway (docs/fronts.md)",
        param=param,
        code="unsupported_field",
    )


def check_headers(headers: Mapping[str, str]) -> None:
    """``anthropic-version`` names a version this front speaks; no discard event is asked
    for (the Messages API has no form for it)."""
    version = headers.get(VERSION_HEADER)
    if version is None:
        raise InvalidRequest(
            f"{VERSION_HEADER}: header is required", param=VERSION_HEADER, code="missing_header"
        )
    if version not in VERSIONS:
        known = ", ".join(sorted(VERSIONS))
        raise InvalidRequest(
            f"{VERSION_HEADER}: unknown version '{version[:40]}' (this gateway speaks {known})",
            param=VERSION_HEADER,
            code="invalid_value",
        )
    if discard.header_declares(headers.get(discard.HEADER_NAME.lower())):
        raise _unsupported(discard.HEADER_NAME, "the discard event")


# --------------------------------------------------------------------------- content


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source, dict):
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise _invalid(f"{where}.source", "a base64 image needs media_type and data")
        url = f"data:{media};base64,{data}"
    elif kind == "url" and isinstance(source, dict):
        link = source.get("url")
        if not isinstance(link, str):
            raise _invalid(f"{where}.source.url", "a string is required")
        url = link
    else:
        raise _unsupported(f"{where}.source.type", f"an image source of type {kind!r}")
    return {"type": "image_url", "image_url": {"url": url}}


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _invalid(f"{where}.text", "a string is required")
    return text


def _block_type(block: Any, where: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise _invalid(f"{where}.type", "each content block needs a string type")
    return kind


def _blocks(content: Any, where: str) -> list[Any]:
    if not isinstance(content, list):
        raise _invalid(where, "a string or an array of content blocks is required")
    return content


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"{where}.tool_use_id", "a string is required")
    content = block.get("content", "")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        text: str | None = content
    else:
        for j, inner in enumerate(_blocks(content, f"{where}.content")):
            inner_where = f"{where}.content.{j}"
            kind = _block_type(inner, inner_where)
            if kind == "text":
                parts.append({"type": "text", "text": _text(inner, inner_where)})
            elif kind == "image":
                parts.append(_image(inner, inner_where))
            else:
                raise _unsupported(f"{inner_where}.type", f"a tool result block of type {kind!r}")
        if not parts:
            text = ""
        elif len(parts) == 1 and parts[0]["type"] == "text":
            text = parts[0]["text"]  # one text block is the plain text it holds
        else:
            text = None
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise _invalid(f"{where}.is_error", "a boolean is required")
    out: Any
    if text is not None:
        out = (ERROR_MARK + text if text else ERROR_MARK.strip()) if is_error else text
    else:
        out = [{"type": "text", "text": ERROR_MARK.strip()}, *parts] if is_error else parts
    return {"role": "tool", "tool_call_id": call_id, "content": out}


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    """A user turn as chat messages: its tool results each a ``tool`` message, in order,
    the rest in ``user`` messages between them."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    blocks = _blocks(content, f"{where}.content")
    if not blocks:
        raise _invalid(f"{where}.content", "at least one content block is required")
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        block_where = f"{where}.content.{j}"
        kind = _block_type(block, block_where)
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, block_where)})
        elif kind == "image":
            parts.append(_image(block, block_where))
        elif kind == "tool_result":
            if parts:
                out.append({"role": "user", "content": parts})
                parts = []
            out.append(_tool_result(block, block_where))
        elif kind in ("tool_use", "thinking", "redacted_thinking"):
            raise _invalid(f"{block_where}.type", f"a {kind} block belongs in an assistant turn")
        else:
            raise _unsupported(f"{block_where}.type", f"a content block of type {kind!r}")
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name = block.get("id"), block.get("name")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"{where}.id", "a string is required")
    if not isinstance(name, str) or not name:
        raise _invalid(f"{where}.name", "a string is required")
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise _invalid(f"{where}.input", "an object is required")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }


def _signed_thinking(block: dict[str, Any], profile: str, verify: Verify) -> list[str]:
    """A thinking block's text when the gateway signed it for ``profile``, else nothing.
    An empty text
    is nothing too: "" would stand for "no reasoning", which breaks a local server's
    cache as much as none, while the store restores what the model wrote."""
    thinking, signature = block.get("thinking"), block.get("signature")
    if not isinstance(thinking, str) or not thinking or not isinstance(signature, str):
        return []
    return [thinking] if verify(signed_text(profile, thinking), signature) else []


def _assistant(content: Any, where: str, profile: str, verify: Verify) -> dict[str, Any] | None:
    """An assistant turn as one chat message; None when nothing of it is left (only
    thinking the gateway did not sign)."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(_blocks(content, f"{where}.content")):
        block_where = f"{where}.content.{j}"
        kind = _block_type(block, block_where)
        if kind == "text":
            texts.append(_text(block, block_where))
        elif kind == "tool_use":
            calls.append(_tool_call(block, block_where))
        elif kind == "thinking":
            reasoning.extend(_signed_thinking(block, profile, verify))
        elif kind == "redacted_thinking":
            continue
        elif kind in ("tool_result", "image"):
            raise _invalid(f"{block_where}.type", f"a {kind} block belongs in a user turn")
        else:
            raise _unsupported(f"{block_where}.type", f"a content block of type {kind!r}")
    if not texts and not calls and not reasoning:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message


def _system(system: Any) -> dict[str, Any] | None:
    """The system prompt as one system message: a string as it is, text blocks as text
    parts (so a volatile first block can be taken out whole, and each server joins them
    as its template does)."""
    if isinstance(system, str):
        return {"role": "system", "content": system} if system else None
    parts = []
    for i, block in enumerate(_blocks(system, "system")):
        where = f"system.{i}"
        if _block_type(block, where) != "text":
            raise _invalid(f"{where}.type", "the system prompt takes text blocks only")
        parts.append({"type": "text", "text": _text(block, where)})
    if not parts:
        return None
    if len(parts) == 1:
        return {"role": "system", "content": parts[0]["text"]}
    return {"role": "system", "content": parts}


def _messages(request: dict[str, Any], profile: str, verify: Verify) -> list[dict[str, Any]]:
    messages = request.get("messages")
    if messages is None:
        raise InvalidRequest(
            "messages: Field required", param="messages", code="missing_required_parameter"
        )
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "a non-empty array of messages is required")
    out: list[dict[str, Any]] = []
    system = _system(request["system"]) if request.get("system") is not None else None
    if system is not None:
        out.append(system)
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise _invalid(where, "an object is required")
        role, content = message.get("role"), message.get("content")
        if content is None:
            raise InvalidRequest(
                f"{where}.content: Field required",
                param=f"{where}.content",
                code="missing_required_parameter",
            )
        if role == "user":
            out.extend(_user(content, where))
        elif role == "assistant":
            turn = _assistant(content, where, profile, verify)
            if turn is not None:
                out.append(turn)
        else:
            raise _invalid(f"{where}.role", "Input should be 'user' or 'assistant'")
    return out


# --------------------------------------------------------------------------- tools


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise _invalid(where, "an object is required")
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise _unsupported(f"{where}.type", f"the server tool {kind!r}")
    unknown = sorted(k for k in tool if k not in _TOOL_TAKEN and k not in _TOOL_IGNORED)
    if unknown:
        raise _unsupported(f"{where}.{unknown[0]}", "the tool field " + ", ".join(unknown))
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str) or not name:
        raise _invalid(f"{where}.name", "a string is required")
    if not isinstance(schema, dict):
        raise _invalid(f"{where}.input_schema", "an object is required")
    function: dict[str, Any] = {"name": name}
    description = tool.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise _invalid(f"{where}.description", "a string is required")
        function["description"] = description
    function["parameters"] = schema
    strict = tool.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _invalid(f"{where}.strict", "a boolean is required")
    if strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def _tools(request: dict[str, Any], out: dict[str, Any]) -> None:
    tools = request.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _invalid("tools", "an array is required")
        if tools:
            out["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(tools)]
    choice = request.get("tool_choice")
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or not isinstance(kind, str):
        raise _invalid("tool_choice.type", "a string is required")
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise _invalid("tool_choice.name", "a string is required")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif kind in _TOOL_CHOICE:
        out["tool_choice"] = _TOOL_CHOICE[kind]
    else:
        raise _invalid("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")
    serial = choice.get("disable_parallel_tool_use")
    if serial is not None and not isinstance(serial, bool):
        raise _invalid("tool_choice.disable_parallel_tool_use", "a boolean is required")
    if serial:
        out["parallel_tool_calls"] = False


# --------------------------------------------------------------------------- options


def _check_context_management(request: dict[str, Any]) -> None:
    """``context_management`` is taken only where it changes nothing: edits that clear
    thinking but keep all of it (what Claude Code sends whenever it thinks). Any other
    edit would have the context cut, which the gateway does not do."""
    config = request.get("context_management")
    if config is None:
        return
    edits = config.get("edits") if isinstance(config, dict) else None
    if not isinstance(config, dict) or set(config) - {"edits"} or not isinstance(edits, list):
        raise _unsupported("context_management", "context management other than edits")
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        keeps_all = isinstance(edit, dict) and edit.get("keep") == "all"
        if not (isinstance(kind, str) and kind.startswith("clear_thinking_") and keeps_all):
            raise _unsupported(
                f"context_management.edits.{i}",
                f"the context edit {kind!r} (only clearing thinking with keep 'all' is taken)",
            )


def _effort_of_budget(budget: int) -> str:
    for effort, least in _EFFORT_BUDGETS:
        if budget >= least:
            return effort
    return _LOWEST_EFFORT


def _reasoning(request: dict[str, Any], config: dict[str, Any], out: dict[str, Any]) -> None:
    """``reasoning_effort``: "none" for thinking turned off; else the caller's effort,
    else its thinking budget; unset (the model's own default) otherwise."""
    thinking = request.get("thinking")
    budget: int | None = None
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind == "disabled":
            out["reasoning_effort"] = "none"
            return
        if kind == "enabled" and isinstance(thinking, dict):
            budget = thinking.get("budget_tokens")
            if not is_int(budget) or budget < 0:
                raise _invalid("thinking.budget_tokens", "a non-negative integer is required")
        elif kind != "adaptive":
            raise _invalid("thinking.type", "Input should be 'enabled', 'adaptive' or 'disabled'")
    effort = config.get("effort")
    if effort is not None:
        if effort not in _EFFORT:
            raise _invalid(
                "output_config.effort", "Input should be 'low', 'medium', 'high', 'xhigh' or 'max'"
            )
        out["reasoning_effort"] = _EFFORT[effort]
    elif budget is not None:
        out["reasoning_effort"] = _effort_of_budget(budget)


def _format(fmt: Any, where: str) -> dict[str, Any]:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    if kind != "json_schema":
        raise _unsupported(f"{where}.type", f"an output format of type {kind!r}")
    if not isinstance(schema, dict):
        raise _invalid(f"{where}.schema", "an object is required")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def _output(request: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """``output_config`` (and the older ``output_format``): the answer's JSON schema."""
    config = request.get("output_config")
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise _invalid("output_config", "an object is required")
    unknown = sorted(k for k in config if k not in ("effort", "format"))
    if unknown:
        raise _unsupported(f"output_config.{unknown[0]}", "the field")
    fmt = config.get("format")
    if fmt is not None:
        out["response_format"] = _format(fmt, "output_config.format")
    elif request.get("output_format") is not None:
        out["response_format"] = _format(request["output_format"], "output_format")
    return config


def _number(request: dict[str, Any], name: str, out: dict[str, Any]) -> None:
    value = request.get(name)
    if value is None:
        return
    if not is_number(value):
        raise _invalid(name, "a number is required")
    out[name] = value


def _sampling(request: dict[str, Any], out: dict[str, Any]) -> None:
    _number(request, "temperature", out)
    _number(request, "top_p", out)
    top_k = request.get("top_k")
    if top_k is not None:
        if not is_int(top_k):
            raise _invalid("top_k", "an integer is required")
        out["top_k"] = top_k
    stops = request.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _invalid("stop_sequences", "an array of strings is required")
        if stops:
            out["stop"] = stops


def _max_tokens(request: dict[str, Any], out: dict[str, Any], counting: bool) -> None:
    value = request.get("max_tokens")
    if value is None:
        if counting:
            return
        raise InvalidRequest(
            "max_tokens: Field required", param="max_tokens", code="missing_required_parameter"
        )
    if not is_int(value) or value < 0:
        raise _invalid("max_tokens", "a non-negative integer is required")
    # OpenAI's current name for it, which llama.cpp reads too
    out["max_completion_tokens"] = value


def _metadata(request: dict[str, Any], out: dict[str, Any]) -> None:
    metadata = request.get("metadata")
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise _invalid("metadata", "an object is required")
    user = metadata.get("user_id")
    if user is not None:
        if not isinstance(user, str):
            raise _invalid("metadata.user_id", "a string is required")
        if user:
            out["user"] = user


def _stream(request: dict[str, Any], out: dict[str, Any]) -> None:
    stream = request.get("stream")
    if stream is None:
        return
    if not isinstance(stream, bool):
        raise _invalid("stream", "a boolean is required")
    if stream:
        out["stream"] = True
        # message_delta carries the usage
        out["stream_options"] = {"include_usage": True}


def to_chat_body(request: Any, verify: Verify, *, counting: bool = False) -> dict[str, Any]:
    """The chat-completions body for a Messages request (``counting``: one of
    ``count_tokens``, which has no ``max_tokens``); an ``InvalidRequest`` naming the field
    for one it refuses."""
    if not isinstance(request, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_type")
    unknown = sorted(k for k in request if k not in _TAKEN and k not in IGNORED)
    if unknown:
        raise _unsupported(unknown[0], "the field " + ", ".join(repr(k) for k in unknown))
    model = request.get("model")
    if model is None:
        raise InvalidRequest(
            "model: Field required", param="model", code="missing_required_parameter"
        )
    if not isinstance(model, str) or not model:
        raise _invalid("model", "a non-empty string is required")
    _check_context_management(request)
    out: dict[str, Any] = {"model": model, "messages": _messages(request, model, verify)}
    _max_tokens(request, out, counting)
    _sampling(request, out)
    _tools(request, out)
    config = _output(request, out)
    _reasoning(request, config, out)
    _metadata(request, out)
    _stream(request, out)
    return out
