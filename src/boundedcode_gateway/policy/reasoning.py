"""Which earlier reasoning goes back to the model (pure).

Reasoning is never sent where it is not taken: an upstream that does not take
it gets the field removed, user and tool messages never carry it, and a turn
written by another model profile loses its reasoning when it goes elsewhere.
Where the target takes it, a turn the caller sent without reasoning (a
bounded-mode agent drops it) gets its own back from the host-side store;
"absent" and ``""`` stay distinct, since an empty block breaks the cache too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from boundedcode_gateway.reasoning_store.keys import message_keys

REASONING_FIELD = "reasoning_content"
# the store's kind for OpenAI-style reasoning text
REASONING_KIND = "reasoning_content"


@dataclass(frozen=True, slots=True)
class StoredReasoning:
    """What the store knows of one turn: who wrote it, and the text."""

    profile: str
    text: str


Lookup = Callable[[Sequence[str]], StoredReasoning | None]


def no_lookup(keys: Sequence[str]) -> StoredReasoning | None:
    """A store that knows nothing (calls that restore no reasoning)."""
    return None


def _without(msg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in msg.items() if k != REASONING_FIELD}


def _assistant_turn(
    messages: list[Any], i: int, profile: str, lookup: Lookup, required_on_tool_turns: bool
) -> dict[str, Any]:
    """The assistant message at ``i`` as it goes to a target that takes reasoning."""
    msg: dict[str, Any] = messages[i]
    stored = lookup(message_keys(messages, i))
    if REASONING_FIELD in msg:
        # the caller kept its copy (direct mode); unless another profile wrote the turn
        if stored is not None and stored.profile != profile:
            return _without(msg)
        return msg
    if stored is not None and stored.profile == profile:
        return {**msg, REASONING_FIELD: stored.text}
    if required_on_tool_turns and msg.get("tool_calls"):
        # such services refuse a tool-call turn without it (DeepSeek, Kimi)
        return {**msg, REASONING_FIELD: ""}
    return msg


def outgoing_messages(
    messages: list[Any],
    takes_reasoning: bool,
    *,
    profile: str = "",
    lookup: Lookup = no_lookup,
    required_on_tool_turns: bool = False,
) -> list[Any]:
    """The messages as they go to the target; the same list when nothing changes."""
    out: list[Any] | None = None
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            continue
        if takes_reasoning and msg.get("role") == "assistant":
            new = _assistant_turn(messages, i, profile, lookup, required_on_tool_turns)
        elif REASONING_FIELD in msg:
            new = _without(msg)
        else:
            continue
        if new is not msg:
            if out is None:
                out = list(messages)
            out[i] = new
    return messages if out is None else out
