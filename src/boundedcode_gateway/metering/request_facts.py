"""What a request said, read from its parsed JSON before any front translates or checks it:
so that a call refused on the way keeps, in its record, what it asked for. Pure.

Read cheaply and without trusting the body's shape: a field of the wrong type counts as
absent. The messages are the request's own (a Messages or chat body's ``messages``, a
Responses body's ``input``: a string is one message), not those of the chat body a front
would have made of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """The model a request named, whether it asked for a stream, how many messages it held."""

    model: str | None
    stream: bool = False
    messages: int = 0

    @classmethod
    def of(cls, body: Any) -> RequestFacts:
        if not isinstance(body, dict):
            return cls(None)
        model = body.get("model")
        return cls(
            model if isinstance(model, str) and model else None,
            body.get("stream") is True,
            _messages(body),
        )


def _messages(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if isinstance(messages, list):
        return len(messages)
    given = body.get("input")  # the Responses API's
    if isinstance(given, list):
        return len(given)
    return 1 if isinstance(given, str) else 0
