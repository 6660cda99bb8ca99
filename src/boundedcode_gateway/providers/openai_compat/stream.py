"""The stream translator for OpenAI-shaped upstreams: chunks pass through, measured on the way.

Pure state machine over ``data:`` payloads. Forwards the upstream's bytes
unchanged (no re-serialisation), drops what the caller did not ask for, and
raises the gateway error for an error event.

For an upstream that can go on with an answer that broke off, it keeps the text
it relayed (``shown_text``). A translator for such a continuation relays only
what follows: it drops the new stream's role-only opening chunk and its prompt
progress, and gives its chunks the id and time of the answer they go on with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from boundedcode_gateway.errors import MalformedResponse
from boundedcode_gateway.json_values import int_or_none
from boundedcode_gateway.policy.reasoning import REASONING_KIND
from boundedcode_gateway.providers.base import PartialAnswer, RequestOptions
from boundedcode_gateway.providers.openai_compat.mapping import (
    complete_tool_call_head,
    error_from_stream_event,
    read_answer_metrics,
    read_progress,
)
from boundedcode_gateway.upstream.metrics import CallMetrics, CapturedReasoning, CaptureLimit
from boundedcode_gateway.wire.chat import SYSTEM_STAMPS, Stamps
from boundedcode_gateway.wire.sse import DONE

_NOTHING: tuple[bytes, ...] = ()
_CONTENT_KEYS = ("content", "reasoning_content", "tool_calls", "refusal")


class _AnswerText:
    """The text, reasoning and tool-call ids of a streamed answer, for the reasoning store
    (and, when asked, its tool calls whole, for the cache keeper)."""

    __slots__ = ("calls", "content", "ids", "limit", "reasoning")

    def __init__(
        self,
        limit: CaptureLimit,
        before: PartialAnswer | None = None,
        whole_calls: bool = False,
    ) -> None:
        self.limit = limit
        self.content: list[str] = [before.content] if before else []
        self.reasoning: list[str] | None = (
            [before.reasoning] if before and before.reasoning else None
        )
        self.ids: list[str] = []
        # per tool-call index: id, name and argument fragments
        self.calls: dict[int, list[str]] | None = {} if whole_calls else None

    def add(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        take = self.limit.take
        content = delta.get("content")
        if isinstance(content, str):
            take(content)
            self.content.append(content)
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str):
            take(reasoning)
            if self.reasoning is None:
                self.reasoning = []
            self.reasoning.append(reasoning)
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                take(call["id"])
                self.ids.append(call["id"])
            if self.calls is not None and isinstance(call, dict):
                self._add_call(call)

    def _add_call(self, call: dict[str, Any]) -> None:
        assert self.calls is not None
        index = call.get("index", 0)
        index = index if isinstance(index, int) else 0
        parts = self.calls.get(index)
        if parts is None:
            self.limit.take("")
            parts = self.calls[index] = ["", ""]
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        if isinstance(call.get("id"), str):
            parts[0] = call["id"]
        if isinstance(function.get("name"), str):
            self.limit.take(function["name"])
            parts[1] += function["name"]
        if isinstance(function.get("arguments"), str):
            self.limit.take(function["arguments"])
            parts.append(function["arguments"])

    def message(self) -> dict[str, Any]:
        """The answer as a caller sends it back."""
        out: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.reasoning is not None:
            out["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            out["tool_calls"] = [
                {
                    "id": parts[0],
                    "type": "function",
                    "function": {"name": parts[1], "arguments": "".join(parts[2:]) or "{}"},
                }
                for _, parts in sorted(self.calls.items())
            ]
        return out

    def captured(self) -> CapturedReasoning | None:
        if self.reasoning is None:
            return None
        return CapturedReasoning(
            REASONING_KIND, self.ids, "".join(self.content), "".join(self.reasoning)
        )


class OpenAIStreamTranslator:
    """Relays an OpenAI-shaped SSE stream and accumulates its metrics."""

    __slots__ = (
        "_capture",
        "_continuing",
        "_first",
        "_forward_progress",
        "_forward_usage",
        "_keep_answer",
        "_keep_content",
        "_keep_shown",
        "_limit",
        "_opened",
        "_secrets",
        "_stamps",
        "_text",
        "_tool_args",
        "content_started",
        "finished",
        "metrics",
        "progress_seen",
    )

    def __init__(
        self,
        options: RequestOptions,
        secrets: tuple[str, ...] = (),
        keep_shown: bool = False,
        continuing: PartialAnswer | None = None,
        stamps: Stamps = SYSTEM_STAMPS,
    ) -> None:
        self.metrics = CallMetrics()
        # a continuation goes on with content the caller has already seen
        self.content_started = continuing is not None
        self.finished = False
        self.progress_seen = False
        self._forward_usage = options.include_usage
        self._forward_progress = options.return_progress and continuing is None
        self._secrets = secrets
        self._stamps = stamps
        # characters of arguments seen per tool-call index
        self._tool_args: dict[int, int] = {}
        self._capture = options.capture_reasoning or options.capture_content
        self._keep_content = options.capture_content
        self._keep_answer = options.capture_answer
        self._keep_shown = keep_shown
        self._continuing = continuing
        # one limit for all this translator keeps of the answer
        self._limit = CaptureLimit(options.max_captured_bytes)
        keep_text = self._capture or keep_shown or continuing or options.capture_answer
        self._text = (
            _AnswerText(self._limit, continuing, options.capture_answer) if keep_text else None
        )
        # the first chunk's id and time, kept with the text
        self._first: tuple[str | None, int | None] | None = None
        # whether the caller has been given the answer's role yet (a continuation's was)
        self._opened = continuing is not None

    def feed(self, event: str, data: bytes) -> Sequence[bytes]:
        """Consume one event; return the payloads to relay (the same bytes, or none)."""
        if data == DONE:
            self.finished = True
            return _NOTHING
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise MalformedResponse("the upstream sent a stream event that is not JSON") from None
        if not isinstance(obj, dict):
            raise MalformedResponse("the upstream sent a stream event that is not an object")
        if b"\n" in data:
            # an event written as several data: lines, joined with "\n": in valid JSON a
            # line break is only ever whitespace, and relayed as is it would end the
            # caller's data: line in the middle of the object
            data = data.replace(b"\n", b" ")
        if "error" in obj:
            raise error_from_stream_event(obj["error"], self._secrets)
        read_answer_metrics(obj, self.metrics)
        progress = obj.get("prompt_progress")
        if progress is not None:
            if isinstance(progress, dict):
                read_progress(progress, self.metrics)
            self.progress_seen = True
            if not self._forward_progress:
                return _NOTHING
            self._opened = self._opened or _carries_role(obj)
            return (data,)
        choices = obj.get("choices")
        if not choices:
            if obj.get("usage") and not self._forward_usage:
                return _NOTHING
            if self._continuing is not None and self._as_continued(obj):
                data = orjson.dumps(obj)
            return (data,)
        return self._feed_choice(obj, choices[0], data)

    def shown_text(self) -> PartialAnswer | None:
        """The text relayed so far, if kept: the relay holds tool calls back until the
        finish (``tool_call_hold.py``), so before it the caller was shown text only."""
        text = self._text
        if not self._keep_shown or text is None:
            return None
        content, reasoning = "".join(text.content), "".join(text.reasoning or ())
        if not content and not reasoning:
            return None
        completion_id, created = self._first or (None, None)
        deltas = sum(1 for part in (*text.content, *(text.reasoning or ())) if part)
        return PartialAnswer(content, reasoning, completion_id, created, deltas)

    def _feed_choice(self, obj: dict[str, Any], choice: Any, data: bytes) -> Sequence[bytes]:
        self._observe_choice(choice)
        changed = self._complete_tool_deltas(choice)
        if self._continuing is not None:
            if _opens_only(choice):
                return _NOTHING  # the caller's answer is already open
            changed = self._as_continued(obj) or changed
        elif self._keep_shown and self._first is None:
            self._first = (_str_or_none(obj.get("id")), int_or_none(obj.get("created")))
        if changed:
            data = orjson.dumps(obj)
        text = self._text
        if text is not None:
            text.add(choice)
            if self.finished and self._capture:
                self.metrics.captured = text.captured()
                if self._keep_content:
                    self.metrics.answer_text = "".join(text.content)
            if self.finished and self._keep_answer:
                self.metrics.answer_message = text.message()
        opening = self._opening(obj, choice) if not self._opened else _NOTHING
        if self.finished and any(n == 0 for n in self._tool_args.values()):
            return (*opening, self._empty_arguments_chunk(obj), data)
        return (*opening, data) if opening else (data,)

    def _opening(self, obj: dict[str, Any], choice: dict[str, Any]) -> Sequence[bytes]:
        """The role chunk, when the answer's first chunk does not carry it.

        llama-server sends the role with the first generated token, except when that token
        is an incomplete UTF-8 sequence (the first bytes of an emoji): the token is held
        back and the role then rides only on the prompt-progress chunks the gateway asked
        for and drops. Clients take the message's role from the first chunk.
        """
        self._opened = True
        delta = choice.get("delta")
        if isinstance(delta, dict) and delta.get("role"):
            return _NOTHING
        head = {k: obj[k] for k in ("id", "object", "created", "model") if k in obj}
        opening = {"index": 0, "delta": {"role": "assistant", "content": None}}
        return (orjson.dumps({**head, "choices": [{**opening, "finish_reason": None}]}),)

    def _as_continued(self, obj: dict[str, Any]) -> bool:
        """Give a continuation's chunk the id and time of the answer it goes on with."""
        partial = self._continuing
        if partial is None or partial.completion_id is None:
            return False
        obj["id"] = partial.completion_id
        if partial.created is not None:
            obj["created"] = partial.created
        return True

    def _complete_tool_deltas(self, choice: dict[str, Any]) -> bool:
        """The first delta of each tool call gets an id and a type if the upstream left them out."""
        delta = choice.get("delta")
        calls = delta.get("tool_calls") if isinstance(delta, dict) else None
        if not isinstance(calls, list):
            return False
        changed = False
        for call in calls:
            if not isinstance(call, dict):
                continue
            index = call.get("index", 0)
            function = call.get("function")
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if index not in self._tool_args:
                self._limit.take("")  # one more call: a stream of new indexes is bounded too
                self._tool_args[index] = 0
                changed = complete_tool_call_head(call, self._stamps) or changed
            self._tool_args[index] += len(arguments) if isinstance(arguments, str) else 0
        return changed

    def _empty_arguments_chunk(self, obj: dict[str, Any]) -> bytes:
        """Arguments ``{}`` for the tool calls that ended without any, before the finish."""
        empty = [i for i, n in self._tool_args.items() if n == 0]
        for i in empty:
            self._tool_args[i] = 2
        calls = [{"index": i, "function": {"arguments": "{}"}} for i in empty]
        head = {k: obj[k] for k in ("id", "object", "created", "model") if k in obj}
        return orjson.dumps(
            {
                **head,
                "choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}],
            }
        )

    def _observe_choice(self, choice: Any) -> None:
        if not isinstance(choice, dict):
            raise MalformedResponse("the upstream sent a chunk whose choice is not an object")
        if not self.content_started:
            delta = choice.get("delta")
            if isinstance(delta, dict) and any(delta.get(k) for k in _CONTENT_KEYS):
                self.content_started = True
        finish = choice.get("finish_reason")
        if finish:
            self.finished = True
            self.metrics.finish_reason = finish if isinstance(finish, str) else None


def _carries_role(obj: dict[str, Any]) -> bool:
    choices = obj.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    delta = first.get("delta") if isinstance(first, dict) else None
    return isinstance(delta, dict) and bool(delta.get("role"))


def _opens_only(choice: dict[str, Any]) -> bool:
    """A chunk that only opens an answer: a role, no content, no finish."""
    delta = choice.get("delta")
    if choice.get("finish_reason") or not isinstance(delta, dict):
        return False
    return not any(delta.get(k) for k in _CONTENT_KEYS)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
