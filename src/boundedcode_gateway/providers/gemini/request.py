"""The caller's OpenAI request as a Gemini ``generateContent`` request (pure).

Messages become ``systemInstruction`` and ``contents``; tools, tool choice,
sampling, limits, thinking and a JSON schema become their Gemini fields. Earlier
turns get back the thought signatures Gemini wrote on them (through a lookup the
adapter supplies); ``reasoning_content`` on assistant messages is never sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from boundedcode_gateway.config import ThinkingSettings
from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.json_values import is_number
from boundedcode_gateway.policy.structured import RequestedSchema
from boundedcode_gateway.providers.gemini.signatures import (
    SignatureLookup,
    add_placeholders,
    apply_to_parts,
    no_signatures,
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
    tool_names_by_id,
)

# thinkingLevel for each reasoning_effort (Gemini 3 and later)
LEVEL_BY_EFFORT = {
    "none": "minimal",
    "minimal": "minimal",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}
# thinkingBudget for each reasoning_effort (Gemini 2.x, whose budgets reach 24576 on every model)
BUDGET_BY_EFFORT = {
    "none": 0,
    "minimal": 512,
    "low": 1024,
    "medium": 8192,
    "high": 24576,
    "xhigh": 24576,
    "max": 24576,
}
TOOL_CHOICE_MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY"}


def gemini_url(base_url: str, model: str, stream: bool) -> str:
    """``generateContent``, or ``streamGenerateContent`` as SSE, for the model."""
    return base_url.rstrip("/") + gemini_path(model, stream)


def gemini_path(model: str, stream: bool) -> str:
    """The path of ``gemini_url`` under the API's base URL."""
    path = f"/models/{quote(model, safe='-._')}"
    return path + (":streamGenerateContent?alt=sse" if stream else ":generateContent")


def takes_budget(model: str) -> bool:
    """Gemini 2.x models take ``thinkingBudget`` only; later ones take ``thinkingLevel``."""
    name = model.rsplit("/", 1)[-1].lower()
    return name.startswith(("gemini-2", "gemini-1"))


@dataclass(slots=True)
class GeminiRequest:
    """The request body, and how many function-call steps got the placeholder signature."""

    body: dict[str, Any]
    placeholders: int = 0


def to_gemini_request(
    body: dict[str, Any],
    *,
    model: str,
    thinking: ThinkingSettings | None,
    default_max_tokens: int | None = None,
    schema: RequestedSchema | None = None,
    send_schema: bool = True,
    lookup: SignatureLookup = no_signatures,
) -> GeminiRequest:
    """The ``generateContent`` body for the caller's request (``schema``: the one the caller
    asked for, left out without ``send_schema``)."""
    messages: list[Any] = body["messages"]
    contents = to_gemini_contents(messages, lookup)
    placeholders = add_placeholders(contents)
    out: dict[str, Any] = {"contents": contents}
    system = system_text(messages)
    if system:
        out["systemInstruction"] = {"parts": [{"text": system}]}
    declarations = [_declaration(f) for f in function_tools(body)]
    if declarations:
        out["tools"] = [{"functionDeclarations": declarations}]
        config = _tool_config(body.get("tool_choice"))
        if config is not None:
            out["toolConfig"] = config
    generation = _generation_config(body, model, thinking, default_max_tokens, schema, send_schema)
    if generation:
        out["generationConfig"] = generation
    return GeminiRequest(out, placeholders)


# -- messages


def to_gemini_contents(messages: list[Any], lookup: SignatureLookup) -> list[dict[str, Any]]:
    """Every non-system message as a Gemini content; consecutive user contents merged."""
    names = tool_names_by_id(messages)
    native_ids: set[str] = set()
    contents: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") in SYSTEM_ROLES:
            continue
        role = msg.get("role")
        if role == "assistant":
            parts = _model_parts(messages, i, lookup, native_ids)
            if parts:  # Gemini refuses a content without parts
                contents.append({"role": "model", "parts": parts})
            continue
        if role == "tool":
            parts = [_function_response(msg, i, names, native_ids)]
        else:
            parts = _user_parts(msg, i)
        if not parts:
            continue
        if contents and contents[-1]["role"] == "user":
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": "user", "parts": parts})
    return contents


def _user_parts(msg: dict[str, Any], i: int) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content_parts(msg.get("content"))):
        kind = part.get("type")
        if kind == "text":
            if part.get("text"):
                parts.append({"text": str(part["text"])})
        elif kind == "image_url":
            parts.append(_image(part, f"messages[{i}].content[{j}]"))
        else:
            raise InvalidRequest(
                f"messages[{i}].content[{j}]: Gemini profiles take text and image parts, "
                f"not {kind!r}",
                param=f"messages[{i}].content",
            )
    return parts


def _image(part: dict[str, Any], where: str) -> dict[str, Any]:
    url = image_url_of(part)
    data = parse_data_url(url) if url is not None else None
    if data is None:
        raise InvalidRequest(
            f"{where}: Gemini profiles take images as base64 data: URLs", param="messages"
        )
    return {"inlineData": {"mimeType": data.media_type, "data": data.data}}


def _model_parts(
    messages: list[Any], i: int, lookup: SignatureLookup, native_ids: set[str]
) -> list[dict[str, Any]]:
    """An assistant message as a model content's parts, its own signatures put back."""
    msg: dict[str, Any] = messages[i]
    parts: list[dict[str, Any]] = []
    text = text_of(msg.get("content"))
    if text:
        parts.append({"text": text})
    stored = lookup(message_keys(messages, i))
    calls = [c for c in msg.get("tool_calls") or () if isinstance(c, dict)]
    for call in calls:
        function = call.get("function") or {}
        fc: dict[str, Any] = {
            "name": str(function.get("name", "")),
            "args": arguments_object(function.get("arguments"), f"messages[{i}]"),
        }
        call_id = call.get("id")
        if stored is not None and stored.native_ids and isinstance(call_id, str):
            # Gemini named the call itself: its id goes back with the call and its result
            fc["id"] = call_id
            native_ids.add(call_id)
        parts.append({"functionCall": fc})
    if stored is not None:
        apply_to_parts(parts, stored)
    return parts


def _function_response(
    msg: dict[str, Any], i: int, names: dict[str, str], native_ids: set[str]
) -> dict[str, Any]:
    call_id = msg.get("tool_call_id")
    name = names.get(call_id) if isinstance(call_id, str) else None
    if not name:
        raise InvalidRequest(
            f"messages[{i}]: tool_call_id {call_id!r} answers no tool call of an earlier "
            "assistant message",
            param=f"messages[{i}].tool_call_id",
        )
    response: dict[str, Any] = {"name": name, "response": {"output": text_of(msg.get("content"))}}
    if call_id in native_ids:
        response["id"] = call_id
    return {"functionResponse": response}


# -- tools


def _declaration(function: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": function["name"]}
    if isinstance(function.get("description"), str):
        out["description"] = function["description"]
    if isinstance(function.get("parameters"), dict):
        out["parametersJsonSchema"] = function["parameters"]
    return out


def _tool_config(choice: Any) -> dict[str, Any] | None:
    if isinstance(choice, str) and choice in TOOL_CHOICE_MODES:
        return {"functionCallingConfig": {"mode": TOOL_CHOICE_MODES[choice]}}
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if isinstance(name, str):
            return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [name]}}
    return None


# -- generation settings


def _generation_config(
    body: dict[str, Any],
    model: str,
    thinking: ThinkingSettings | None,
    default_max_tokens: int | None,
    schema: RequestedSchema | None,
    send_schema: bool,
) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for ours, theirs in (("temperature", "temperature"), ("top_p", "topP")):
        value = body.get(ours)
        if is_number(value):
            config[theirs] = value
    limit = max_output_tokens(body) or default_max_tokens
    if limit is not None:
        config["maxOutputTokens"] = limit
    stops = stop_sequences(body.get("stop"))
    if stops:
        config["stopSequences"] = stops
    thinking_config = to_thinking_config(thinking, body.get("reasoning_effort"), model)
    if thinking_config is not None:
        config["thinkingConfig"] = thinking_config
    _json_output(body, config, schema, send_schema)
    return config


def _json_output(
    body: dict[str, Any],
    config: dict[str, Any],
    schema: RequestedSchema | None,
    send_schema: bool,
) -> None:
    if schema is not None:
        if send_schema:
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = schema.schema
        return
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        config["responseMimeType"] = "application/json"


def to_thinking_config(
    thinking: ThinkingSettings | None, effort: Any, model: str
) -> dict[str, Any] | None:
    """``thinkingConfig`` from the caller's ``reasoning_effort``, else the profile's settings.

    Never both ``thinkingLevel`` and ``thinkingBudget`` (Gemini refuses the pair).
    """
    budget_model = takes_budget(model)
    if isinstance(effort, str) and effort in LEVEL_BY_EFFORT:
        if budget_model:
            budget = BUDGET_BY_EFFORT[effort]
            return {"thinkingBudget": budget, **_thoughts(budget != 0)}
        return {"thinkingLevel": LEVEL_BY_EFFORT[effort], **_thoughts(effort != "none")}
    settings = thinking or ThinkingSettings()
    if settings.mode == "off":
        # Gemini 2.x turns thinking off with a zero budget; later models cannot turn it off
        return {"thinkingBudget": 0} if budget_model else None
    config: dict[str, Any] = {"includeThoughts": True}
    if settings.level is not None:
        if budget_model:
            config["thinkingBudget"] = BUDGET_BY_EFFORT[settings.level]
        else:
            config["thinkingLevel"] = LEVEL_BY_EFFORT[settings.level]
    elif settings.budget_tokens is not None:
        config["thinkingBudget"] = settings.budget_tokens
    elif settings.mode == "adaptive" and budget_model:
        config["thinkingBudget"] = -1  # dynamic: the model decides per request
    return config


def _thoughts(on: bool) -> dict[str, Any]:
    return {"includeThoughts": True} if on else {}
