"""A streamed chat answer as Anthropic's stream of events: a pure state machine.

Fed the bytes the relay writes (``data: {chunk}`` events, several at a time at
times, ``data: [DONE]`` last), it writes ``event: <name>`` / ``data: {...}``
events: ``message_start`` with the first chunk; one content block at a time
(``thinking``, ``text``, ``tool_use``), each opened, given its deltas and
stopped, a thinking block's ``signature_delta`` (the gateway's signature of its
whole text, with the profile) just before its stop; at ``[DONE]`` the ``message_delta`` with the
stop reason and the usage, then ``message_stop``.

A block is stopped only when the next one starts, and the last one at ``[DONE]``,
right before the ``message_delta``: Claude Code 2.1.197 sends a request again
when a stream fails inside an open block, and gives up once a block has ended.
The relay holds tool calls back until the finish, so the text block before them
stays open until the answer is whole; only a thinking block followed by text has
ended before the answer does.

An in-stream error becomes an ``error`` event and ends the stream. So does the
discard chunk, which the Messages API has no form for: the front refuses the
header that asks for it, so it should never come; if it does, what the caller
was shown cannot be taken back, and the answer ends in an error rather than go on
with a second answer glued to the first.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson

from boundedcode_gateway.fronts.messages.errors import error_body, from_stream_error
from boundedcode_gateway.fronts.messages.response import (
    Sign,
    message_id,
    stop_reason,
    thinking_signature,
    usage,
)
from boundedcode_gateway.wire.sse import DONE, SSEDecoder

_EVENT_END = b"\n\n"
# the relay's own chunks, read whole however large (a held tool call comes in one)
_NO_EVENT_LIMIT = sys.maxsize
# the events' data and name, framed
_EVENT = b"event: %s\ndata: %s\n\n"

_TEXT, _THINKING, _TOOL = "text", "thinking", "tool"


def event(name: str, data: dict[str, Any]) -> bytes:
    return _EVENT % (name.encode(), orjson.dumps(data))


class MessagesStream:
    """Translates one streamed chat answer into Anthropic's events."""

    __slots__ = (
        "_decoder",
        "_done",
        "_finish",
        "_index",
        "_model",
        "_open",
        "_sign",
        "_started",
        "_thinking",
        "_tool_blocks",
        "_usage",
    )

    def __init__(self, profile: str, sign: Sign) -> None:
        # the model the request named: message_start's until a chunk names the upstream's,
        # and whose thinking the signatures are of
        self._model = profile
        self._sign = sign
        self._decoder = SSEDecoder(_NO_EVENT_LIMIT)
        self._started = False
        # message_stop or an error was sent: nothing follows
        self._done = False
        # the open block's kind and, for a tool call, its index among the chat's calls
        self._open: tuple[str, int] | None = None
        # the next block's index
        self._index = 0
        self._thinking: list[str] = []
        # the chat's tool-call indexes that have had their block
        self._tool_blocks: set[int] = set()
        self._finish: str | None = None
        self._usage: Any = None

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        for sse in self._decoder.feed(chunk):
            data = sse.data
            if self._done:
                continue
            if data == DONE:
                self._end_message(out)
                continue
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                obj = None
            if not isinstance(obj, dict):
                self._fail(out, error_body("api_error", "the answer's stream held a bad event"))
                continue
            self._chunk(obj, out)
        return b"".join(out)

    def end(self) -> bytes:
        """Nothing after a whole answer or an error; an error for a stream that stopped
        short of either. Asked before anything came (the relay's first piece of an
        answer that had none), it is not the end yet."""
        if self._done or not (self._started or self._decoder.pending):
            return b""
        out: list[bytes] = []
        self._fail(out, error_body("api_error", "the answer ended before it was complete"))
        return b"".join(out)

    # -- the message

    def _fail(self, out: list[bytes], body: bytes) -> None:
        out.append(b"event: error\ndata: " + body + _EVENT_END)
        self._done = True

    def _start(self, obj: dict[str, Any], out: list[bytes]) -> None:
        self._started = True
        model = obj.get("model")
        message: dict[str, Any] = {
            "id": message_id(obj.get("id")),
            "type": "message",
            "role": "assistant",
            "model": model if isinstance(model, str) and model else self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        out.append(event("message_start", {"type": "message_start", "message": message}))

    def _chunk(self, obj: dict[str, Any], out: list[bytes]) -> None:
        if "error" in obj:
            self._fail(out, from_stream_error(obj["error"]))
            return
        if "boundedcode" in obj:
            self._fail(
                out,
                error_body(
                    "api_error",
                    "the upstream's answer broke off after part of it was sent, which the "
                    "Messages API cannot take back; send the request again",
                ),
            )
            return
        if not self._started:
            self._start(obj, out)
        if obj.get("usage") is not None:
            self._usage = obj["usage"]
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            return
        choice = choices[0]
        if not isinstance(choice, dict):
            return
        delta = choice.get("delta")
        if isinstance(delta, dict) and self._finish is None:
            self._delta(delta, out)
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and not self._done and self._finish is None:
            # the last block is stopped with the message_delta, at the end: an answer that
            # fails before it has no block that ended
            self._finish = finish

    def _end_message(self, out: list[bytes]) -> None:
        if not self._started:
            self._start({}, out)
        self._close(out)
        delta = {"stop_reason": stop_reason(self._finish), "stop_sequence": None}
        out.append(
            event(
                "message_delta",
                {"type": "message_delta", "delta": delta, "usage": usage(self._usage)},
            )
        )
        out.append(event("message_stop", {"type": "message_stop"}))
        self._done = True

    # -- content blocks

    def _delta(self, delta: dict[str, Any], out: list[bytes]) -> None:
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            if self._open is None or self._open[0] != _THINKING:
                block = {"type": "thinking", "thinking": "", "signature": ""}
                self._open_block(out, (_THINKING, 0), block)
            self._thinking.append(reasoning)
            self._block_delta(out, {"type": "thinking_delta", "thinking": reasoning})
        for key in ("content", "refusal"):
            text = delta.get(key)
            if isinstance(text, str) and text:
                if self._open is None or self._open[0] != _TEXT:
                    self._open_block(out, (_TEXT, 0), {"type": "text", "text": ""})
                self._block_delta(out, {"type": "text_delta", "text": text})
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict) and not self._done:
                self._tool_call(call, out)

    def _tool_call(self, call: dict[str, Any], out: list[bytes]) -> None:
        index = call.get("index", 0)
        index = index if isinstance(index, int) else 0
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        if self._open != (_TOOL, index):
            if index in self._tool_blocks:
                # a block cannot be opened again: the call's input would be lost
                self._fail(
                    out,
                    error_body("api_error", "the answer's tool calls came interleaved"),
                )
                return
            self._tool_blocks.add(index)
            call_id = call.get("id")
            block = {
                "type": "tool_use",
                "id": call_id if isinstance(call_id, str) and call_id else f"toolu_{index}",
                "name": str(function.get("name") or ""),
                "input": {},
            }
            self._open_block(out, (_TOOL, index), block)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._block_delta(out, {"type": "input_json_delta", "partial_json": arguments})

    def _open_block(self, out: list[bytes], kind: tuple[str, int], block: dict[str, Any]) -> None:
        self._close(out)
        self._open = kind
        out.append(
            event(
                "content_block_start",
                {"type": "content_block_start", "index": self._index, "content_block": block},
            )
        )

    def _block_delta(self, out: list[bytes], delta: dict[str, Any]) -> None:
        out.append(
            event(
                "content_block_delta",
                {"type": "content_block_delta", "index": self._index, "delta": delta},
            )
        )

    def _close(self, out: list[bytes]) -> None:
        if self._open is None:
            return
        if self._open[0] == _THINKING:
            signature = thinking_signature(self._model, "".join(self._thinking), self._sign)
            self._thinking = []
            self._block_delta(out, {"type": "signature_delta", "signature": signature})
        out.append(
            event("content_block_stop", {"type": "content_block_stop", "index": self._index})
        )
        self._open = None
        self._index += 1
