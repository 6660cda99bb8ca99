"""How an assistant turn is found again when the caller sends it back (pure).

A turn with tool calls is keyed by their ids; a turn without, by a hash of its
text (whitespace at the ends ignored, since callers trim it now and then).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def keys_for(tool_call_ids: Sequence[str], text: str) -> list[str]:
    """The store keys of a turn with these tool-call ids and this text."""
    ids = [i for i in tool_call_ids if i]
    if ids:
        return [f"tool:{i}" for i in ids]
    digest = hashlib.sha256(text.strip().encode("utf-8")).hexdigest()[:32]
    return [f"text:{digest}"]


def message_keys(message: dict[str, Any]) -> list[str]:
    """The store keys of an assistant message as a caller sends it back."""
    calls = message.get("tool_calls")
    ids = [c.get("id", "") for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    return keys_for([i for i in ids if isinstance(i, str)], text_of(message.get("content")))
