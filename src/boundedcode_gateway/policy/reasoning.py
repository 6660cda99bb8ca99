"""Which earlier reasoning goes back to the model.

Reasoning is never sent where it is not taken: an upstream that does not take
it gets the field removed, and user and tool messages never carry it.
"""

from __future__ import annotations

from typing import Any

REASONING_FIELD = "reasoning_content"


def outgoing_messages(messages: list[Any], takes_reasoning: bool) -> list[Any]:
    """The messages with ``reasoning_content`` kept only on assistant turns of a taker.

    Returns the same list when nothing changes, so the common case copies nothing.
    """
    out: list[Any] | None = None
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or REASONING_FIELD not in msg:
            continue
        if takes_reasoning and msg.get("role") == "assistant":
            continue
        if out is None:
            out = list(messages)
        out[i] = {k: v for k, v in msg.items() if k != REASONING_FIELD}
    return messages if out is None else out
