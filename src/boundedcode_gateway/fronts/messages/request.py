"""A Messages API request as the chat-completions body the gateway answers (pure).

Every field is taken, ignored or refused, by name: what the chat form can carry is
mapped to it; what changes nothing in the answer the gateway gives is ignored
(``IGNORED``); a server tool the gateway does not run is left out with a note in the
record's ``adjustments``; what would change the answer if served wrongly is a 400
naming it, and a field Anthropic does not define is refused as Anthropic refuses it
("Extra inputs are not permitted"), never dropped in silence. The refusals are worded
as Anthropic words each case, so that its clients' fallbacks read them. The rules
differ by API version (versions.py). docs/fronts.md lists each field.

System messages inside ``messages`` (Anthropic's mid-conversation system messages)
stay system messages in place; policy/mid_system.py folds them for an upstream whose
template takes a system message only at the start.

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
from boundedcode_gateway.fronts.messages.tools import to_chat_tools
from boundedcode_gateway.fronts.messages.versions import RequestRules, request_rules
from boundedcode_gateway.fronts.messages.wording import (
    expected_tags,
    extra_input,
    field_required,
    input_should_be,
    invalid,
    not_served,
    wrong_type,
)
from boundedcode_gateway.json_values import is_int, is_number

# top-level fields that change nothing in the answer the gateway gives: how Anthropic
# bills, routes, caches or diagnoses a request, which workspace or user it is for, a
# token budget the model paces itself by, a fallback model or credit, server-side
# compaction (the gateway answers an overflow as Anthropic does, and the client compacts)
IGNORED = frozenset(
    {
        "service_tier",
        "cache_control",
        "inference_geo",
        "container",
        "diagnostics",
        "speed",
        "user_profile_id",
        "workspace_id",
        "billing_policy",
        "fallbacks",
        "fallback_credit_token",
        "compaction",
    }
)
# a request without headers to read (the oldest version's rules)
DEFAULT_RULES = RequestRules()
# the sampling parameters, fields of 2023-06-01 only
SAMPLING = ("temperature", "top_p", "top_k")
_TAKEN = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        *SAMPLING,
        "stop_sequences",
        "stream",
        "metadata",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "output_format",
        "context_management",
        "mcp_servers",
        "thread",
    }
)
# the content blocks Anthropic's Messages API defines in a message
_BLOCK_TAGS = (
    "text",
    "image",
    "document",
    "search_result",
    "thinking",
    "redacted_thinking",
    "tool_use",
    "tool_result",
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "container_upload",
)
# in 2026-10-21 an assistant message has its own list, without documents
_ASSISTANT_TAGS = tuple(t for t in _BLOCK_TAGS if t != "document")
_TOOL_RESULT_TAGS = ("text", "image", "search_result", "document", "tool_reference")
_ROLES = ("user", "assistant", "system")

# reasoning_effort for a thinking budget: the largest whose budget (Anthropic's adapter,
# BUDGET_BY_EFFORT) the caller's reaches; the three levels every reasoning API takes
_EFFORT_BUDGETS = (("high", 16384), ("medium", 8192))
_LOWEST_EFFORT = "low"
# output_config.effort as reasoning_effort
_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
# marks a tool result Anthropic's caller flagged as an error (the chat form has no flag)
ERROR_MARK = "Error: "

# (signed text, signature) → whether the gateway signed that text
Verify = Callable[[str, str], bool]


def check_headers(headers: Mapping[str, str]) -> RequestRules:
    """The rules the request is read by (its ``anthropic-version`` and
    ``anthropic-beta``); no discard event is asked for (the Messages API has no form
    for it)."""
    rules = request_rules(headers)
    if discard.header_declares(headers.get(discard.HEADER_NAME.lower())):
        raise not_served(discard.HEADER_NAME, "the discard event")
    return rules


# --------------------------------------------------------------------------- content


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise wrong_type(path, "object")
    return value


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if value is None:
        raise field_required(f"{where}.{key}")
    if not isinstance(value, str):
        raise wrong_type(f"{where}.{key}", "string")
    return value


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = _object(block.get("source"), f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media = _string(source, "media_type", f"{where}.source")
        url = f"data:{media};base64,{_string(source, 'data', f'{where}.source')}"
    elif kind == "url":
        url = _string(source, "url", f"{where}.source")
    elif kind == "file":
        raise not_served(f"{where}.source.type", "an image from the Files API")
    else:
        raise expected_tags(f"{where}.source", str(kind), ("base64", "url", "file"))
    return {"type": "image_url", "image_url": {"url": url}}


def _text(block: dict[str, Any], where: str, user: bool, rules: RequestRules) -> str:
    text = _string(block, "text", where)
    citations = block.get("citations")
    if user and rules.strict_blocks and citations:
        # 2026-10-21: a user's text cites nothing
        raise invalid(
            f"{where}.citations",
            f"citations are not allowed on a text block in a user message in API version"
            f" {rules.version}",
        )
    return text


def _block_type(block: Any, where: str) -> str:
    kind = _object(block, where).get("type")
    if kind is None:
        raise field_required(f"{where}.type")
    if not isinstance(kind, str):
        raise wrong_type(f"{where}.type", "string")
    return kind


def _blocks(content: Any, where: str) -> list[Any]:
    if not isinstance(content, list):
        raise wrong_type(where, "array")
    return content


def _document(block: dict[str, Any], where: str) -> str:
    """A document whose text the chat form can carry (a plain-text source, or text
    blocks), as that text under its title and context; a PDF or a file is not."""
    source = _object(block.get("source"), f"{where}.source")
    kind = source.get("type")
    if kind == "text":
        body = _string(source, "data", f"{where}.source")
    elif kind == "content":
        inner = source.get("content")
        if isinstance(inner, str):
            body = inner
        else:
            parts = []
            for j, part in enumerate(_blocks(inner, f"{where}.source.content")):
                part_where = f"{where}.source.content.{j}"
                if _block_type(part, part_where) != "text":
                    raise not_served(f"{part_where}.type", "a document's non-text block")
                parts.append(_string(part, "text", part_where))
            body = "\n".join(parts)
    elif kind in ("base64", "url", "file"):
        raise not_served(f"{where}.source.type", f"a document source of type '{kind}' (PDF)")
    else:
        tags = ("base64", "text", "content", "url", "file")
        raise expected_tags(f"{where}.source", str(kind), tags)
    head = [
        value for key in ("title", "context") if isinstance(value := block.get(key), str) and value
    ]
    return "\n".join([*head, body]) if head else body


def _search_result(block: dict[str, Any], where: str, rules: RequestRules) -> str:
    """A search result as the text the model reads: title, source, then its text."""
    title, source = _string(block, "title", where), _string(block, "source", where)
    texts = []
    for j, part in enumerate(_blocks(block.get("content"), f"{where}.content")):
        part_where = f"{where}.content.{j}"
        if _block_type(part, part_where) != "text":
            raise expected_tags(f"{part_where}", str(part.get("type")), ("text",))
        texts.append(_text(part, part_where, True, rules))
    return "\n".join([title, source, *texts])


def _tool_result(block: dict[str, Any], where: str, rules: RequestRules) -> dict[str, Any]:
    call_id = _string(block, "tool_use_id", where)
    content = block.get("content", "")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        text: str | None = content
    else:
        for j, inner in enumerate(_blocks(content, f"{where}.content")):
            inner_where = f"{where}.content.{j}"
            kind = _block_type(inner, inner_where)
            if kind == "text":
                parts.append({"type": "text", "text": _text(inner, inner_where, True, rules)})
            elif kind == "image":
                parts.append(_image(inner, inner_where))
            elif kind == "search_result":
                parts.append({"type": "text", "text": _search_result(inner, inner_where, rules)})
            elif kind == "document":
                parts.append({"type": "text", "text": _document(inner, inner_where)})
            elif kind == "tool_reference":
                # what a tool search found: the tool is loaded already (tools.py)
                name = _string(inner, "tool_name", inner_where)
                parts.append({"type": "text", "text": f"Tool loaded: {name}"})
            else:
                raise expected_tags(inner_where, kind, _TOOL_RESULT_TAGS)
        if not parts:
            text = ""
        elif len(parts) == 1 and parts[0]["type"] == "text":
            text = parts[0]["text"]  # one text block is the plain text it holds
        else:
            text = None
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise wrong_type(f"{where}.is_error", "boolean")
    out: Any
    if text is not None:
        out = (ERROR_MARK + text if text else ERROR_MARK.strip()) if is_error else text
    else:
        out = [{"type": "text", "text": ERROR_MARK.strip()}, *parts] if is_error else parts
    return {"role": "tool", "tool_call_id": call_id, "content": out}


def _not_here(kind: str, where: str) -> InvalidRequest:
    """A block Anthropic defines that this turn or this gateway does not take."""
    if kind in ("tool_use", "thinking", "redacted_thinking"):
        return invalid(f"{where}.type", f"a {kind} block belongs in an assistant turn")
    if kind in ("tool_result", "image", "search_result"):
        return invalid(f"{where}.type", f"a {kind} block belongs in a user turn")
    if kind in _BLOCK_TAGS:
        # a server tool's call or result, or a container upload: what only Anthropic's
        # own servers run
        return not_served(f"{where}.type", f"a content block of type '{kind}'")
    return expected_tags(where, kind, _BLOCK_TAGS)


def _empty(where: str) -> InvalidRequest:
    return invalid(
        where,
        "all messages must have non-empty content except for the optional final assistant message",
    )


def _user(content: Any, where: str, rules: RequestRules) -> list[dict[str, Any]]:
    """A user turn as chat messages: its tool results each a ``tool`` message, in order,
    the rest in ``user`` messages between them."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    blocks = _blocks(content, f"{where}.content")
    if not blocks:
        raise _empty(where)
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        block_where = f"{where}.content.{j}"
        kind = _block_type(block, block_where)
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, block_where, True, rules)})
        elif kind == "image":
            parts.append(_image(block, block_where))
        elif kind == "document":
            parts.append({"type": "text", "text": _document(block, block_where)})
        elif kind == "search_result":
            parts.append({"type": "text", "text": _search_result(block, block_where, rules)})
        elif kind == "tool_result":
            if parts:
                out.append({"role": "user", "content": parts})
                parts = []
            out.append(_tool_result(block, block_where, rules))
        else:
            raise _not_here(kind, block_where)
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name = _string(block, "id", where), _string(block, "name", where)
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise wrong_type(f"{where}.input", "object")
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


def _assistant(
    content: Any, where: str, profile: str, verify: Verify, rules: RequestRules
) -> dict[str, Any] | None:
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
            texts.append(_text(block, block_where, False, rules))
        elif kind == "tool_use":
            calls.append(_tool_call(block, block_where))
        elif kind == "thinking":
            reasoning.extend(_signed_thinking(block, profile, verify))
        elif kind == "redacted_thinking":
            continue
        elif kind == "document" and rules.strict_blocks:
            # 2026-10-21: an assistant message's blocks do not include documents
            raise expected_tags(block_where, kind, _ASSISTANT_TAGS)
        elif kind == "document":
            texts.append(_document(block, block_where))
        else:
            raise _not_here(kind, block_where)
    if not texts and not calls and not reasoning:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message


def _system(system: Any, where: str = "system") -> dict[str, Any] | None:
    """A system prompt as one system message: a string as it is, text blocks as text
    parts (so a volatile first block can be taken out whole, and each server joins them
    as its template does)."""
    if isinstance(system, str):
        return {"role": "system", "content": system} if system else None
    parts = []
    for i, block in enumerate(_blocks(system, where)):
        block_where = f"{where}.{i}"
        kind = _block_type(block, block_where)
        if kind != "text":
            raise expected_tags(block_where, kind, ("text",))
        parts.append({"type": "text", "text": _string(block, "text", block_where)})
    if not parts:
        return None
    if len(parts) == 1:
        return {"role": "system", "content": parts[0]["text"]}
    return {"role": "system", "content": parts}


def _message(
    message: Any, where: str, profile: str, verify: Verify, rules: RequestRules
) -> list[dict[str, Any]]:
    """One message of ``messages`` as the chat messages it becomes."""
    role = _object(message, where).get("role")
    content = message.get("content")
    if role is None:
        raise field_required(f"{where}.role")
    if content is None:
        raise field_required(f"{where}.content")
    if role == "user":
        return _user(content, where, rules)
    if role == "assistant":
        turn = _assistant(content, where, profile, verify, rules)
    elif role == "system":
        # a system message where it comes (policy/mid_system.py folds it for a
        # template that takes one only at the start)
        if isinstance(content, list) and not content:
            raise _empty(where)
        turn = _system(content, f"{where}.content")
    else:
        raise input_should_be(f"{where}.role", _ROLES)
    return [turn] if turn is not None else []


def _messages(
    request: dict[str, Any], profile: str, verify: Verify, rules: RequestRules
) -> list[dict[str, Any]]:
    messages = request.get("messages")
    if messages is None:
        raise field_required("messages")
    if not isinstance(messages, list):
        raise wrong_type("messages", "array")
    if not messages:
        raise invalid("messages", "at least one message is required")
    out: list[dict[str, Any]] = []
    system = _system(request["system"]) if request.get("system") is not None else None
    if system is not None:
        out.append(system)
    for i, message in enumerate(messages):
        out.extend(_message(message, f"messages.{i}", profile, verify, rules))
    return _results_after_calls(out)


def _results_after_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with a system message that came between an assistant's tool calls
    and their results moved after the results: the chat form has a call's results
    follow it directly (OpenAI refuses anything between)."""
    out: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        after_calls = bool(out) and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]
        if role == "system" and (held or after_calls):
            held.append(message)
        elif role == "tool" or not held:
            out.append(message)
        else:
            out += [*held, message]
            held = []
    return out + held


# --------------------------------------------------------------------------- options


def _check_context_management(request: dict[str, Any]) -> None:
    """``context_management`` is taken only where it changes nothing: edits that clear
    thinking but keep all of it (what Claude Code sends whenever it thinks). Any other
    edit would have the context cut, which the gateway does not do."""
    config = request.get("context_management")
    if config is None:
        return
    config = _object(config, "context_management")
    for key in sorted(config):
        if key != "edits":
            raise extra_input(f"context_management.{key}")
    edits = config.get("edits", [])
    for i, edit in enumerate(_blocks(edits, "context_management.edits")):
        kind = _object(edit, f"context_management.edits.{i}").get("type")
        if not (isinstance(kind, str) and kind.startswith("clear_thinking_")):
            raise not_served(f"context_management.edits.{i}", f"the context edit '{kind}'")
        if edit.get("keep") != "all":
            raise not_served(
                f"context_management.edits.{i}.keep",
                "clearing thinking other than with keep 'all'",
            )


def _check_server_state(request: dict[str, Any]) -> None:
    """What only Anthropic's servers hold: MCP servers it would call, a thread of the
    conversation it would keep. Left out, the answer would differ: refused by name."""
    servers = request.get("mcp_servers")
    if servers is not None and _blocks(servers, "mcp_servers"):
        raise not_served("mcp_servers", "the MCP connector (MCP servers Anthropic calls)")
    if request.get("thread") is not None:
        raise not_served("thread", "a conversation thread held by the server")


def _effort_of_budget(budget: int) -> str:
    for effort, least in _EFFORT_BUDGETS:
        if budget >= least:
            return effort
    return _LOWEST_EFFORT


def _reasoning(request: dict[str, Any], config: dict[str, Any], out: dict[str, Any]) -> None:
    """``reasoning_effort``: "none" for thinking turned off; else the caller's effort,
    else its thinking budget; unset (the model's own default) otherwise. ``display``
    changes nothing: the gateway shows what the model reasoned."""
    thinking = request.get("thinking")
    budget: int | None = None
    if thinking is not None:
        kind = _object(thinking, "thinking").get("type")
        if kind == "disabled":
            out["reasoning_effort"] = "none"
            return
        if kind == "enabled":
            budget = thinking.get("budget_tokens")
            if budget is None:
                raise field_required("thinking.enabled.budget_tokens")
            if not is_int(budget) or budget < 0:
                raise wrong_type("thinking.enabled.budget_tokens", "integer")
        elif kind != "adaptive":
            raise expected_tags("thinking", str(kind), ("adaptive", "disabled", "enabled"))
    effort = config.get("effort")
    if effort is not None:
        if effort not in _EFFORT:
            raise input_should_be("output_config.effort", _EFFORT)
        out["reasoning_effort"] = _EFFORT[effort]
    elif budget is not None:
        out["reasoning_effort"] = _effort_of_budget(budget)


def _format(fmt: Any, where: str) -> dict[str, Any]:
    kind = _object(fmt, where).get("type")
    if kind != "json_schema":
        raise expected_tags(where, str(kind), ("json_schema",))
    schema = fmt.get("schema")
    if schema is None:
        raise field_required(f"{where}.schema")
    if not isinstance(schema, dict):
        raise wrong_type(f"{where}.schema", "object")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


# output_config's keys: what the answer looks like, and a task budget the model paces
# itself by (which changes nothing here)
_OUTPUT_KEYS = frozenset({"effort", "format", "task_budget"})


def _output(request: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """``output_config`` (and the older ``output_format``): the answer's JSON schema."""
    config = request.get("output_config")
    if config is None:
        config = {}
    config = _object(config, "output_config")
    for key in sorted(config):
        if key not in _OUTPUT_KEYS:
            raise extra_input(f"output_config.{key}")
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
        raise wrong_type(name, "number")
    out[name] = value


def _sampling(request: dict[str, Any], out: dict[str, Any], rules: RequestRules) -> None:
    if not rules.takes_sampling:
        # 2026-10-21 has no sampling parameters, whatever their value
        for name in SAMPLING:
            if name in request:
                raise extra_input(name)
    _number(request, "temperature", out)
    _number(request, "top_p", out)
    top_k = request.get("top_k")
    if top_k is not None:
        if not is_int(top_k):
            raise wrong_type("top_k", "integer")
        out["top_k"] = top_k
    stops = request.get("stop_sequences")
    if stops is not None:
        for i, stop in enumerate(_blocks(stops, "stop_sequences")):
            if not isinstance(stop, str):
                raise wrong_type(f"stop_sequences.{i}", "string")
        if stops:
            out["stop"] = stops


def _max_tokens(request: dict[str, Any], out: dict[str, Any], counting: bool) -> None:
    value = request.get("max_tokens")
    if value is None:
        if counting:
            return
        raise field_required("max_tokens")
    if not is_int(value):
        raise wrong_type("max_tokens", "integer")
    if value < 0:
        raise invalid("max_tokens", "Input should be greater than or equal to 0")
    # OpenAI's current name for it, which llama.cpp reads too
    out["max_completion_tokens"] = value


def _metadata(request: dict[str, Any], out: dict[str, Any]) -> None:
    metadata = request.get("metadata")
    if metadata is None:
        return
    user = _object(metadata, "metadata").get("user_id")
    if user is not None:
        if not isinstance(user, str):
            raise wrong_type("metadata.user_id", "string")
        if user:
            out["user"] = user


def _stream(request: dict[str, Any], out: dict[str, Any]) -> None:
    stream = request.get("stream")
    if stream is None:
        return
    if not isinstance(stream, bool):
        raise wrong_type("stream", "boolean")
    if stream:
        out["stream"] = True
        # message_delta carries the usage
        out["stream_options"] = {"include_usage": True}


def to_chat_body(
    request: Any,
    verify: Verify,
    *,
    counting: bool = False,
    rules: RequestRules = DEFAULT_RULES,
    adjustments: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The chat-completions body for a Messages request read by ``rules`` (``counting``:
    one of ``count_tokens``, which has no ``max_tokens``); an ``InvalidRequest`` naming
    the field for one it refuses. What the gateway left out on its own account is noted
    in ``adjustments``, for the record."""
    if not isinstance(request, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_type")
    notes: dict[str, Any] = adjustments if adjustments is not None else {}
    for key in sorted(request):
        if key not in _TAKEN and key not in IGNORED:
            raise extra_input(key)
    model = request.get("model")
    if model is None:
        raise field_required("model")
    if not isinstance(model, str):
        raise wrong_type("model", "string")
    if not model:
        raise invalid("model", "String should have at least 1 character")
    _check_context_management(request)
    _check_server_state(request)
    out: dict[str, Any] = {"model": model, "messages": _messages(request, model, verify, rules)}
    _max_tokens(request, out, counting)
    _sampling(request, out, rules)
    to_chat_tools(request, out, notes)
    config = _output(request, out)
    _reasoning(request, config, out)
    _metadata(request, out)
    _stream(request, out)
    notes.update(rules.adjustments())
    return out
