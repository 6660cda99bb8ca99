"""Lines of a system prompt that change on every request and mean nothing to the model.

A local server serves a prompt from its cache only as far as it matches the previous
one token for token. A line near the start of the system prompt that differs on
each request (a client's billing nonce) stops the match there, and the whole
conversation is evaluated again on every turn. For local upstreams the gateway
removes each line that a rule below recognises before the prompt is rendered; the
call log's ``adjustments`` names the rules that removed something
(``volatile_lines_removed``). Other upstreams get the prompt as sent.

The rules are data: each names where the line comes from, a literal every such
line contains (a cheap test before the pattern), and the pattern of the whole line.
docs/fronts.md lists them; each has a test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

ADJUSTMENT = "volatile_lines_removed"


@dataclass(frozen=True, slots=True)
class VolatileLine:
    """A kind of line that differs on every request."""

    name: str
    # who writes it, and why it changes (for docs and logs)
    source: str
    marker: str
    pattern: re.Pattern[str]


RULES: tuple[VolatileLine, ...] = (
    VolatileLine(
        "claude_code_billing_header",
        "Claude Code's first system block: a billing header whose cch= value is a hash of "
        "the request, new on every request",
        "x-anthropic-billing-header:",
        re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*(?:\n|$)", re.MULTILINE),
    ),
)

SYSTEM_ROLES = frozenset({"system", "developer"})


def strip_text(text: str, rules: tuple[VolatileLine, ...] = RULES) -> tuple[str, list[str]]:
    """``text`` without the lines the rules recognise; the names of the rules that
    removed one."""
    removed: list[str] = []
    for rule in rules:
        if rule.marker not in text:
            continue
        stripped = rule.pattern.sub("", text)
        if stripped != text:
            text = stripped
            removed.append(rule.name)
    return text, removed


def strip_system_messages(
    messages: list[Any], rules: tuple[VolatileLine, ...] = RULES
) -> tuple[list[Any], list[str]]:
    """The messages with the recognised lines removed from each system message (text, or
    text parts; a part left empty is dropped); the names of the rules that removed
    one. The list is the same object when nothing was removed."""
    removed: list[str] = []
    out: list[Any] | None = None
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in SYSTEM_ROLES:
            continue
        content = message.get("content")
        new_content, names = _strip_content(content, rules)
        if not names:
            continue
        if out is None:
            out = list(messages)
        out[i] = {**message, "content": new_content}
        removed += [n for n in names if n not in removed]
    return (messages if out is None else out), removed


def _strip_content(content: Any, rules: tuple[VolatileLine, ...]) -> tuple[Any, list[str]]:
    if isinstance(content, str):
        return strip_text(content, rules)
    if not isinstance(content, list):
        return content, []
    removed: list[str] = []
    parts: list[Any] = []
    for part in content:
        text = part.get("text") if isinstance(part, dict) else None
        if not isinstance(text, str) or part.get("type") != "text":
            parts.append(part)
            continue
        stripped, names = strip_text(text, rules)
        removed += names
        if stripped.strip() or not names:
            parts.append({**part, "text": stripped} if names else part)
    # a message that held nothing else keeps an empty text, as templates expect one
    return (parts if parts else ""), removed
