"""Anthropic's stream events as the official SDK reads them: each event's data checked
against the SDK's event type, and the events assembled into a message as its stream
helper assembles them."""

from __future__ import annotations

import inspect
from typing import Any

import orjson
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

_EVENT = TypeAdapter(RawMessageStreamEvent)
# the SDK's 2.x releases keep each tool block's JSON text in a buffer the caller passes
_BUFFERED = "json_bufs" in inspect.signature(accumulate_event).parameters


def parse_sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(name, data) of each event; every event is named, and its data's type is its name."""
    out = []
    for block in raw.split(b"\n\n"):
        if not block:
            continue
        lines = block.split(b"\n")
        assert lines[0].startswith(b"event: ") and lines[1].startswith(b"data: "), block
        name = lines[0][7:].decode()
        data = orjson.loads(lines[1][6:])
        assert data["type"] == name
        out.append((name, data))
    return out


def assemble(raw: bytes) -> Message:
    """The message the SDK's stream helper builds from the events (``error`` excluded:
    the SDK raises on it)."""
    snapshot = None
    buffers: dict[str, Any] = {"json_bufs": {}} if _BUFFERED else {}
    for name, data in parse_sse(raw):
        assert name != "error", data
        event = _EVENT.validate_python(data)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, **buffers)
    assert snapshot is not None
    return Message.model_validate(snapshot.to_dict())
