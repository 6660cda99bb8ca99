"""One streamed answer's chat chunks as the Responses API's events (a pure state machine).

The relay hands over its bytes (``data: {chunk}`` events, ``data: [DONE]``, an
in-stream error ``data: {"error": …}``, and, for a caller that declared it, the
discard chunk); out come named events, each with the next ``sequence_number``:

- ``response.created`` and ``response.in_progress`` before anything else;
- an output item per part of the answer, opened where it first shows, with its
  ``output_item.added``: the reasoning (``content_part.added``, then
  ``response.reasoning_text.delta``), the text (``response.output_text.delta``), a
  refusal (``response.refusal.delta``), each tool call
  (``response.function_call_arguments.delta``);
- at the finish reason, each item's closing events in output order (``….done``,
  ``content_part.done``, ``output_item.done``; the reasoning item's
  ``encrypted_content`` is in its ``output_item.done``). Items stay open until then,
  so a piece that comes late (reasoning between tool calls) still joins its item, and
  the stream ends with the items a whole answer has;
- at ``[DONE]``: ``response.completed``, or ``response.incomplete`` when the answer
  was cut (the usage chunk has come by then);
- an in-stream error: ``error`` (the gateway's code, as the chat error has it), then
  ``response.failed`` with the items shown so far.

The discard chunk (the answer broke after it was shown and is answered again) closes
the items shown as ``incomplete`` and becomes a ``boundedcode.discard`` event naming
them; the fresh answer's items follow with the next output indices, and the final
``Response`` lists only them (docs/fronts.md). Anything else (llama.cpp's progress
chunks, a repeated ``[DONE]``, whatever follows the end) is passed by.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from boundedcode_gateway.fronts.responses.errors import failure_of
from boundedcode_gateway.fronts.responses.response import (
    JSON,
    Frame,
    final_status,
    from_chat_usage,
    function_call_item,
    item_id,
    message_item,
    output_text,
    reasoning_item,
    refusal_item,
    refusal_part,
    sealed,
)
from boundedcode_gateway.fronts.sealing import Sealer
from boundedcode_gateway.wire.chat import SYSTEM_STAMPS, Stamps
from boundedcode_gateway.wire.sse import DONE, SSEDecoder

_IN_PROGRESS = "in_progress"
_FUNCTION_CALL = "function_call"


@dataclass(frozen=True, slots=True)
class _Kind:
    """An item that streams text into one content part: its chat delta field and events."""

    name: str
    # the chat delta's field
    field: str
    id_prefix: str
    # the ``….delta`` and ``….done`` events, and the done event's key for the whole text
    events: str
    done_key: str
    part: Callable[[str], JSON]
    item: Callable[[str, str, str], JSON]
    # keys every delta and done event of the kind carries
    extra: tuple[tuple[str, Any], ...] = ()


def _reasoning_part(text: str) -> JSON:
    return {"type": "reasoning_text", "text": text}


_KINDS = (
    _Kind(
        "reasoning",
        "reasoning_content",
        "rs",
        "response.reasoning_text",
        "text",
        _reasoning_part,
        reasoning_item,
    ),
    _Kind(
        "message",
        "content",
        "msg",
        "response.output_text",
        "text",
        output_text,
        message_item,
        (("logprobs", []),),
    ),
    _Kind("refusal", "refusal", "msg", "response.refusal", "refusal", refusal_part, refusal_item),
)


@dataclass(slots=True)
class _Item:
    """One output item being streamed."""

    kind: _Kind | None  # None: a function call
    index: int
    id: str
    parts: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""

    @property
    def text(self) -> str:
        return "".join(self.parts)


class ResponsesStream:
    """The events of one streamed ``Response``."""

    def __init__(self, frame: Frame, sealer: Sealer, stamps: Stamps = SYSTEM_STAMPS) -> None:
        self._frame = frame
        self._sealer = sealer
        self._stamps = stamps
        self._decoder = SSEDecoder()
        self._seq = 0
        self._started = False
        self._ended = False
        # the items of the answer now streaming, in output order; the next output index
        self._items: list[_Item] = []
        self._next_index = 0
        self._texts: dict[str, _Item] = {}
        self._calls: dict[Any, _Item] = {}
        # the items' final form, once closed
        self._done: dict[int, JSON] = {}
        self._finish: Any = None
        self._usage: JSON | None = None

    # -- bytes in, bytes out

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        for event in self._decoder.feed(chunk):
            self._on_data(event.data, out)
        return b"".join(out)

    def end(self) -> bytes:
        """Whatever the last bytes held; a stream that stopped without its end fails."""
        out: list[bytes] = []
        for event in self._decoder.close():
            self._on_data(event.data, out)
        if not self._ended:
            self._start(out)
            error = {"message": "the answer ended early", "code": "upstream_stream_broken"}
            self._fail(error, out)
        return b"".join(out)

    def _emit(self, out: list[bytes], event: JSON) -> None:
        event["sequence_number"] = self._seq
        self._seq += 1
        kind = str(event["type"]).encode()
        out.append(b"event: " + kind + b"\ndata: " + orjson.dumps(event) + b"\n\n")

    def _start(self, out: list[bytes]) -> None:
        if self._started:
            return
        self._started = True
        shell = self._frame.response(_IN_PROGRESS, [])
        self._emit(out, {"type": "response.created", "response": shell})
        self._emit(out, {"type": "response.in_progress", "response": shell})

    def _on_data(self, data: bytes, out: list[bytes]) -> None:
        if self._ended:
            return
        self._start(out)
        if data == DONE:
            self._complete(out)
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(chunk, dict):
            return
        if isinstance(chunk.get("error"), dict):
            self._fail(chunk["error"], out)
        elif isinstance(chunk.get("boundedcode"), dict):
            self._extension(chunk["boundedcode"], out)
        else:
            self._chunk(chunk, out)

    # -- the answer's pieces

    def _chunk(self, chunk: JSON, out: list[bytes]) -> None:
        choices = chunk.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta, out)
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
                self._close_all(out)
        usage = from_chat_usage(chunk.get("usage"))
        if usage is not None:
            self._usage = usage

    def _delta(self, delta: JSON, out: list[bytes]) -> None:
        for kind in _KINDS:
            text = delta.get(kind.field)
            if isinstance(text, str) and text:
                self._text_delta(kind, text, out)
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                self._call_delta(call, out)

    def _open(self, kind: _Kind | None) -> _Item:
        prefix = kind.id_prefix if kind is not None else "fc"
        item = _Item(kind, self._next_index, item_id(prefix, self._stamps))
        self._next_index += 1
        self._items.append(item)
        return item

    def _added(self, item: _Item, out: list[bytes]) -> None:
        added = {"type": "response.output_item.added", "output_index": item.index}
        self._emit(out, {**added, "item": self._shown(item)})

    def _text_delta(self, kind: _Kind, text: str, out: list[bytes]) -> None:
        item = self._texts.get(kind.name)
        base: JSON
        if item is None:
            item = self._texts[kind.name] = self._open(kind)
            self._added(item, out)
            base = {"item_id": item.id, "output_index": item.index, "content_index": 0}
            self._emit(out, {"type": "response.content_part.added", **base, "part": kind.part("")})
        elif item.index in self._done:
            return  # after the finish reason: nothing more belongs to the answer
        item.parts.append(text)
        base = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        self._emit(out, {"type": kind.events + ".delta", **base, "delta": text, **dict(kind.extra)})

    def _call_delta(self, call: JSON, out: list[bytes]) -> None:
        index = call.get("index", 0)
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        item = self._calls.get(index)
        if item is None:
            item = self._calls[index] = self._open(None)
            call_id, name = call.get("id"), function.get("name")
            item.call_id = call_id if isinstance(call_id, str) else self._stamps.tool_call_id()
            item.name = name if isinstance(name, str) else ""
            self._added(item, out)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments and item.index not in self._done:
            item.parts.append(arguments)
            base = {"item_id": item.id, "output_index": item.index}
            delta = {"type": "response.function_call_arguments.delta", **base, "delta": arguments}
            self._emit(out, delta)

    # -- items' forms

    def _shown(self, item: _Item, status: str = _IN_PROGRESS) -> JSON:
        """The item as it stands: empty when added, whole when done."""
        kind = item.kind
        if kind is None:
            text = item.text if status != _IN_PROGRESS else ""
            names = self._frame.echo.names
            return function_call_item(item.id, item.call_id, item.name, text, status, names)
        shown = kind.item(item.id, item.text, status)
        if status == _IN_PROGRESS:
            shown["content"] = []
        elif kind.name == "reasoning":
            shown["encrypted_content"] = sealed(self._sealer, self._frame.echo.model, item.text)
        return shown

    def _close(self, item: _Item, status: str, out: list[bytes]) -> None:
        if item.index in self._done:
            return
        base: JSON = {"item_id": item.id, "output_index": item.index}
        kind = item.kind
        if kind is None:
            arguments = {"type": "response.function_call_arguments.done", "arguments": item.text}
            self._emit(out, {**arguments, **base})
        else:
            done: JSON = {"type": kind.events + ".done", **base, "content_index": 0}
            self._emit(out, {**done, kind.done_key: item.text, **dict(kind.extra)})
            part_done = {"type": "response.content_part.done", **base, "content_index": 0}
            self._emit(out, {**part_done, "part": kind.part(item.text)})
        final = self._shown(item, status)
        self._done[item.index] = final
        item_done = {"type": "response.output_item.done", "output_index": item.index}
        self._emit(out, {**item_done, "item": final})

    def _close_all(self, out: list[bytes], status: str | None = None) -> None:
        closing = status if status is not None else final_status(self._finish)[0]
        for item in self._items:
            self._close(item, closing, out)

    def _output(self) -> list[JSON]:
        """The current answer's items: closed ones as they were closed, others as shown."""
        return [self._done.get(i.index) or self._shown(i, "incomplete") for i in self._items]

    # -- the end

    def _complete(self, out: list[bytes]) -> None:
        self._close_all(out)
        status, incomplete = final_status(self._finish)
        response = self._frame.response(
            status,
            self._output(),
            self._usage,
            incomplete=incomplete,
            completed_at=self._stamps.created(),
        )
        self._emit(out, {"type": f"response.{status}", "response": response})
        self._ended = True

    def _fail(self, error: JSON, out: list[bytes]) -> None:
        event, response_error = failure_of(error)
        self._emit(out, event)
        response = self._frame.response("failed", self._output(), self._usage, error=response_error)
        self._emit(out, {"type": "response.failed", "response": response})
        self._ended = True

    def _extension(self, extension: JSON, out: list[bytes]) -> None:
        if extension.get("event") != "discard":
            return
        self._close_all(out, "incomplete")
        reason = extension.get("reason")
        self._emit(
            out,
            {
                "type": "boundedcode.discard",
                "reason": reason if isinstance(reason, str) else "",
                "item_ids": [i.id for i in self._items],
            },
        )
        self._items = []
        self._texts = {}
        self._calls = {}
        self._finish = None
        self._usage = None
