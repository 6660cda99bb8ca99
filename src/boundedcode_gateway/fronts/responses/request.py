"""A Responses API request as the one chat-completions body the gateway answers (pure).

The gateway keeps no responses: every request carries its whole conversation in
``input`` (as Codex does with ``store: false``), and ``previous_response_id`` is
refused. The input items become chat messages: a user, system or developer message
as it is; an assistant's reasoning item, message and tool calls together as one
assistant message (its ``reasoning_content``, ``content`` and ``tool_calls``), the way
the chat answer they came from had them; a tool call's output as a tool message.
A reasoning item gives its text back only from an ``encrypted_content`` this gateway
sealed for the same profile; any other is dropped (the reasoning store may still put
the turn's reasoning back, as it does for any caller).

Tools are function tools, namespaces of them flattened, and built-in tools dropped
(tools.py). Input items of built-in tools the gateway never ran are dropped too.
What was dropped or left unserved is noted in the ``notes`` the caller passes, for
the call's record (``adjustments``). A field the API does not have is refused, and so
is one whose meaning the gateway cannot honour where that would change the answer;
each refusal is worded as OpenAI words it (openai_refusals.py). What the ``Response``
must repeat of the request is returned with the body (``Echo``).
"""

from __future__ import annotations

from typing import Any

import orjson

from boundedcode_gateway import openai_refusals as refuse
from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.fronts.responses.response import JSON, Echo
from boundedcode_gateway.fronts.responses.sealed import open_reasoning
from boundedcode_gateway.fronts.responses.tools import (
    NO_NAMES,
    ServedTools,
    ToolNames,
    chat_tool_choice,
    served_tools,
)
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
# gateway stores nothing, whatever it says; ``include``, ``truncation``,
# ``background`` and ``top_logprobs`` are checked below)
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
        "top_logprobs",
        # limits calls of built-in tools, which are dropped anyway
        "max_tool_calls",
        # Codex's own (a trace's context, the client's name)
        "client_metadata",
    }
)
# fields taken but not served, where that leaves the answer as it would be unless the
# conversation outgrows the model (then: context_length_exceeded): noted in the record
_IGNORED = frozenset({"context_management"})
# fields of OpenAI's that this gateway cannot honour: refused when set, saying why
_REFUSED = {
    "conversation": "The gateway keeps no conversations: send the whole conversation in 'input'.",
    "prompt": "The gateway has no stored prompts: send the instructions and input themselves.",
    "access_programs": "The gateway serves function tools only.",
    "image": "The gateway does not generate images.",
    "moderation": "The gateway does not moderate answers.",
}
_KNOWN = _MAPPED | _INERT | _IGNORED | frozenset(_REFUSED) | {"previous_response_id"}
# the ``include`` value the gateway honours: reasoning items always carry it
ENCRYPTED_CONTENT = "reasoning.encrypted_content"
_REASONING_KEYS = frozenset({"effort", "summary", "generate_summary", "context", "mode"})
_TEXT_KEYS = frozenset({"format", "verbosity"})
_ROLES = ("user", "system", "developer", "assistant")
# the record's note of what the request asked that the gateway left out
TOOLS_DROPPED = "tools_dropped"
TOOLS_FLATTENED = "tools_flattened"
ITEMS_DROPPED = "input_items_dropped"
FIELDS_IGNORED = "fields_ignored"


def _string(item: JSON, key: str, where: str) -> str:
    value = item.get(key)
    if value is None:
        raise refuse.missing(f"{where}.{key}")
    if not isinstance(value, str):
        raise refuse.wrong_type(f"{where}.{key}", "a string", value)
    return value


# -- the top-level fields


def _check_fields(request: JSON, notes: JSON) -> None:
    for name in request:
        if name not in _KNOWN:
            raise refuse.unknown_parameter(name)
    if request.get("previous_response_id"):
        # OpenAI's words for an id it does not have: the gateway has none
        raise InvalidRequest(
            f"Previous response with id '{clip(str(request['previous_response_id']))}' not "
            "found. The gateway keeps no responses: send the whole conversation in 'input' "
            "(with each reasoning item's encrypted_content), as with store: false.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    for name, why in _REFUSED.items():
        if request.get(name):
            raise refuse.unsupported_parameter(name, why)
    ignored = sorted(n for n in _IGNORED if request.get(n))
    if ignored:
        notes[FIELDS_IGNORED] = ignored
    if request.get("background"):
        # true is its one value besides the default: the parameter itself is not served
        raise refuse.unsupported_parameter(
            "background", "The gateway answers every request at once: use false."
        )
    truncation = request.get("truncation")
    if truncation not in (None, "disabled", "auto"):
        raise refuse.invalid_value("truncation", truncation, ("auto", "disabled"))
    top_logprobs = request.get("top_logprobs")
    if top_logprobs is not None and not is_int(top_logprobs):
        raise refuse.wrong_type("top_logprobs", "an integer", top_logprobs)
    if top_logprobs:
        raise refuse.unsupported_value(
            "top_logprobs",
            top_logprobs,
            "The gateway's Responses API returns no log probabilities.",
        )
    _check_include(request.get("include"))


def _check_include(include: Any) -> None:
    if include is None:
        return
    if not isinstance(include, list):
        raise refuse.wrong_type("include", "an array", include)
    for i, value in enumerate(include):
        if not isinstance(value, str):
            raise refuse.wrong_type(f"include[{i}]", "a string", value)
        if value != ENCRYPTED_CONTENT:
            raise refuse.unsupported_value(
                "include",
                value,
                f"The gateway can include only '{ENCRYPTED_CONTENT}' (always sent with reasoning).",
            )


# -- the input


_PART_TYPES = ("input_text", "output_text", "refusal", "input_image")


def _part(part: Any, where: str) -> JSON:
    """One content part as a chat content part."""
    if not isinstance(part, dict):
        raise refuse.wrong_type(where, "an object", part)
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": _string(part, "text", where)}
    if kind == "refusal":
        return {"type": "text", "text": _string(part, "refusal", where)}
    if kind == "input_image":
        url = part.get("image_url")
        if url is None and part.get("file_id") is None:
            raise refuse.missing(f"{where}.image_url")
        if not isinstance(url, str):
            raise refuse.unsupported_parameter(
                f"{where}.file_id",
                "The gateway takes images as an 'image_url' (a data: or https URL), not as a "
                "file id.",
            )
        image: JSON = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind in ("input_file", "input_audio"):
        raise refuse.unsupported_value(
            f"{where}.type", kind, "The gateway takes text and images (input_image) only."
        )
    raise refuse.invalid_value(f"{where}.type", kind, (*_PART_TYPES, "input_file"))


def _content(content: Any, where: str) -> str | list[JSON]:
    """A message's content as chat content: a string stays one, and so does one text part
    (the form every chat template reads)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise refuse.wrong_type(where, "one of a string or an array", content)
    parts = [_part(p, f"{where}[{j}]") for j, p in enumerate(content)]
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts


def _text(content: Any, where: str) -> str:
    """An assistant message's content as one string (how the chat answer had it)."""
    converted = _content(content, where)
    if isinstance(converted, str):
        return converted
    for j, part in enumerate(converted):
        if part["type"] != "text":
            raise refuse.invalid_value(
                f"{where}[{j}].type", "input_image", ("output_text", "refusal")
            )
    return "".join(str(p["text"]) for p in converted)


def _output_text(output: Any, where: str) -> str | list[JSON]:
    """A tool's output as a tool message's content: text and image parts as content,
    anything else (a shell call's stdout and stderr) as its JSON."""
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(
        isinstance(p, dict) and p.get("type") in _PART_TYPES for p in output
    ):
        return _content(output, where)
    return orjson.dumps(output).decode()


# the calls of the API's own tools, given back in the history: (the name the model
# knows the tool by, the item's field that holds the call)
_TOOL_CALLS = {
    "local_shell_call": ("local_shell", "action"),
    "shell_call": ("shell", "action"),
    "apply_patch_call": ("apply_patch", "operation"),
}
_TOOL_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "shell_call_output",
        "apply_patch_call_output",
    }
)
# items of built-in tools the gateway never runs: dropped from the history, noted
_DROPPED_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "tool_search_call",
        "tool_search_output",
        "additional_tools",
        "configuration_update",
        "compaction_trigger",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "program",
        "program_output",
    }
)
_ITEM_TYPES = (
    "message",
    "reasoning",
    "function_call",
    "custom_tool_call",
    *_TOOL_CALLS,
    *sorted(_TOOL_OUTPUTS),
    *sorted(_DROPPED_ITEMS),
    "compaction",
    "item_reference",
)


class _History:
    """The chat messages of the input items, the assistant's items gathered into turns."""

    # where an assistant turn stands: nothing yet, its reasoning, its text, its tool calls
    _EMPTY, _REASONED, _SAID, _CALLED = range(4)

    def __init__(self, sealer: Sealer, model: str, names: ToolNames) -> None:
        self._sealer = sealer
        self._model = model
        self._names = names
        self.messages: list[JSON] = []
        self.dropped: dict[str, int] = {}
        self._turn: JSON | None = None
        self._stage = self._EMPTY

    def add(self, i: int, item: Any) -> None:
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise refuse.wrong_type(where, "an object", item)
        kind = item.get("type", "message")
        if kind == "message":
            self._message(item, where)
        elif kind == "reasoning":
            self._reasoning(item)
        elif kind == "function_call":
            name = _string(item, "name", where)
            namespace = item.get("namespace")
            if isinstance(namespace, str) and namespace:
                name = self._names.flat(namespace, name)
            self._call(item, where, name, _string(item, "arguments", where))
        elif kind == "custom_tool_call":
            arguments = orjson.dumps({"input": _string(item, "input", where)}).decode()
            self._call(item, where, _string(item, "name", where), arguments)
        elif kind in _TOOL_CALLS:
            name, key = _TOOL_CALLS[kind]
            self._call(item, where, name, orjson.dumps(item.get(key)).decode())
        elif kind in _TOOL_OUTPUTS:
            self._output(item, where, kind)
        elif kind in _DROPPED_ITEMS:
            self.dropped[kind] = self.dropped.get(kind, 0) + 1
        elif kind == "item_reference":
            raise InvalidRequest(
                f"Item with id '{clip(str(item.get('id')))}' not found. The gateway keeps no "
                "items: send each item itself rather than a reference.",
                param=f"{where}.id",
                code="invalid_value",
            )
        elif kind == "compaction":
            raise refuse.unsupported_value(
                f"{where}.type",
                kind,
                "A compaction item holds history only OpenAI can read: send the conversation "
                "itself.",
            )
        else:
            raise refuse.invalid_value(f"{where}.type", kind, _ITEM_TYPES)

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
            raise refuse.missing(f"{where}.role")
        if role not in _ROLES:
            raise refuse.invalid_value(f"{where}.role", role, _ROLES)
        if "content" not in item:
            raise refuse.missing(f"{where}.content")
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

    def _call(self, item: JSON, where: str, name: str, arguments: str) -> None:
        call = {
            "id": _string(item, "call_id", where),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        self._open(self._CALLED).setdefault("tool_calls", []).append(call)

    def _output(self, item: JSON, where: str, kind: str) -> None:
        self._close()
        # a local shell call's output names its call by ``id``
        key = "id" if kind == "local_shell_call_output" and "call_id" not in item else "call_id"
        call_id = _string(item, key, where)
        if "output" not in item:
            raise refuse.missing(f"{where}.output")
        output = _output_text(item["output"], f"{where}.output")
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})


def _messages(
    request: JSON, sealer: Sealer, model: str, names: ToolNames, notes: JSON
) -> list[JSON]:
    messages: list[JSON] = []
    instructions = request.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise refuse.wrong_type("instructions", "a string", instructions)
        if instructions:
            messages.append({"role": "system", "content": instructions})
    items = request.get("input")
    if items is None:
        raise refuse.missing("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise refuse.wrong_type("input", "one of a string or an array", items)
    history = _History(sealer, model, names)
    for i, item in enumerate(items):
        history.add(i, item)
    messages += history.end()
    if history.dropped:
        notes[ITEMS_DROPPED] = history.dropped
    if not messages:
        raise refuse.empty_array("input")
    return messages


# -- tools and the answer's form


def _tools(request: JSON, body: JSON, notes: JSON) -> ServedTools | None:
    """``tools`` and ``tool_choice`` into the body; what the answer needs of them."""
    if request.get("tools") is None:
        served = None
    else:
        served = served_tools(request["tools"])
        if served.chat:
            body["tools"] = served.chat
        if served.dropped:
            notes[TOOLS_DROPPED] = served.dropped
        spaces = sorted({ns for ns, _ in served.names.by_namespaced})
        if spaces:
            notes[TOOLS_FLATTENED] = spaces
    choice = request.get("tool_choice")
    if choice is not None:
        empty = ServedTools([], [], NO_NAMES, [], frozenset())
        chat_choice, narrowed = chat_tool_choice(choice, served or empty)
        if narrowed:
            body["tools"] = narrowed
        elif narrowed is not None:
            body.pop("tools", None)
        if "tools" in body or chat_choice == "none":
            body["tool_choice"] = chat_choice
        elif chat_choice == "required":
            # every tool was dropped: nothing is left that could be called
            raise refuse.unsupported_value(
                "tool_choice",
                "required",
                "None of the request's tools is one the gateway runs (they were: "
                f"{', '.join(served.dropped if served else [])}).",
            )
    return served


_FORMATS = ("text", "json_schema", "json_object")


def _response_format(fmt: Any) -> JSON | None:
    """The chat ``response_format`` of ``text.format``."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise refuse.wrong_type("text.format", "an object", fmt)
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise refuse.invalid_value("text.format.type", kind, _FORMATS)
    schema = fmt.get("schema")
    if schema is None:
        raise refuse.missing("text.format.schema")
    if not isinstance(schema, dict):
        raise refuse.wrong_type("text.format.schema", "an object", schema)
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
        raise refuse.wrong_type("text", "an object", text)
    _only(text, _TEXT_KEYS, "text")
    response_format = _response_format(text.get("format"))
    if response_format is not None:
        body["response_format"] = response_format
    verbosity = text.get("verbosity")
    if verbosity is not None:
        if verbosity not in ("low", "medium", "high"):
            raise refuse.invalid_value("text.verbosity", verbosity, ("low", "medium", "high"))
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
        raise refuse.wrong_type("reasoning", "an object", reasoning)
    _only(reasoning, _REASONING_KEYS, "reasoning")
    if reasoning.get("context") not in (None, "auto"):
        raise refuse.unsupported_value(
            "reasoning.context",
            reasoning["context"],
            "The gateway decides which earlier reasoning goes back to the model "
            "(docs/reasoning.md): use 'auto' or leave it out.",
        )
    if reasoning.get("mode") not in (None, "standard"):
        raise refuse.unsupported_value(
            "reasoning.mode", reasoning["mode"], "Only the standard reasoning mode is served."
        )
    effort = reasoning.get("effort")
    if effort is not None:
        if not isinstance(effort, str):
            raise refuse.wrong_type("reasoning.effort", "a string", effort)
        body["reasoning_effort"] = effort
    return {"effort": effort, "summary": None}


def _only(obj: JSON, keys: frozenset[str], where: str) -> None:
    for key in obj:
        if key not in keys:
            raise refuse.unknown_parameter(f"{where}.{key}")


# -- the whole request


def _sampling(request: JSON, body: JSON) -> None:
    """The fields that keep their name and meaning (their types are checked as chat's)."""
    for key in ("temperature", "top_p", "parallel_tool_calls", "user"):
        if request.get(key) is not None:
            body[key] = request[key]
    limit = request.get("max_output_tokens")
    if limit is not None:
        if not is_int(limit):
            raise refuse.wrong_type("max_output_tokens", "an integer", limit)
        # the name OpenAI's reasoning models take; llama.cpp, Anthropic and Gemini read it too
        body["max_completion_tokens"] = limit
    if request.get("stream") is not None:
        body["stream"] = request["stream"]
    if request.get("stream") is True:
        # a streamed Response ends with its usage
        body["stream_options"] = {"include_usage": True}


def to_chat_request(request: Any, sealer: Sealer, notes: JSON | None = None) -> tuple[Any, Echo]:
    """(the chat-completions body of a Responses request, what its Response repeats);
    an ``InvalidRequest`` naming the field for one the gateway refuses. What the
    gateway left out of the request is written into ``notes`` (the record's
    ``adjustments``).

    A body that is not an object, or names no model, is returned for the chat checks to
    refuse in their words.
    """
    notes = {} if notes is None else notes
    if not isinstance(request, dict):
        return request, Echo(model="")
    _check_fields(request, notes)
    model = request.get("model")
    if not isinstance(model, str) or not model:
        return {k: v for k, v in request.items() if k == "model"}, Echo(model="")
    body: JSON = {"model": model}
    # the tools first: the history names namespaced calls by their flat names
    served = _tools(request, body, notes)
    names = served.names if served is not None else NO_NAMES
    body["messages"] = _messages(request, sealer, model, names, notes)
    _sampling(request, body)
    text = _text_options(request.get("text"), body)
    reasoning = _reasoning(request.get("reasoning"), body)
    metadata = request.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise refuse.wrong_type("metadata", "an object", metadata)
    echo_tools = served.echo if served is not None else []
    return body, _echo(request, model, echo_tools, names, text, reasoning)


def _echo(
    request: JSON,
    model: str,
    tools: list[JSON],
    names: ToolNames,
    text: JSON,
    reasoning: JSON | None,
) -> Echo:
    def number(key: str) -> float | None:
        value = request.get(key)
        return value if is_number(value) else None

    limit = request.get("max_output_tokens")
    parallel = request.get("parallel_tool_calls")
    instructions = request.get("instructions")
    user = request.get("user")
    truncation = request.get("truncation")
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
        truncation=truncation if truncation == "auto" else "disabled",
        names=names,
    )
