"""How an assistant turn is found again when the caller sends it back (pure).

A turn with tool calls is keyed by their ids; a turn without, by a hash of its
text together with the text of the message it answered (so two short answers that
read the same, to different questions, stay apart). Whitespace at the ends is
ignored, since callers trim it now and then.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from boundedcode_gateway.wire.chat import text_of


def keys_for(tool_call_ids: Sequence[str], text: str, answered: str) -> list[str]:
    """The store keys of a turn with these tool-call ids and this text, answering ``answered``."""
    ids = [i for i in tool_call_ids if i]
    if ids:
        return [f"tool:{i}" for i in ids]
    both = answered.strip() + "\x00" + text.strip()
    return ["text:" + hashlib.sha256(both.encode("utf-8")).hexdigest()[:32]]


def tool_call_ids(message: dict[str, Any]) -> list[str]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)]


def message_keys(messages: Sequence[Any], index: int) -> list[str]:
    """The store keys of the assistant message at ``index`` as a caller sends it back."""
    message = messages[index]
    before = messages[index - 1] if index > 0 else None
    answered = text_of(before.get("content")) if isinstance(before, dict) else ""
    return keys_for(tool_call_ids(message), text_of(message.get("content")), answered)
