"""Tool calls held back until the answer's finish (pure).

Wraps the stream translator of one streamed answer. The text and reasoning it
relays pass through as they come; the tool-call deltas are taken out of their
chunks and kept, each call assembled from its pieces, and at the finish one
chunk gives every call whole (its id, type, name and all its arguments), just
before the finish chunk.

So an answer that breaks anywhere before its finish has shown its caller text
and reasoning only: a llama.cpp server can go on from there (a message with a
tool call cannot be continued), an answer that was nothing but tool calls so far
has shown nothing and is sent again silently, and the Messages front's text
block stays open until the finish. The cost: a call's arguments reach the caller
at once, not as they are generated; and an answer that is only tool calls holds
the caller's status until its finish.

``content_started`` says what the caller was shown (text, reasoning, a refusal,
or the calls once let go); ``generating``, that the upstream began its answer
(for the time to first token).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from boundedcode_gateway.providers.base import PartialAnswer, StreamTranslator
from boundedcode_gateway.upstream.metrics import CallMetrics, CaptureLimit

# only a chunk holding this key can carry tool calls: inside a JSON string a quote is
# escaped, so text that names the key never matches
_TOOL_CALLS = b'"tool_calls"'
_SHOWN_KEYS = ("content", "reasoning_content", "refusal")
_HEAD_KEYS = ("id", "object", "created", "model", "system_fingerprint")


class _HeldCall:
    """One tool call put together from its deltas."""

    __slots__ = ("arguments", "fields", "function", "limit", "name")

    def __init__(self, limit: CaptureLimit) -> None:
        # the answer's: a call's arguments are kept whole until the finish, so they count
        self.limit = limit
        # the call's own keys (id, type, an adapter's extras), first value kept
        self.fields: dict[str, Any] = {}
        # the function's keys other than its name and arguments
        self.function: dict[str, Any] = {}
        self.name: list[str] = []
        self.arguments: list[str] = []

    def add(self, delta: dict[str, Any]) -> None:
        for key, value in delta.items():
            if key not in ("index", "function") and self.fields.get(key) is None:
                self.limit.take(value if isinstance(value, str) else "")
                self.fields[key] = value
        function = delta.get("function")
        if not isinstance(function, dict):
            return
        for key, value in function.items():
            if key == "name" and isinstance(value, str):
                self.limit.take(value)
                self.name.append(value)
            elif key == "arguments" and isinstance(value, str):
                self.limit.take(value)
                self.arguments.append(value)
            elif key not in ("name", "arguments") and self.function.get(key) is None:
                self.function[key] = value

    def whole(self, index: int) -> dict[str, Any]:
        function = {**self.function, "name": "".join(self.name)}
        function["arguments"] = "".join(self.arguments)
        return {"index": index, **self.fields, "function": function}


class ToolCallHold:
    """A stream translator whose tool calls reach the caller whole, at the finish."""

    __slots__ = ("_calls", "_head", "_inner", "_limit", "_released", "content_started")

    def __init__(self, inner: StreamTranslator, limit: CaptureLimit | None = None) -> None:
        self._inner = inner
        self._limit = limit or CaptureLimit()
        self._calls: dict[int, _HeldCall] = {}
        # the id, time and model of the chunk the first call came in
        self._head: dict[str, Any] = {}
        self._released = False
        # a continuation goes on with what the caller was already shown
        self.content_started = inner.content_started

    @property
    def metrics(self) -> CallMetrics:
        return self._inner.metrics

    @property
    def finished(self) -> bool:
        return self._inner.finished

    @property
    def progress_seen(self) -> bool:
        return self._inner.progress_seen

    @property
    def generating(self) -> bool:
        """Whether the upstream has begun the answer (shown or held)."""
        return self._inner.content_started

    def shown_text(self) -> PartialAnswer | None:
        # the calls are let go only at the finish: before it, what was shown is text
        return None if self._released else self._inner.shown_text()

    def feed(self, event: str, data: bytes) -> Sequence[bytes]:
        out = self._inner.feed(event, data)
        finishing = self._inner.finished and not self._released
        if not finishing and not any(_TOOL_CALLS in p for p in out):
            if not self._calls:
                # nothing held: whatever began was shown
                self.content_started = self._inner.content_started
                return out
            if self.content_started:
                return out
        kept: list[bytes] = []
        for payload in out:
            self._take(payload, kept)
        if self._inner.finished and self._calls and not self._released:
            kept.append(self._release())  # an end with no finish chunk ([DONE] alone)
        return kept

    def _take(self, payload: bytes, kept: list[bytes]) -> None:
        """Relay ``payload`` without its tool calls, the held calls before a finish."""
        obj = orjson.loads(payload)
        choices = obj.get("choices") if isinstance(obj, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            kept.append(payload)
            return
        delta = choice.get("delta")
        calls = delta.get("tool_calls") if isinstance(delta, dict) else None
        changed = False
        if isinstance(delta, dict) and isinstance(calls, list) and calls and not self._released:
            self._hold(obj, calls)
            del delta["tool_calls"]
            changed = True
        if isinstance(delta, dict) and any(delta.get(k) for k in _SHOWN_KEYS):
            self.content_started = True
        finish = choice.get("finish_reason")
        if finish and self._calls and not self._released:
            kept.append(self._release())
        if changed and not delta and not finish and obj.get("usage") is None:
            return  # the chunk held nothing but tool calls
        kept.append(orjson.dumps(obj) if changed else payload)

    def _hold(self, obj: dict[str, Any], calls: list[Any]) -> None:
        if not self._head:
            self._head = {k: obj[k] for k in _HEAD_KEYS if k in obj}
        for call in calls:
            if not isinstance(call, dict):
                continue
            index = call.get("index", 0)
            index = index if isinstance(index, int) and not isinstance(index, bool) else 0
            held = self._calls.get(index)
            if held is None:
                self._limit.take("")
                held = self._calls[index] = _HeldCall(self._limit)
            held.add(call)

    def _release(self) -> bytes:
        """The chunk with every held call whole."""
        self._released = True
        self.content_started = True
        calls = [self._calls[i].whole(i) for i in sorted(self._calls)]
        choice = {"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}
        return orjson.dumps({**self._head, "choices": [choice]})
