"""A streamed chat completion, put back together as its caller sees it: the message, the
usage, and when its first token came.

Pure: the runner feeds it each ``data:`` line of the answer as it arrives, with the time
since the request was sent. The first token is the first chunk whose delta carries
text, reasoning or a tool call: a role-only chunk (LiteLLM sends one at once, the
gateway a progress chunk) is no token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson


class StreamError(RuntimeError):
    """The stream carried an error instead of (or in the middle of) the answer."""


@dataclass(slots=True)
class StreamedAnswer:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    first_token_ms: float | None = None
    done: bool = False

    def feed(self, line: str, elapsed_ms: float) -> None:
        """One line of the event stream, ``elapsed_ms`` after the request was sent."""
        if not line.startswith("data:"):
            return
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            self.done = True
            return
        chunk = orjson.loads(data)
        if not isinstance(chunk, dict):
            return
        if chunk.get("error"):
            raise StreamError(str(chunk["error"])[:500])
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if self._delta(choice.get("delta") or {}) and self.first_token_ms is None:
                self.first_token_ms = round(elapsed_ms, 1)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _delta(self, delta: dict[str, Any]) -> bool:
        """Take one delta; whether it carried a token."""
        got = False
        if delta.get("content"):
            self.content.append(delta["content"])
            got = True
        if delta.get("reasoning_content"):
            self.reasoning.append(delta["reasoning_content"])
            got = True
        for part in delta.get("tool_calls") or []:
            call = self.tool_calls.setdefault(
                int(part.get("index", 0)),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if part.get("id"):
                call["id"] = part["id"]
            function = part.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""
            got = True
        return got

    def message(self) -> dict[str, Any]:
        """The answer's message, as a non-streamed answer's ``choices[0].message``."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message
