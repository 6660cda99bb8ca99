"""Going on with an answer that broke off, on llama.cpp's llama-server (pure).

llama-server continues a final assistant message when the request says
``continue_final_message: true`` together with ``add_generation_prompt: false``
(it refuses the flag with a generation prompt, which is on by default). Its chat
template renders the history, then the start of the assistant's turn with the
partial message in it — the reasoning after the template's reasoning-start
marker, closed when content follows, then the content — and the model goes on
from there. Reasoning alone is continued as reasoning. With the flag it streams
only what it generates; a trailing assistant message without the flag is
continued too, but its text comes again in the first delta.

The answer's token limit counts the continuation alone, so it is lowered by the
deltas already shown (about one token each).

It cannot continue a message with tool calls (400): the relay holds tool calls
back until the finish, so the partial message is text only, and the model writes
its calls in the continuation, which the server parses like any turn's. Only its
Jinja template engine continues at all: a server run with ``--no-jinja`` or
``--skip-chat-parsing`` would render the partial message as a finished turn.
"""

from __future__ import annotations

from typing import Any

import orjson

from boundedcode_gateway.json_values import is_int
from boundedcode_gateway.providers.base import PartialAnswer

# the answer's token limit, under each name llama-server reads
_LIMITS = ("max_tokens", "max_completion_tokens", "n_predict")


def continuation_body(sent: bytes, partial: PartialAnswer) -> bytes | None:
    """The request that goes on with ``partial``, built from the one that broke off;
    None when that request cannot be continued this way."""
    body: Any = orjson.loads(sent)
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return None
    if messages[-1].get("role") == "assistant":
        return None  # the caller's own prefill: its text and the partial one would mix
    if body.get("n", 1) != 1:
        return None
    message: dict[str, Any] = {"role": "assistant", "content": partial.content}
    if partial.reasoning:
        message["reasoning_content"] = partial.reasoning
    body["messages"] = [*messages, message]
    body["continue_final_message"] = True
    body["add_generation_prompt"] = False
    for key in _LIMITS:
        limit = body.get(key)
        if is_int(limit) and limit > 0:
            body[key] = max(1, limit - partial.deltas)
    return orjson.dumps(body)
