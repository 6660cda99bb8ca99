"""Checks of a chat-completions body before anything is routed: types and required fields.

Pure: the body in, an ``InvalidRequest`` naming the field out. Only what the
gateway interprets is checked; other fields pass through to the upstream.
"""

from __future__ import annotations

import re
from typing import Any

from boundedcode_gateway import discard
from boundedcode_gateway import openai_refusals as refuse
from boundedcode_gateway.call_context import TASK_ID
from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.json_values import is_int, is_number
from boundedcode_gateway.metering.records import OWN_RECORD_PURPOSES
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE

PURPOSE = re.compile(r"[a-z_]{1,32}")
DEFAULT_TASK = "default"
DEFAULT_PURPOSE = "agent_turn"
# the purposes of the gateway's own records: a caller's call under one would pass for the
# gateway's own work on the page, in the report and in the metrics
GATEWAY_PURPOSES = frozenset({REPAIR_PURPOSE, *OWN_RECORD_PURPOSES})
# in the order OpenAI's message lists them
_ROLE_ORDER = ("system", "assistant", "user", "function", "tool", "developer")
ROLES = frozenset(_ROLE_ORDER)

_BOOL_FIELDS = ("stream", "return_progress", "parallel_tool_calls", "logprobs")
_INT_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed", "top_logprobs")
_NUMBER_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_OBJECT_FIELDS = ("stream_options", "response_format", "metadata", "chat_template_kwargs")


def _wrong_type(field: str, expected: str, value: Any) -> InvalidRequest:
    return refuse.wrong_type(field, expected, value)


def check_task(task: str) -> str:
    """The task id, or a 400: it names a folder, so 1-128 of ``[A-Za-z0-9._-]``, not . or .."""
    if not TASK_ID.fullmatch(task) or task in (".", ".."):
        raise InvalidRequest(
            "Invalid task id: use 1 to 128 of A-Z a-z 0-9 . _ - (and not '.' or '..')",
            param="X-BoundedCode-Task",
            code="invalid_task",
        )
    return task


def check_purpose(purpose: str) -> str:
    if not PURPOSE.fullmatch(purpose):
        raise InvalidRequest(
            "Invalid purpose: use 1 to 32 of a-z and _ (for example agent_turn, condenser)",
            param="X-BoundedCode-Purpose",
            code="invalid_purpose",
        )
    if purpose in GATEWAY_PURPOSES:
        raise InvalidRequest(
            f"Invalid purpose: '{purpose}' is the gateway's own, for the records of its cache "
            "repairs and token counts; name another (for example agent_turn, condenser)",
            param="X-BoundedCode-Purpose",
            code="invalid_purpose",
        )
    return purpose


def _check_content(i: int, msg: dict[str, Any]) -> None:
    role = msg["role"]
    content = msg.get("content")
    where = f"messages[{i}].content"
    if content is None:
        if role == "assistant" and msg.get("tool_calls"):
            return
        if role == "assistant" and "reasoning_content" in msg:
            return
        raise refuse.missing(where)
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _wrong_type(where, "one of a string or array of objects", content)
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise _wrong_type(f"{where}[{j}]", "an object", part)
        if "type" not in part:
            raise refuse.missing(f"{where}[{j}].type")
        if not isinstance(part["type"], str):
            raise _wrong_type(f"{where}[{j}].type", "a string", part["type"])


def _check_message(i: int, msg: Any) -> None:
    if not isinstance(msg, dict):
        raise _wrong_type(f"messages[{i}]", "an object", msg)
    role = msg.get("role")
    if role is None:
        raise refuse.missing(f"messages[{i}].role")
    if not isinstance(role, str):
        raise _wrong_type(f"messages[{i}].role", "a string", role)
    if role not in ROLES:
        raise refuse.invalid_value(f"messages[{i}].role", role, _ROLE_ORDER)
    _check_content(i, msg)
    if role == "tool":
        tool_call_id = msg.get("tool_call_id")
        if tool_call_id is None:
            raise refuse.missing(f"messages[{i}].tool_call_id")
        if not isinstance(tool_call_id, str):
            raise _wrong_type(f"messages[{i}].tool_call_id", "a string", tool_call_id)
    tool_calls = msg.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            raise _wrong_type(f"messages[{i}].tool_calls", "an array", tool_calls)
        for j, call in enumerate(tool_calls):
            where = f"messages[{i}].tool_calls[{j}]"
            if not isinstance(call, dict):
                raise _wrong_type(where, "an object", call)
            _check_function(where, call.get("function"))


def _check_function(where: str, function: Any) -> None:
    """A tool call's, a tool's or a tool choice's ``function``: an object with a string name."""
    if function is None:
        raise refuse.missing(f"{where}.function")
    if not isinstance(function, dict):
        raise _wrong_type(f"{where}.function", "an object", function)
    if function.get("name") is None:
        raise refuse.missing(f"{where}.function.name")
    if not isinstance(function["name"], str):
        raise _wrong_type(f"{where}.function.name", "a string", function["name"])


def _check_tools(body: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _wrong_type("tools", "an array", tools)
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise _wrong_type(f"tools[{i}]", "an object", tool)
            if tool.get("type", "function") == "function":
                _check_function(f"tools[{i}]", tool.get("function"))
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type", "function") == "function":
            _check_function("tool_choice", choice.get("function"))
    elif choice is not None and not isinstance(choice, str):
        raise _wrong_type("tool_choice", "one of a string or an object", choice)


def _check_scalars(body: dict[str, Any]) -> None:
    for name in _BOOL_FIELDS:
        if name in body and body[name] is not None and not isinstance(body[name], bool):
            raise _wrong_type(name, "a boolean", body[name])
    for name in _INT_FIELDS:
        v = body.get(name)
        if v is not None and not is_int(v):
            raise _wrong_type(name, "an integer", v)
    for name in _NUMBER_FIELDS:
        v = body.get(name)
        if v is not None and not is_number(v):
            raise _wrong_type(name, "a decimal", v)
    for name in _OBJECT_FIELDS:
        v = body.get(name)
        if v is not None and not isinstance(v, dict):
            raise _wrong_type(name, "an object", v)
    if isinstance(body.get("stream_options"), dict):
        discard.check_stream_option(body["stream_options"])
    _check_tools(body)


def requested_model(body: Any) -> str | None:
    """The model a body names, if any (so even a refused call can be recorded)."""
    if isinstance(body, dict):
        model = body.get("model")
        if isinstance(model, str) and model:
            return model
    return None


def check_chat_body(body: Any) -> dict[str, Any]:
    """The body, or an ``InvalidRequest`` naming the first field that is wrong."""
    if not isinstance(body, dict):
        # OpenAI's words for a body that is JSON but not an object
        raise InvalidRequest(
            f"Invalid type for 'body': expected an object, but got {refuse.kind_of(body)} instead.",
            code="invalid_type",
        )
    model = body.get("model")
    if model is None:
        raise refuse.missing("model")
    if not isinstance(model, str):
        raise _wrong_type("model", "a string", model)
    if not model:
        raise InvalidRequest(
            "Invalid 'model': empty string. Expected a string with minimum length 1, but got "
            "an empty string instead.",
            param="model",
            code="empty_string",
        )
    messages = body.get("messages")
    if messages is None:
        raise refuse.missing("messages")
    if not isinstance(messages, list):
        raise _wrong_type("messages", "an array", messages)
    if not messages:
        raise refuse.empty_array("messages")
    for i, msg in enumerate(messages):
        _check_message(i, msg)
    _check_scalars(body)
    return body
