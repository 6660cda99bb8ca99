"""A Responses request's tools as chat function tools, and the names between them (pure).

- ``function`` tools are chat function tools.
- ``namespace`` tools (Codex's ``multi_agent_v1``: a group of function tools under one
  name) are flattened: each function in one becomes a chat function whose name is the
  namespace and the function's name joined by ``__`` (``multi_agent_v1__spawn_agent``,
  the flat form Codex itself uses where a namespace cannot be kept), made unique
  against every other name offered. A call of a flat name is given back as OpenAI
  gives a call of a namespaced function: ``name`` the function's own, with
  ``namespace`` beside it (``ToolNames.called``); an input ``function_call`` with a
  ``namespace`` goes to the model by its flat name (``ToolNames.flat``).
- Built-in tools the gateway cannot run (``web_search``, ``file_search``,
  ``code_interpreter``, ``mcp``, ``custom``, …) are dropped, and the drop is noted in
  the call's record (``tools_dropped``); the model is offered the rest. A
  ``tool_choice`` that names a dropped tool is refused, naming it: without the tool the
  request does not make sense.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from boundedcode_gateway import openai_refusals as refuse
from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.text import clip

JSON = dict[str, Any]

# the joint of a flat name, as Codex joins a namespace and a tool's name
JOINT = "__"
# the longest function name OpenAI-shaped upstreams take, and what one may hold
MAX_NAME = 64
_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_-]")
# tools of the Responses API that no upstream here runs: dropped, not refused
BUILT_IN = frozenset(
    {
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "file_search",
        "computer",
        "computer_use_preview",
        "mcp",
        "code_interpreter",
        "programmatic_tool_calling",
        "image_generation",
        "local_shell",
        "shell",
        "custom",
        "tool_search",
        "apply_patch",
    }
)
_CHOICE_MODES = ("none", "auto", "required")


@dataclass(frozen=True, slots=True)
class ToolNames:
    """The flat names of namespaced functions, both ways."""

    by_flat: dict[str, tuple[str, str]] = field(default_factory=dict)
    by_namespaced: dict[tuple[str, str], str] = field(default_factory=dict)

    def flat(self, namespace: str, name: str) -> str:
        """The name the model knows ``namespace``'s ``name`` by."""
        known = self.by_namespaced.get((namespace, name))
        return known if known is not None else joined(namespace, name)

    def called(self, name: str) -> tuple[str, str | None]:
        """(the function's name, its namespace or None) of a call the model made."""
        namespaced = self.by_flat.get(name)
        if namespaced is None:
            return name, None
        return namespaced[1], namespaced[0]


NO_NAMES = ToolNames()


@dataclass(frozen=True, slots=True)
class ServedTools:
    """What of a request's tools the upstream is offered, and how the answer repeats them."""

    chat: list[JSON]
    echo: list[JSON]
    names: ToolNames
    # the types of the tools dropped, in the order first seen
    dropped: list[str]
    # the chat names of the functions offered, for a tool_choice to be checked against
    offered: frozenset[str]


def joined(namespace: str, name: str) -> str:
    """Codex's flat form of a namespaced name: ``ns__name``, stray underscores trimmed."""
    return f"{namespace.rstrip('_')}{JOINT}{name.lstrip('_')}"


def _fitted(name: str) -> str:
    """``name`` as an upstream takes a function's name: only ``[A-Za-z0-9_-]`` (another
    character becomes ``_``), and within the length, a long one keeping its start and
    getting a short digest of the whole, so two long names stay apart."""
    name = _NOT_IN_NAMES.sub("_", name)
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}_{digest}"


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = _fitted(name), 2
    while candidate in taken:
        suffix = f"_{n}"
        candidate = _fitted(name)[: MAX_NAME - len(suffix)] + suffix
        n += 1
    return candidate


def _name(tool: JSON, where: str) -> str:
    name = tool.get("name")
    if name is None:
        raise refuse.missing(f"{where}.name")
    if not isinstance(name, str):
        raise refuse.wrong_type(f"{where}.name", "a string", name)
    return name


def _function(name: str, tool: JSON, preface: str | None = None) -> JSON:
    function: JSON = {"name": name}
    description = tool.get("description")
    if preface and isinstance(description, str) and description:
        function["description"] = f"{preface}\n\n{description}"
    elif preface:
        function["description"] = preface
    elif description is not None:
        function["description"] = description
    for key in ("parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _echoed(tool: JSON, name: str) -> JSON:
    return {
        "type": "function",
        "name": name,
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict"),
    }


def _kind(tool: JSON) -> str:
    kind = tool.get("type")
    return kind if isinstance(kind, str) else ""


def _sorted(tools: list[Any]) -> tuple[list[tuple[int, JSON]], list[tuple[int, JSON]], list[str]]:
    """(the function tools, the namespaces, the types dropped) of ``tools``, by index."""
    plain: list[tuple[int, JSON]] = []
    spaces: list[tuple[int, JSON]] = []
    dropped: list[str] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise refuse.wrong_type(f"tools[{i}]", "an object", tool)
        kind = _kind(tool)
        if kind == "function":
            plain.append((i, tool))
        elif kind == "namespace":
            spaces.append((i, tool))
        elif kind in BUILT_IN:
            if kind not in dropped:
                dropped.append(kind)
        else:
            raise refuse.invalid_value(
                f"tools[{i}].type",
                kind or tool.get("type"),
                ("function", "namespace", *sorted(BUILT_IN)),
            )
    return plain, spaces, dropped


class _Flattening:
    """The chat functions of namespaces, each flat name unique among all those offered."""

    def __init__(self, taken: set[str], dropped: list[str]) -> None:
        self.taken = taken
        self.dropped = dropped
        self.chat: list[JSON] = []
        self.by_flat: dict[str, tuple[str, str]] = {}
        self.by_namespaced: dict[tuple[str, str], str] = {}

    def add(self, i: int, space: JSON) -> JSON:
        """The namespace's functions into the chat tools; the namespace as echoed."""
        namespace = _name(space, f"tools[{i}]")
        inner = space.get("tools")
        if not isinstance(inner, list):
            raise refuse.wrong_type(f"tools[{i}].tools", "an array", inner)
        description = space.get("description")
        preface = description if isinstance(description, str) else None
        echoed: list[JSON] = []
        for j, tool in enumerate(inner):
            where = f"tools[{i}].tools[{j}]"
            if not isinstance(tool, dict):
                raise refuse.wrong_type(where, "an object", tool)
            if _kind(tool) != "function":
                # a custom tool inside a namespace: not run here, as outside one
                kind = _kind(tool) or "custom"
                if kind not in self.dropped:
                    self.dropped.append(kind)
                continue
            name = _name(tool, where)
            flat = _unique(joined(namespace, name), self.taken)
            self.taken.add(flat)
            self.by_flat[flat] = (namespace, name)
            self.by_namespaced[(namespace, name)] = flat
            self.chat.append(_function(flat, tool, preface))
            echoed.append(_echoed(tool, name))
        return {"type": "namespace", "name": namespace, "description": preface, "tools": echoed}


def served_tools(tools: Any) -> ServedTools:
    """The chat tools of ``tools``; a 400 naming the first one that is malformed."""
    if not isinstance(tools, list):
        raise refuse.wrong_type("tools", "an array", tools)
    plain, spaces, dropped = _sorted(tools)
    chat: list[JSON] = []
    echo: list[JSON] = []
    taken: set[str] = set()
    for i, tool in plain:
        name = _name(tool, f"tools[{i}]")
        taken.add(name)
        chat.append(_function(name, tool))
        echo.append(_echoed(tool, name))
    # the plain names first, so a flat name steps aside for one the caller chose
    flattening = _Flattening(taken, dropped)
    echo += [flattening.add(i, space) for i, space in spaces]
    chat += flattening.chat
    by_flat = flattening.by_flat
    names = ToolNames(by_flat, flattening.by_namespaced) if by_flat else NO_NAMES
    return ServedTools(chat, echo, names, dropped, frozenset(taken))


# -- tool_choice


def _not_served(kind: str) -> InvalidRequest:
    return refuse.unsupported_value(
        "tool_choice",
        kind,
        f"The gateway runs no '{clip(kind)}' tool: choose a function tool, or 'none', 'auto' "
        "or 'required'.",
    )


def _chosen_function(choice: JSON, tools: ServedTools, where: str) -> str:
    """The chat name of the function a choice names (a namespaced one by its own name
    with its ``namespace``, or by its flat name)."""
    name = _name(choice, where)
    namespace = choice.get("namespace")
    if isinstance(namespace, str):
        return tools.names.flat(namespace, name)
    if name in tools.offered:
        return name
    # a namespaced function named alone: the one function of that name, if one
    matches = [flat for (_, inner), flat in tools.names.by_namespaced.items() if inner == name]
    return matches[0] if len(matches) == 1 else name


def chat_tool_choice(choice: Any, tools: ServedTools) -> tuple[Any, list[JSON] | None]:
    """(the chat ``tool_choice``, the chat tools when the choice narrows them)."""
    if isinstance(choice, str):
        if choice in _CHOICE_MODES:
            return choice, None
        raise refuse.invalid_value("tool_choice", choice, _CHOICE_MODES)
    if not isinstance(choice, dict):
        raise refuse.wrong_type("tool_choice", "one of a string or an object", choice)
    kind = _kind(choice)
    if kind == "function":
        name = _chosen_function(choice, tools, "tool_choice")
        return {"type": "function", "function": {"name": name}}, None
    if kind == "allowed_tools":
        return _allowed(choice, tools)
    # ``computer_use``: a tool_choice's name of the computer tool
    if kind in BUILT_IN or kind == "computer_use":
        raise _not_served(kind)
    raise refuse.invalid_value(
        "tool_choice.type", choice.get("type"), ("function", "allowed_tools", *sorted(BUILT_IN))
    )


def _allowed(choice: JSON, tools: ServedTools) -> tuple[Any, list[JSON]]:
    """``allowed_tools``: the model offered only those, in the choice's mode."""
    mode = choice.get("mode")
    if mode not in ("auto", "required"):
        raise refuse.invalid_value("tool_choice.mode", mode, ("auto", "required"))
    allowed = choice.get("tools")
    if not isinstance(allowed, list):
        raise refuse.wrong_type("tool_choice.tools", "an array", allowed)
    names: set[str] = set()
    for i, tool in enumerate(allowed):
        where = f"tool_choice.tools[{i}]"
        if not isinstance(tool, dict):
            raise refuse.wrong_type(where, "an object", tool)
        kind = _kind(tool)
        if kind == "function":
            names.add(_chosen_function(tool, tools, where))
        elif kind == "namespace":
            space = _name(tool, where)
            names.update(f for (ns, _), f in tools.names.by_namespaced.items() if ns == space)
        else:
            raise _not_served(kind)
    narrowed = [t for t in tools.chat if t["function"]["name"] in names]
    return mode, narrowed
