"""System messages after the conversation began, for a chat template that takes one
system message only, at the start (pure).

Most llama.cpp templates raise ("System message must be at the beginning") or drop a
system message anywhere else. Such a message is folded into a user turn as a marked
block instead: into the user message that comes next (past the tool results that
answer the turn before it); where the next message is the model's, or there is none,
into the user message just before it; else into a user message of its own at that
place. Each fold depends only on the messages up to the model's next answer, so as
the conversation grows the prompt of earlier turns renders the same, and llama.cpp's
cache of it still matches. It is never moved into the leading system prompt, which
would change the start of every later prompt.

Several system messages at the start are joined into one there.
"""

from __future__ import annotations

from typing import Any

# the record's note: how many system messages were folded into user turns
ADJUSTMENT = "system_messages_folded"
_SYSTEM_ROLES = frozenset({"system", "developer"})


def marked(text: str) -> str:
    """A system message's text as the block a user turn carries."""
    return f"<system-message>\n{text}\n</system-message>"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _parts(content: Any) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": _text(content)}]


def _with_blocks(message: dict[str, Any], blocks: list[str], before: bool) -> dict[str, Any]:
    """``message`` (a user turn) with the blocks before or after its own content."""
    joined = "\n\n".join(blocks)
    content = message.get("content")
    if isinstance(content, str) or content is None:
        own = content or ""
        if not own:
            return {**message, "content": joined}
        text = f"{joined}\n\n{own}" if before else f"{own}\n\n{joined}"
        return {**message, "content": text}
    part = {"type": "text", "text": joined}
    parts = [part, *content] if before else [*content, part]
    return {**message, "content": parts}


def _leading(messages: list[Any]) -> tuple[list[Any], int]:
    """The system messages at the start joined into one; and where the rest begins."""
    start = 0
    while start < len(messages) and _is_system(messages[start]):
        start += 1
    if start <= 1:
        return messages[:start], start
    contents = [m.get("content") for m in messages[:start]]
    if all(isinstance(c, str) for c in contents):
        joined: Any = "\n\n".join(c for c in contents if c)
    else:
        joined = [part for c in contents for part in _parts(c)]
    return [{**messages[0], "content": joined}], start


def _is_system(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") in _SYSTEM_ROLES


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def fold_system_messages(messages: list[Any]) -> tuple[list[Any], int]:
    """The messages with every system message after the start folded into a user turn,
    and how many were; the same list when there is none."""
    out, start = _leading(messages)
    pending: list[str] = []
    # the user message right before the pending system messages, by its place in out
    before: int | None = None
    folded = 0

    def flush() -> None:
        nonlocal pending
        if before is not None and before == len(out) - 1:
            out[before] = _with_blocks(out[before], pending, before=False)
        else:
            out.append({"role": "user", "content": "\n\n".join(pending)})
        pending = []

    for message in messages[start:]:
        role = _role(message)
        if role in _SYSTEM_ROLES:
            if not pending:
                before = len(out) - 1 if out and _role(out[-1]) == "user" else None
            pending.append(marked(_text(message.get("content"))))
            folded += 1
        elif role == "tool" or not pending:
            out.append(message)
        elif role == "user":
            out.append(_with_blocks(message, pending, before=True))
            pending = []
        else:
            flush()
            out.append(message)
    if pending:
        flush()
    if folded == 0 and start <= 1:
        return messages, 0
    return out, folded
