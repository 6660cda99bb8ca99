"""Anthropic's stream events as OpenAI chunks: a pure state machine.

``message_start`` opens the answer (its id and model name every chunk);
content blocks become deltas (text, reasoning for display, tool-call fragments
under their own index); thinking blocks are also kept whole, signature
included, for the store; ``message_delta`` brings the finish reason and usage;
only ``message_stop`` completes the answer, so a stream that ends without it
is a broken stream. An ``error`` event raises the gateway error it describes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from boundedcode_gateway.errors import MalformedResponse
from boundedcode_gateway.providers.anthropic.response import (
    THINKING_TYPES,
    AnswerBuilder,
    error_from_stream_event,
    finish_reason,
    read_usage,
)
from boundedcode_gateway.providers.base import PartialAnswer, RequestOptions
from boundedcode_gateway.upstream.metrics import CallMetrics, CaptureLimit
from boundedcode_gateway.wire.chat import SYSTEM_STAMPS, ChunkWriter, Stamps

_NOTHING: tuple[bytes, ...] = ()


class _ToolBlock:
    __slots__ = ("arguments", "call_id", "index", "name")

    def __init__(self, index: int, call_id: str, name: str) -> None:
        self.index = index
        self.call_id = call_id
        self.name = name
        self.arguments: list[str] = []


class AnthropicStreamTranslator:
    """Translates one streamed Messages API answer into OpenAI chunk payloads."""

    __slots__ = (
        "_answer",
        "_blocks",
        "_finish",
        "_forward_usage",
        "_keep_content",
        "_limit",
        "_pieces",
        "_secrets",
        "_stamps",
        "_tools",
        "_writer",
        "content_started",
        "finished",
        "metrics",
        "progress_seen",
    )

    def __init__(
        self, options: RequestOptions, secrets: tuple[str, ...] = (), stamps: Stamps = SYSTEM_STAMPS
    ) -> None:
        self.metrics = CallMetrics()
        self.content_started = False
        self.finished = False
        self.progress_seen = False
        self._forward_usage = options.include_usage
        self._keep_content = options.capture_content
        self._secrets = secrets
        self._stamps = stamps
        self._writer: ChunkWriter | None = None
        self._answer = AnswerBuilder()
        # open blocks by their index: thinking blocks being assembled, tool calls
        self._blocks: dict[int, dict[str, Any]] = {}
        # an open thinking block's deltas by field, joined at its end (a string added to
        # at each delta is copied whole each time)
        self._pieces: dict[int, dict[str, list[str]]] = {}
        self._tools: dict[int, _ToolBlock] = {}
        # one limit for all this translator keeps of the answer
        self._limit = CaptureLimit(options.max_captured_bytes)
        self._finish: str | None = None

    def feed(self, event: str, data: bytes) -> Sequence[bytes]:
        """Consume one SSE event; return the chunk payloads for the caller."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise MalformedResponse("the upstream sent a stream event that is not JSON") from None
        if not isinstance(obj, dict):
            raise MalformedResponse("the upstream sent a stream event that is not an object")
        kind = obj.get("type") or event
        if kind == "content_block_delta":
            return self._delta(obj)
        if kind == "content_block_start":
            return self._block_start(obj)
        if kind == "content_block_stop":
            return self._block_stop(obj)
        if kind == "message_start":
            return self._message_start(obj)
        if kind == "message_delta":
            return self._message_delta(obj)
        if kind == "message_stop":
            return self._message_stop()
        if kind == "error":
            raise error_from_stream_event(obj, self._secrets)
        return _NOTHING  # ping, and event types added later

    def shown_text(self) -> PartialAnswer | None:
        return None  # the provider cannot go on with a partial answer

    # -- the message

    def _out(self) -> ChunkWriter:
        if self._writer is None:
            raise MalformedResponse("the upstream stream sent content before message_start")
        return self._writer

    def _message_start(self, obj: dict[str, Any]) -> Sequence[bytes]:
        message = obj.get("message")
        if not isinstance(message, dict):
            raise MalformedResponse("the upstream's message_start has no message")
        model = message.get("model")
        self.metrics.upstream_model = model if isinstance(model, str) else None
        read_usage(message.get("usage"), self.metrics)
        self._writer = ChunkWriter(
            message.get("id"), self.metrics.upstream_model or "", self._stamps
        )
        return _NOTHING

    def _message_delta(self, obj: dict[str, Any]) -> Sequence[bytes]:
        read_usage(obj.get("usage"), self.metrics)
        delta = obj.get("delta")
        stop_reason = delta.get("stop_reason") if isinstance(delta, dict) else None
        if stop_reason is None:
            return _NOTHING
        self._finish = finish_reason(stop_reason)
        self.metrics.finish_reason = self._finish
        return (self._out().delta({}, self._finish),)

    def _message_stop(self) -> Sequence[bytes]:
        self.finished = True
        self.metrics.captured = self._answer.captured()
        if self._keep_content:
            self.metrics.answer_text = "".join(self._answer.text)
        if self._finish is None:
            self._finish = "stop"
            self.metrics.finish_reason = self._finish
            out = [self._out().delta({}, self._finish)]
        else:
            out = []
        if self._forward_usage:
            out.append(self._out().usage(self.metrics))
        return out

    # -- content blocks

    def _block_start(self, obj: dict[str, Any]) -> Sequence[bytes]:
        index = obj.get("index")
        block = obj.get("content_block")
        if not isinstance(index, int) or not isinstance(block, dict):
            raise MalformedResponse("the upstream's content_block_start has no index or block")
        kind = block.get("type")
        self._limit.take("")
        if kind in THINKING_TYPES:
            self._blocks[index] = dict(block)
            self._pieces[index] = {}
            return _NOTHING
        if kind == "tool_use":
            self._limit.take(str(block.get("id", "")))
            tool = _ToolBlock(
                len(self._tools), str(block.get("id", "")), str(block.get("name", ""))
            )
            self._tools[index] = tool
            self.content_started = True
            head = {
                "index": tool.index,
                "id": tool.call_id,
                "type": "function",
                "function": {"name": tool.name, "arguments": ""},
            }
            return (self._out().delta({"tool_calls": [head]}),)
        if kind == "text" and block.get("text"):
            return self._text(str(block["text"]))
        return _NOTHING

    def _delta(self, obj: dict[str, Any]) -> Sequence[bytes]:
        index = obj.get("index")
        delta = obj.get("delta")
        if not isinstance(delta, dict):
            raise MalformedResponse("the upstream's content_block_delta has no delta")
        kind = delta.get("type")
        if kind == "text_delta":
            return self._text(str(delta.get("text", "")))
        if kind == "input_json_delta":
            tool = self._tools.get(index) if isinstance(index, int) else None
            fragment = delta.get("partial_json")
            if tool is None or not isinstance(fragment, str) or not fragment:
                return _NOTHING
            self._limit.take(fragment)
            tool.arguments.append(fragment)
            call = {"index": tool.index, "function": {"arguments": fragment}}
            return (self._out().delta({"tool_calls": [call]}),)
        block = self._blocks.get(index) if isinstance(index, int) else None
        if block is None:
            return _NOTHING
        if kind == "thinking_delta":
            piece = str(delta.get("thinking", ""))
            self._keep(index, "thinking", piece)
            if not piece:
                return _NOTHING
            self.content_started = True
            return (self._out().delta({"reasoning_content": piece}),)
        if kind == "signature_delta":
            self._keep(index, "signature", str(delta.get("signature", "")))
        return _NOTHING

    def _keep(self, index: Any, field: str, piece: str) -> None:
        self._limit.take(piece)
        self._pieces[index].setdefault(field, []).append(piece)

    def _text(self, text: str) -> Sequence[bytes]:
        if not text:
            return _NOTHING
        self._limit.take(text)
        self.content_started = True
        self._answer.add_text(text)
        return (self._out().delta({"content": text}),)

    def _block_stop(self, obj: dict[str, Any]) -> Sequence[bytes]:
        index = obj.get("index")
        if not isinstance(index, int):
            return _NOTHING
        block = self._blocks.pop(index, None)
        if block is not None:
            for field, pieces in self._pieces.pop(index, {}).items():
                block[field] = str(block.get(field, "")) + "".join(pieces)
            self._answer.add_thinking(index, block)
            return _NOTHING
        tool = self._tools.get(index)
        if tool is None:
            return _NOTHING
        arguments = "".join(tool.arguments) or "{}"
        self._answer.add_tool(tool.call_id, tool.name, arguments)
        if not tool.arguments:
            # a tool without input: the caller still gets arguments it can parse
            call = {"index": tool.index, "function": {"arguments": "{}"}}
            return (self._out().delta({"tool_calls": [call]}),)
        return _NOTHING
