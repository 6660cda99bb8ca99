"""Where each point of a streamed answer falls in the fake llama-server's stream (pure).

The fake streams an answer as: its prompt progress (when asked for), a role chunk, one
chunk per `tokens_per_chunk` tokens of reasoning, then of content, then per tool call a
head chunk and one chunk per piece of its arguments, then the finish chunk and the usage
chunk. `layout` labels those chunks as the fake sends them; `break_after` says how many
chunks to send before dropping the connection so that the break lands at a given point.
tests/agents/test_scripted_model.py holds the labels to the fake's own stream.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from tests.fakes.common import JSON, Reply, fragments, reply_tool_calls


class BreakPoint(Enum):
    """Where in a streamed answer the upstream's connection drops."""

    NONE = "none"
    # the headers and the role chunk sent, nothing of the answer
    BEFORE_CONTENT = "before_content"
    # half of the reasoning sent
    IN_REASONING = "in_reasoning"
    # half of the text sent
    IN_TEXT = "in_text"
    # one block whole (the text, or else the reasoning), the next one not begun
    BETWEEN_BLOCKS = "between_blocks"
    # a tool call's head and half of its arguments sent
    IN_TOOL_ARGS = "in_tool_args"
    # every block whole, no finish chunk
    AFTER_LAST_BLOCK = "after_last_block"


# one label per chunk: "progress", "role", "reasoning", "content", "tool_head", "tool_args",
# "finish", "usage"
Layout = list[str]
_BLOCKS = ("reasoning", "content", "tool_head")


def thinks(body: JSON, server_thinks: bool) -> bool:
    """Whether the fake reasons for this request (its `enable_thinking` rule)."""
    kwargs: Any = body.get("chat_template_kwargs")
    enabled = not isinstance(kwargs, dict) or kwargs.get("enable_thinking") is not False
    return server_thinks and enabled and body.get("reasoning_effort") != "none"


def layout(reply: Reply, body: JSON, *, server_thinks: bool, tokens_per_chunk: int) -> Layout:
    """The chunks the fake streams for `reply` to the request `body`, a label each.

    Assumes a prompt progress of two chunks (the fake's `progress_batch` at least the
    prompt's length), an answer within its token limit and a first token that is not an
    incomplete UTF-8 sequence (no emoji first).
    """
    out: Layout = ["progress", "progress"] if body.get("return_progress") is True else []
    out.append("role")
    if thinks(body, server_thinks):
        out += ["reasoning"] * len(fragments(reply.reasoning_content or "", tokens_per_chunk))
    out += ["content"] * len(fragments(reply.content, tokens_per_chunk))
    for call in reply_tool_calls(reply):
        out.append("tool_head")
        out += ["tool_args"] * len(fragments(call.arguments, tokens_per_chunk))
    out.append("finish")
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        out.append("usage")
    return out


def _middle_of(chunks: Layout, label: str) -> int | None:
    where = [i for i, c in enumerate(chunks) if c == label]
    if len(where) < 2:
        return None  # a break inside needs a piece before it and one after
    return where[0] + len(where) // 2


def _between_blocks(chunks: Layout) -> int | None:
    starts = [
        i
        for i in range(1, len(chunks))
        if chunks[i] in _BLOCKS and chunks[i - 1] != chunks[i] and chunks[i - 1] != "role"
    ]
    if not starts:
        return None
    # the boundary into a tool call first: what an agent has shown of a text block then
    # is whole, and the call is not begun
    into_tool = [i for i in starts if chunks[i] == "tool_head"]
    return (into_tool or starts)[0]


def break_after(point: BreakPoint, chunks: Layout) -> int | None:
    """How many chunks to send before the break lands at `point`; None when this answer
    has no such point (no reasoning to break inside, no tool call, a single block)."""
    if point is BreakPoint.NONE:
        return None
    if point is BreakPoint.BEFORE_CONTENT:
        if not any(c in _BLOCKS for c in chunks):
            return None
        return chunks.index("role") + 1
    if point is BreakPoint.IN_REASONING:
        return _middle_of(chunks, "reasoning")
    if point is BreakPoint.IN_TEXT:
        return _middle_of(chunks, "content")
    if point is BreakPoint.BETWEEN_BLOCKS:
        return _between_blocks(chunks)
    if point is BreakPoint.IN_TOOL_ARGS:
        first_head = chunks.index("tool_head") if "tool_head" in chunks else None
        if first_head is None:
            return None
        args = [i for i, c in enumerate(chunks) if c == "tool_args" and i > first_head]
        # the first call's own arguments: those right after its head
        own = [i for n, i in enumerate(args) if i == first_head + 1 + n]
        return own[0] + len(own) // 2 if len(own) >= 2 else None
    return chunks.index("finish")
