"""A Messages request's ``tools`` and ``tool_choice`` as the chat form's (pure).

A custom tool is a function. Anthropic's client tools whose schema Anthropic defines
(bash, the text editor) are functions with that schema: the caller runs them as it
runs any tool. A server tool (web search and fetch, code execution, tool search, an
MCP toolset) runs on Anthropic's servers, which the gateway is not: it is left out,
with a note in the record's ``adjustments``, since the model can answer without it —
unless ``tool_choice`` names it, which no answer could honour (refused by name). A
tool deferred for tool search (``defer_loading``) is loaded: the model sees every
tool, which is what a search would have found.
"""

from __future__ import annotations

from typing import Any

import orjson

from boundedcode_gateway.fronts.messages.wording import (
    expected_tags,
    extra_input,
    field_required,
    not_served,
    wrong_type,
)

SERVER_TOOLS_ADJUSTMENT = "server_tools_dropped"
DEFERRED_ADJUSTMENT = "deferred_tools_loaded"
# the record's note for tools only code execution may call, which the gateway does not run
CODE_ONLY_ADJUSTMENT = "code_execution_only_tools_dropped"

# a custom tool's keys: what the model reads, and what changes nothing but how
# Anthropic caches, streams or loads it
_CUSTOM_KEYS = frozenset(
    {
        "name",
        "description",
        "input_schema",
        "strict",
        "type",
        "cache_control",
        "eager_input_streaming",
        "defer_loading",
        "input_examples",
        "allowed_callers",
    }
)
# the keys Anthropic's own tools may have besides their type and name
_DEFINED_KEYS = frozenset(
    {
        "type",
        "name",
        "cache_control",
        "defer_loading",
        "allowed_callers",
        "input_examples",
        "strict",
        "max_characters",
    }
)
# what runs on Anthropic's servers, by the start of its type
_SERVER_PREFIXES = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_")
_SERVER_TYPES = frozenset({"mcp_toolset", "tool_search_tool_regex", "tool_search_tool_bm25"})
# client tools with a schema of Anthropic's the gateway does not have: what the model
# would do with them is not what it could do with a guess
_CLIENT_PREFIXES = ("memory_", "computer_", "browser_toolset_")

_BASH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "The bash command to run."},
        "restart": {"type": "boolean", "description": "Restart the shell first."},
    },
}
_EDITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
        },
        "path": {"type": "string", "description": "Absolute path of the file or folder."},
        "file_text": {"type": "string", "description": "The file's text, for create."},
        "old_str": {"type": "string", "description": "The exact text to replace."},
        "new_str": {"type": "string", "description": "The text replacing old_str."},
        "insert_line": {"type": "integer", "description": "The line to insert after."},
        "insert_text": {"type": "string", "description": "The text to insert."},
        "view_range": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "The first and last line to view ([start, -1]: to the end).",
        },
    },
    "required": ["command", "path"],
}
# Anthropic's tools the gateway serves with their schema: (description, schema)
_DEFINED: dict[str, tuple[str, dict[str, Any]]] = {
    "bash_20250124": ("Run a command in a persistent bash shell.", _BASH_SCHEMA),
    "text_editor_20250124": ("View, create and edit text files.", _EDITOR_SCHEMA),
    "text_editor_20250429": ("View, create and edit text files.", _EDITOR_SCHEMA),
    "text_editor_20250728": ("View, create and edit text files.", _EDITOR_SCHEMA),
}
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def _is_server_tool(kind: str) -> bool:
    return kind in _SERVER_TYPES or kind.startswith(_SERVER_PREFIXES)


def _examples(tool: dict[str, Any], where: str) -> str:
    """``input_examples`` as the description's last paragraph: what the model reads."""
    examples = tool.get("input_examples")
    if examples is None:
        return ""
    if not isinstance(examples, list):
        raise wrong_type(f"{where}.input_examples", "array")
    lines = [orjson.dumps(e).decode() for e in examples]
    return "\n\nExamples of input:\n" + "\n".join(lines) if lines else ""


def _direct(tool: dict[str, Any], where: str) -> bool:
    """Whether the model may call the tool itself (``allowed_callers`` without
    "direct" leaves it to code execution)."""
    callers = tool.get("allowed_callers")
    if callers is None:
        return True
    if not isinstance(callers, list):
        raise wrong_type(f"{where}.allowed_callers", "array")
    return "direct" in callers


def _name(tool: dict[str, Any], where: str) -> str:
    name = tool.get("name")
    if name is None:
        raise field_required(f"{where}.name")
    if not isinstance(name, str) or not name:
        raise wrong_type(f"{where}.name", "string")
    return name


def _function(
    name: str, description: str | None, schema: Any, strict: Any, where: str
) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    function["parameters"] = schema
    if strict is not None and not isinstance(strict, bool):
        raise wrong_type(f"{where}.strict", "boolean")
    if strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def _custom(tool: dict[str, Any], where: str) -> dict[str, Any]:
    for key in sorted(tool):
        if key not in _CUSTOM_KEYS:
            raise extra_input(f"{where}.custom.{key}")
    name = _name(tool, where)
    schema = tool.get("input_schema")
    if schema is None:
        raise field_required(f"{where}.custom.input_schema")
    if not isinstance(schema, dict):
        raise wrong_type(f"{where}.custom.input_schema", "object")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise wrong_type(f"{where}.custom.description", "string")
    examples = _examples(tool, where)
    text = (description or "") + examples if description is not None or examples else None
    return _function(name, text, schema, tool.get("strict"), where)


def _defined(tool: dict[str, Any], kind: str, where: str) -> dict[str, Any]:
    for key in sorted(tool):
        if key not in _DEFINED_KEYS:
            raise extra_input(f"{where}.{kind}.{key}")
    description, schema = _DEFINED[kind]
    text = description + _examples(tool, where)
    return _function(_name(tool, where), text, schema, tool.get("strict"), where)


class _Tools:
    """The chat tools of a request, and what was left out."""

    def __init__(self) -> None:
        self.functions: list[dict[str, Any]] = []
        # name → type, of the server tools left out
        self.server: dict[str, str] = {}
        self.code_only: list[str] = []
        self.deferred = 0

    def add(self, tool: Any, where: str) -> None:
        if not isinstance(tool, dict):
            raise wrong_type(where, "object")
        kind = tool.get("type")
        if kind is not None and not isinstance(kind, str):
            raise wrong_type(f"{where}.type", "string")
        if kind is not None and kind != "custom" and _is_server_tool(kind):
            self.server[str(tool.get("name") or kind)] = kind
            return
        if kind is not None and kind != "custom" and kind.startswith(_CLIENT_PREFIXES):
            raise not_served(f"{where}.type", f"Anthropic's tool '{kind}'")
        if kind is not None and kind != "custom" and kind not in _DEFINED:
            raise expected_tags(where, kind, ("custom", *_DEFINED, "web_search_20250305"))
        function = _custom(tool, where) if kind in (None, "custom") else _defined(tool, kind, where)
        if not _direct(tool, where):
            self.code_only.append(function["function"]["name"])
            return
        if tool.get("defer_loading") is True:
            self.deferred += 1
        self.functions.append(function)

    def notes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.server:
            out[SERVER_TOOLS_ADJUSTMENT] = [f"{n} ({k})" for n, k in self.server.items()]
        if self.code_only:
            out[CODE_ONLY_ADJUSTMENT] = self.code_only
        if self.deferred:
            out[DEFERRED_ADJUSTMENT] = self.deferred
        return out


def _choice(choice: Any, tools: _Tools, out: dict[str, Any]) -> None:
    if not isinstance(choice, dict):
        raise wrong_type("tool_choice", "object")
    kind = choice.get("type")
    if kind is None:
        raise field_required("tool_choice.type")
    if kind == "tool":
        name = choice.get("name")
        if name is None:
            raise field_required("tool_choice.tool.name")
        if not isinstance(name, str):
            raise wrong_type("tool_choice.tool.name", "string")
        if name in tools.server:
            what = f"forcing the server tool '{name}' ({tools.server[name]})"
            raise not_served("tool_choice.name", what)
        if name in tools.code_only:
            raise not_served(
                "tool_choice.name", f"forcing '{name}', which only code execution calls"
            )
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif kind in _TOOL_CHOICE:
        if kind == "any" and not tools.functions and tools.server:
            raise not_served(
                "tool_choice.type", "forcing a tool use where only server tools are given"
            )
        out["tool_choice"] = _TOOL_CHOICE[kind]
    else:
        raise expected_tags("tool_choice", str(kind), ("auto", "any", "tool", "none"))
    serial = choice.get("disable_parallel_tool_use")
    if serial is not None and not isinstance(serial, bool):
        raise wrong_type(f"tool_choice.{kind}.disable_parallel_tool_use", "boolean")
    if serial:
        out["parallel_tool_calls"] = False


def to_chat_tools(request: dict[str, Any], out: dict[str, Any], notes: dict[str, Any]) -> None:
    """``tools`` and ``tool_choice`` into ``out`` (the chat body); what was left out
    into ``notes``."""
    tools = _Tools()
    given = request.get("tools")
    if given is not None:
        if not isinstance(given, list):
            raise wrong_type("tools", "array")
        for i, tool in enumerate(given):
            tools.add(tool, f"tools.{i}")
    if tools.functions:
        out["tools"] = tools.functions
    choice = request.get("tool_choice")
    if choice is not None:
        _choice(choice, tools, out)
    notes.update(tools.notes())
