"""A Responses API request as the one chat-completions body the gateway answers (pure).

The gateway keeps no responses: every request carries its whole conversation in
``input`` (as Codex does with ``store: false``), and ``previous_response_id`` is
refused. The input items become chat messages: a user, system or developer message
as it is; an assistant's reasoning item, message and function calls together as one
assistant message (its ``reasoning_content``, ``content`` and ``tool_calls``), the way
the chat answer they came from had them; a function call's output as a tool message.
A reasoning item gives its text back only from an ``encrypted_content`` this gateway
sealed for the same profile; any other is dropped (the reasoning store may still put
the turn's reasoning back, as it does for any caller).

Only function tools are served: a built-in tool (web search, file search, computer
use, code interpreter, MCP, …) is refused, naming it, since no upstream here would
run it. A field the gateway does not know is refused too, rather than answered as if
it had not been sent. What the ``Response`` must repeat of the request is returned
with the body (``Echo``).
"""

from __future__ import annotations

from typing import Any

from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.fronts.responses.response import JSON, Echo
from boundedcode_gateway.fronts.responses.sealed import open_reasoning
from boundedcode_gateway.fronts.sealing import Sealer
from boundedcode_gateway.json_values import is_int, is_number
from boundedcode_gateway.text import clip

# fields the request maps into the chat body (or its echo)
_MAPPED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "max_output_tokens",
        "temperature",
        "top_p",
        "reasoning",
        "stream",
        "user",
        "metadata",
    }
)
# fields that change nothing the model writes: taken and not forwarded (``store``: the
# gateway stores nothing, whatever it says; ``include``, ``truncation`` and
# ``background`` are checked below)
_INERT = frozenset(
    {
        "store",
        "include",
        "truncation",
        "background",
        "background_options",
        "stream_options",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "safety_identifier",
        "service_tier",
        # limits calls of built-in tools, which are refused anyway
        "max_tool_calls",
        # Codex's own (a trace's context, the client's name)
        "client_metadata",
    }
)
# fields of OpenAI's that this gateway cannot honour: refused when set, saying why
_REFUSED = {
    "previous_response_id": (
        "The gateway keeps no responses, so 'previous_response_id' cannot be used: send the "
        "whole conversation in 'input' (with each reasoning item's encrypted_content), as "
        "with store: false."
    ),
    "conversation": ("The gateway keeps no conversations: send the whole conversation in 'input'."),
    "prompt": "The gateway has no stored prompts: send the instructions and input themselves.",
    "context_management": "The gateway does not compact conversations on the server.",
    "top_logprobs": "The gateway's Responses API does not return log probabilities.",
    "access_programs": "The gateway serves function tools only.",
    "image": "The gateway does not generate images.",
    "moderation": "The gateway does not moderate answers.",
}
_KNOWN = _MAPPED | _INERT | frozenset(_REFUSED)
# the ``include`` value the gateway honours: reasoning items always carry it
ENCRYPTED_CONTENT = "reasoning.encrypted_content"
_TOOL_CHOICES = frozenset({"none", "auto", "required"})
_REASONING_KEYS = frozenset({"effort", "summary", "generate_summary", "context", "mode"})
_TEXT_KEYS = frozenset({"format", "verbosity"})
_ROLES = frozenset({"user", "system", "developer", "assistant"})


def _type_name(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer"}
    return names.get(type(value), "number" if isinstance(value, float) else "null")


def _wrong_type(param: str, expected: str, value: Any) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid type for '{param}': expected {expected}, but got {_type_name(value)}.",
        param=param,
        code="invalid_type",
    )


def _missing(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _unsupported(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="unsupported_parameter")


def _string(item: JSON, key: str, where: str) -> str:
    value = item.get(key)
    if value is None:
        raise _missing(f"{where}.{key}")
    if not isinstance(value, str):
        raise _wrong_type(f"{where}.{key}", "string", value)
    return value


# -- the top-level fields


def _check_fields(request: JSON) -> None:
    unknown = [name for name in request if name not in _KNOWN]
    if unknown:
        names = ", ".join(f"'{clip(n)}'" for n in unknown)
        raise InvalidRequest(
            f"Unknown parameter: {names}.", param=clip(unknown[0]), code="unknown_parameter"
        )
    for name, why in _REFUSED.items():
        if request.get(name):
            raise _unsupported(why, name)
    if request.get("background"):
        raise _unsupported(
            "The gateway answers every request at once: use background: false.", "background"
        )
    if request.get("truncation") not in (None, "disabled"):
        raise _unsupported(
            "The gateway does not truncate the input: a conversation longer than the model's "
            "context is answered with context_length_exceeded (truncation: disabled).",
            "truncation",
        )
    _check_include(request.get("include"))


def _check_include(include: Any) -> None:
    if include is None:
        return
    if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
        raise _wrong_type("include", "array of strings", include)
    other = [clip(v) for v in include if v != ENCRYPTED_CONTENT]
    if other:
        raise _unsupported(
            f"The gateway can include only '{ENCRYPTED_CONTENT}' (always sent with reasoning), "
            f"not: {', '.join(other)}.",
            "include",
        )


# -- the input


def _part(part: Any, where: str) -> JSON:
    """One content part as a chat content part."""
    if not isinstance(part, dict):
        raise _wrong_type(where, "object", part)
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": _string(part, "text", where)}
    if kind == "refusal":
        return {"type": "text", "text": _string(part, "refusal", where)}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise _unsupported(
                "The gateway takes images as an 'image_url' (a data: or https URL), not as a "
                "file id.",
                f"{where}.image_url",
            )
        image: JSON = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise InvalidRequest(
        f"Invalid '{where}.type': content of type '{clip(str(kind))}' is not served (input_text, "
        "output_text and input_image are).",
        param=f"{where}.type",
        code="invalid_value",
    )


def _content(content: Any, where: str) -> str | list[JSON]:
    """A message's content as chat content: a string stays one, and so does one text part
    (the form every chat template reads)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _wrong_type(where, "string or array", content)
    parts = [_part(p, f"{where}[{j}]") for j, p in enumerate(content)]
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts


def _text(content: Any, where: str) -> str:
    """An assistant message's content as one string (how the chat answer had it)."""
    converted = _content(content, where)
    if isinstance(converted, str):
        return converted
    if any(p["type"] != "text" for p in converted):
        raise InvalidRequest(
            f"Invalid '{where}': an assistant message holds text only.",
            param=where,
            code="invalid_value",
        )
    return "".join(str(p["text"]) for p in converted)


class _History:
    """The chat messages of the input items, the assistant's items gathered into turns."""

    # where an assistant turn stands: nothing yet, its reasoning, its text, its tool calls
    _EMPTY, _REASONED, _SAID, _CALLED = range(4)

    def __init__(self, sealer: Sealer, model: str) -> None:
        self._sealer = sealer
        self._model = model
        self.messages: list[JSON] = []
        self._turn: JSON | None = None
        self._stage = self._EMPTY

    def add(self, i: int, item: Any) -> None:
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _wrong_type(where, "object", item)
        kind = item.get("type", "message")
        if kind == "message":
            self._message(item, where)
        elif kind == "reasoning":
            self._reasoning(item)
        elif kind == "function_call":
            self._function_call(item, where)
        elif kind == "function_call_output":
            self._function_call_output(item, where)
        elif kind == "item_reference":
            raise _unsupported(
                "The gateway keeps no items: send each item itself rather than a reference.",
                f"{where}.type",
            )
        else:
            raise InvalidRequest(
                f"Invalid '{where}.type': items of type '{clip(str(kind))}' are not served "
                "(messages, reasoning, function_call and function_call_output are; the gateway "
                "serves function tools only).",
                param=f"{where}.type",
                code="invalid_value",
            )

    def end(self) -> list[JSON]:
        self._close()
        return self.messages

    def _open(self, stage: int) -> JSON:
        """The assistant turn an item at ``stage`` belongs to: the open one, unless the item
        cannot follow what it holds (a second text, reasoning after anything)."""
        if self._turn is not None and (
            stage < self._stage or (stage == self._stage and stage != self._CALLED)
        ):
            self._close()
        if self._turn is None:
            self._turn = {"role": "assistant", "content": None}
        self._stage = stage
        return self._turn

    def _close(self) -> None:
        turn, self._turn, self._stage = self._turn, None, self._EMPTY
        if turn is None:
            return
        # reasoning alone (its answer not sent back) has no turn to go with
        if turn["content"] is None and "tool_calls" not in turn:
            return
        self.messages.append(turn)

    def _message(self, item: JSON, where: str) -> None:
        role = item.get("role")
        if role is None:
            raise _missing(f"{where}.role")
        if role not in _ROLES:
            raise InvalidRequest(
                f"Invalid value: '{clip(str(role))}'. Supported values are: 'user', 'system', "
                "'developer' and 'assistant'.",
                param=f"{where}.role",
                code="invalid_value",
            )
        if "content" not in item:
            raise _missing(f"{where}.content")
        if role == "assistant":
            self._open(self._SAID)["content"] = _text(item["content"], f"{where}.content")
            return
        self._close()
        self.messages.append(
            {"role": role, "content": _content(item["content"], f"{where}.content")}
        )

    def _reasoning(self, item: JSON) -> None:
        turn = self._open(self._REASONED)
        text = open_reasoning(self._sealer, self._model, item.get("encrypted_content"))
        if text is not None:
            turn["reasoning_content"] = text

    def _function_call(self, item: JSON, where: str) -> None:
        call = {
            "id": _string(item, "call_id", where),
            "type": "function",
            "function": {
                "name": _string(item, "name", where),
                "arguments": _string(item, "arguments", where),
            },
        }
        self._open(self._CALLED).setdefault("tool_calls", []).append(call)

    def _function_call_output(self, item: JSON, where: str) -> None:
        self._close()
        call_id = _string(item, "call_id", where)
        if "output" not in item:
            raise _missing(f"{where}.output")
        output = _content(item["output"], f"{where}.output")
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})


def _messages(request: JSON, sealer: Sealer, model: str) -> list[JSON]:
    messages: list[JSON] = []
    instructions = request.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _wrong_type("instructions", "string", instructions)
        if instructions:
            messages.append({"role": "system", "content": instructions})
    items = request.get("input")
    if items is None:
        raise _missing("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise _wrong_type("input", "string or array", items)
    history = _History(sealer, model)
    for i, item in enumerate(items):
        history.add(i, item)
    messages += history.end()
    if not messages:
        raise InvalidRequest(
            "Invalid 'input': empty array. Expected at least one item.",
            param="input",
            code="empty_array",
        )
    return messages


# -- tools and the answer's form


def _tools(tools: Any) -> tuple[list[JSON], list[JSON]]:
    """(the chat tools, the tools as the ``Response`` repeats them)."""
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise _wrong_type("tools", "array of objects", tools)
    refused = sorted({clip(str(t.get("type"))) for t in tools if t.get("type") != "function"})
    if refused:
        raise InvalidRequest(
            "The gateway serves function tools only; these tools are not served: "
            f"{', '.join(refused)}.",
            param="tools",
            code="unsupported_tool",
        )
    chat: list[JSON] = []
    echo: list[JSON] = []
    for i, tool in enumerate(tools):
        function: JSON = {"name": _string(tool, "name", f"tools[{i}]")}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        chat.append({"type": "function", "function": function})
        echo.append(
            {
                "type": "function",
                "name": function["name"],
                "description": tool.get("description"),
                "parameters": tool.get("parameters"),
                "strict": tool.get("strict"),
            }
        )
    return chat, echo


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str) and choice in _TOOL_CHOICES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": _string(choice, "name", "tool_choice")}}
    raise InvalidRequest(
        "Invalid 'tool_choice': use 'none', 'auto', 'required' or "
        '{"type": "function", "name": ...} (the gateway serves function tools only).',
        param="tool_choice",
        code="invalid_value",
    )


def _response_format(fmt: Any) -> JSON | None:
    """The chat ``response_format`` of ``text.format``."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _wrong_type("text.format", "object", fmt)
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise InvalidRequest(
            f"Invalid 'text.format.type': '{clip(str(kind))}' (text, json_schema and "
            "json_object are served).",
            param="text.format.type",
            code="invalid_value",
        )
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise _wrong_type("text.format.schema", "object", schema)
    json_schema: JSON = {"name": fmt.get("name") or "response", "schema": schema}
    for key in ("strict", "description"):
        if fmt.get(key) is not None:
            json_schema[key] = fmt[key]
    return {"type": "json_schema", "json_schema": json_schema}


def _text_options(text: Any, body: JSON) -> JSON:
    """``text`` into the body (its format, its verbosity); the ``text`` a Response repeats."""
    if text is None:
        return {"format": {"type": "text"}}
    if not isinstance(text, dict):
        raise _wrong_type("text", "object", text)
    _only(text, _TEXT_KEYS, "text")
    response_format = _response_format(text.get("format"))
    if response_format is not None:
        body["response_format"] = response_format
    verbosity = text.get("verbosity")
    if verbosity is not None:
        body["verbosity"] = verbosity
    return {"format": text.get("format") or {"type": "text"}, "verbosity": verbosity}


def _reasoning(reasoning: Any, body: JSON) -> JSON | None:
    """``reasoning.effort`` into the body; the ``reasoning`` a Response repeats.

    No summaries are written (``summary`` is taken and ignored): the reasoning text itself
    is the reasoning item's content.
    """
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise _wrong_type("reasoning", "object", reasoning)
    _only(reasoning, _REASONING_KEYS, "reasoning")
    if reasoning.get("context") not in (None, "auto"):
        raise _unsupported(
            "The gateway decides which earlier reasoning goes back to the model "
            "(docs/reasoning.md): use reasoning.context 'auto' or leave it out.",
            "reasoning.context",
        )
    if reasoning.get("mode") not in (None, "standard"):
        raise _unsupported("Only the standard reasoning mode is served.", "reasoning.mode")
    effort = reasoning.get("effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise _wrong_type("reasoning.effort", "string", effort)
        body["reasoning_effort"] = effort
    return {"effort": effort, "summary": None}


def _only(obj: JSON, keys: frozenset[str], where: str) -> None:
    unknown = [clip(k) for k in obj if k not in keys]
    if unknown:
        raise InvalidRequest(
            f"Unknown parameter: '{where}.{unknown[0]}'.",
            param=f"{where}.{unknown[0]}",
            code="unknown_parameter",
        )


# -- the whole request


def _sampling(request: JSON, body: JSON) -> None:
    """The fields that keep their name and meaning (their types are checked as chat's)."""
    for key in ("temperature", "top_p", "parallel_tool_calls", "user"):
        if request.get(key) is not None:
            body[key] = request[key]
    limit = request.get("max_output_tokens")
    if limit is not None:
        if not is_int(limit):
            raise _wrong_type("max_output_tokens", "integer", limit)
        # the name OpenAI's reasoning models take; llama.cpp, Anthropic and Gemini read it too
        body["max_completion_tokens"] = limit
    if request.get("stream") is not None:
        body["stream"] = request["stream"]
    if request.get("stream") is True:
        # a streamed Response ends with its usage
        body["stream_options"] = {"include_usage": True}


def to_chat_request(request: Any, sealer: Sealer) -> tuple[Any, Echo]:
    """(the chat-completions body of a Responses request, what its Response repeats);
    an ``InvalidRequest`` naming the field for one the gateway refuses.

    A body that is not an object, or names no model, is returned for the chat checks to
    refuse in their words.
    """
    if not isinstance(request, dict):
        return request, Echo(model="")
    _check_fields(request)
    model = request.get("model")
    if not isinstance(model, str) or not model:
        return {k: v for k, v in request.items() if k == "model"}, Echo(model="")
    body: JSON = {"model": model, "messages": _messages(request, sealer, model)}
    echo_tools: list[JSON] = []
    if request.get("tools") is not None:
        body["tools"], echo_tools = _tools(request["tools"])
    if request.get("tool_choice") is not None:
        body["tool_choice"] = _tool_choice(request["tool_choice"])
    _sampling(request, body)
    text = _text_options(request.get("text"), body)
    reasoning = _reasoning(request.get("reasoning"), body)
    metadata = request.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _wrong_type("metadata", "object", metadata)
    return body, _echo(request, model, echo_tools, text, reasoning)


def _echo(request: JSON, model: str, tools: list[JSON], text: JSON, reasoning: JSON | None) -> Echo:
    def number(key: str) -> float | None:
        value = request.get(key)
        return value if is_number(value) else None

    limit = request.get("max_output_tokens")
    parallel = request.get("parallel_tool_calls")
    instructions = request.get("instructions")
    user = request.get("user")
    return Echo(
        model=model,
        instructions=instructions if isinstance(instructions, str) else None,
        tools=tools,
        tool_choice=request.get("tool_choice") or "auto",
        parallel_tool_calls=parallel if isinstance(parallel, bool) else True,
        temperature=number("temperature"),
        top_p=number("top_p"),
        max_output_tokens=limit if is_int(limit) else None,
        reasoning=reasoning,
        text=text,
        metadata=request.get("metadata"),
        user=user if isinstance(user, str) else None,
    )
