"""Anthropic's stream events as the official SDK reads them: each event's data checked
against the SDK's event type, and the events assembled into a message as its stream
helper assembles them."""

from __future__ import annotations

from typing import Any

import orjson
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

_EVENT = TypeAdapter(RawMessageStreamEvent)


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
    # the tool calls' partial JSON by block, as the helper keeps it
    json_bufs: dict[int, bytes] = {}
    for name, data in parse_sse(raw):
        assert name != "error", data
        event = _EVENT.validate_python(data)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    return Message.model_validate(snapshot.to_dict())
