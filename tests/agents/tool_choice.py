"""Which of an agent's tools writes a file, which reads it, and with what arguments (pure).

Chosen from each tool's JSON schema — its property names and types — rather than from
its name alone, so one rule serves Claude Code's `Write`/`Read`/`Bash`, Codex's
`exec_command`/`shell`/`apply_patch`, qwen-code's `write_file`/`read_file`/
`run_shell_command`, opencode's `write`/`read`/`bash` and OpenHands'
`str_replace_editor`/`file_editor`/`execute_bash`/`terminal`. A dedicated file tool is
preferred over a patch tool, and a patch tool over the shell.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.common import JSON

_PATH_KEYS = ("file_path", "filePath", "absolute_path", "path", "filename", "target_file")
_CONTENT_KEYS = ("content", "file_text", "contents", "text", "new_content")
_SHELL_KEYS = ("command", "cmd")
# properties of editing tools that replace a part of a file, not write it whole
_EDIT_KEYS = frozenset({"old_string", "old_str", "oldString", "edits", "new_string", "new_str"})
_READ_WORDS = ("read", "view", "cat", "open")
_NOT_READ_WORDS = ("list", "glob", "grep", "search", "find", "ls", "notebook", "image")


@dataclass(frozen=True)
class Tool:
    """A function tool of the request: its name and its parameters' schema."""

    name: str
    properties: dict[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ()

    def has(self, key: str) -> bool:
        return key in self.properties

    def first(self, keys: Sequence[str]) -> str | None:
        return next((k for k in keys if k in self.properties), None)

    def type_of(self, key: str) -> str:
        kind = self.properties.get(key, {}).get("type")
        if isinstance(kind, list):  # ["string", "null"]
            kind = next((k for k in kind if k != "null"), "string")
        return str(kind or "string")

    def enum_of(self, key: str) -> list[Any]:
        values = self.properties.get(key, {}).get("enum")
        return values if isinstance(values, list) else []


@dataclass(frozen=True)
class ToolUse:
    """One call to make: the tool, its arguments, and what kind of tool it was taken as."""

    name: str
    arguments: JSON
    kind: str  # "write", "editor", "patch", "shell", "read"


def _dict(value: Any) -> JSON:
    return dict(value) if isinstance(value, dict) else {}


def tools_of(body: JSON) -> list[Tool]:
    """The function tools of an OpenAI-shaped chat request."""
    out: list[Tool] = []
    for spec in body.get("tools") or []:
        fn = spec.get("function") if isinstance(spec, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = _dict(fn.get("parameters"))
        props = _dict(params.get("properties"))
        required = params.get("required")
        names = tuple(str(r) for r in required) if isinstance(required, list) else ()
        out.append(Tool(fn["name"], props, names))
    return out


def filler(tool: Tool, key: str) -> Any:
    """A value for a required property the task does not speak to, fitting its schema."""
    schema = tool.properties.get(key, {})
    if "default" in schema:
        return schema["default"]
    if tool.enum_of(key):
        return tool.enum_of(key)[0]
    kind = tool.type_of(key)
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "array":
        return []
    if kind == "object":
        return {}
    return "Write the file the user asked for"


def _complete(tool: Tool, arguments: JSON, kind: str) -> ToolUse:
    for key in tool.required:
        if key not in arguments:
            arguments[key] = filler(tool, key)
    return ToolUse(tool.name, arguments, kind)


def _is_editor(tool: Tool) -> bool:
    """An editor tool with a `command` enum: `create` writes, `view` reads."""
    return "create" in tool.enum_of("command") and tool.first(_PATH_KEYS) is not None


def _is_writer(tool: Tool) -> bool:
    return (
        tool.first(_PATH_KEYS) is not None
        and tool.first(_CONTENT_KEYS) is not None
        and not _EDIT_KEYS & tool.properties.keys()
        and not tool.has("command")
    )


def _is_patcher(tool: Tool) -> bool:
    keys = set(tool.properties)
    return "patch" in tool.name.lower() and len(keys & {"input", "patch"}) == 1


def _is_shell(tool: Tool) -> bool:
    key = tool.first(_SHELL_KEYS)
    return key is not None and not _is_editor(tool) and tool.type_of(key) in ("string", "array")


def _is_reader(tool: Tool) -> bool:
    name = tool.name.lower()
    return (
        tool.first(_PATH_KEYS) is not None
        and tool.first(_CONTENT_KEYS) is None
        and not tool.has("command")
        and any(w in name for w in _READ_WORDS)
        and not any(w in name for w in _NOT_READ_WORDS)
    )


def _shell_use(tool: Tool, script: str) -> ToolUse:
    key = tool.first(_SHELL_KEYS)
    assert key is not None
    value: Any = ["bash", "-lc", script] if tool.type_of(key) == "array" else script
    return _complete(tool, {key: value}, "shell")


def _named_first(tools: list[Tool], word: str) -> list[Tool]:
    return sorted(tools, key=lambda t: word not in t.name.lower())


def write_call(tools: Sequence[Tool], path: str, text: str) -> ToolUse | None:
    """The call that writes `text` to the file `path`; None when no tool can."""
    writers = _named_first([t for t in tools if _is_writer(t)], "write")
    if writers:
        tool = writers[0]
        path_key, content_key = tool.first(_PATH_KEYS), tool.first(_CONTENT_KEYS)
        assert path_key and content_key
        return _complete(tool, {path_key: path, content_key: text}, "write")
    editor = next((t for t in tools if _is_editor(t)), None)
    if editor is not None:
        path_key = editor.first(_PATH_KEYS)
        content_key = editor.first(_CONTENT_KEYS) or "file_text"
        assert path_key
        args = {"command": "create", path_key: path, content_key: text}
        return _complete(editor, args, "editor")
    patcher = next((t for t in tools if _is_patcher(t)), None)
    if patcher is not None:
        key = "input" if patcher.has("input") else "patch"
        added = "".join(f"+{line}\n" for line in text.split("\n"))
        patch = f"*** Begin Patch\n*** Add File: {path}\n{added}*** End Patch\n"
        return _complete(patcher, {key: patch}, "patch")
    shell = next((t for t in _named_first(list(tools), "exec") if _is_shell(t)), None)
    if shell is not None:
        return _shell_use(shell, f"printf '%s' {shlex.quote(text)} > {shlex.quote(path)}")
    return None


def read_call(tools: Sequence[Tool], path: str) -> ToolUse | None:
    """The call that reads the file `path` back; None when no tool can."""
    reader = next((t for t in _named_first(list(tools), "read") if _is_reader(t)), None)
    if reader is not None:
        path_key = reader.first(_PATH_KEYS)
        assert path_key
        return _complete(reader, {path_key: path}, "read")
    editor = next((t for t in tools if _is_editor(t) and "view" in t.enum_of("command")), None)
    if editor is not None:
        path_key = editor.first(_PATH_KEYS)
        assert path_key
        return _complete(editor, {"command": "view", path_key: path}, "editor")
    shell = next((t for t in _named_first(list(tools), "exec") if _is_shell(t)), None)
    if shell is not None:
        return _shell_use(shell, f"cat {shlex.quote(path)}")
    return None
