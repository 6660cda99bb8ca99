"""The openai SDK's own Responses types as the judge of what the Responses front writes.

Every event and every ``Response`` is validated against the SDK's pydantic models (not
just constructed, as the SDK's client does), so a missing or mistyped field fails.
One allowance: ``response.failed`` keeps the gateway's error code (say
``upstream_stream_broken``), and the SDK's ``ResponseError.code`` lists fewer codes
than OpenAI sends (``context_length_exceeded``, which Codex reads, is not among them);
the code is checked to be a string, the rest of the event strictly.
"""

from __future__ import annotations

from typing import Any, get_args

import orjson
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel

# the gateway's own event, sent only to a caller that declared the discard extension
DISCARD_EVENT = "boundedcode.discard"


def _event_classes() -> dict[str, type[BaseModel]]:
    union = get_args(ResponseStreamEvent)[0]
    classes: dict[str, type[BaseModel]] = {}
    for cls in get_args(union):
        (name,) = get_args(cls.model_fields["type"].annotation)
        classes[name] = cls
    return classes


EVENT_CLASSES = _event_classes()


def check_response(obj: Any) -> Response:
    """``obj`` validated as the SDK's ``Response``."""
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        code = obj["error"].get("code")
        assert isinstance(code, str), obj["error"]
        obj = {**obj, "error": {**obj["error"], "code": "server_error"}}
    return Response.model_validate(obj)


def check_event(event: dict[str, Any]) -> BaseModel:
    """``event`` validated as the SDK's event of its type (an unknown type fails)."""
    kind = event["type"]
    assert kind in EVENT_CLASSES, f"not an event of the SDK's: {kind}"
    if "response" in event:
        check_response(event["response"])
        event = {**event, "response": {**event["response"], "error": None}}
    return EVENT_CLASSES[kind].model_validate(event)


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The events of a Responses stream's bytes; each one's ``event:`` name is its type."""
    events: list[dict[str, Any]] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not block.strip():
            continue
        lines = block.split(b"\n")
        names = [ln[6:].strip() for ln in lines if ln.startswith(b"event:")]
        data = b"\n".join(ln[5:].lstrip(b" ") for ln in lines if ln.startswith(b"data:"))
        event = orjson.loads(data)
        assert names == [event["type"].encode()], block
        events.append(event)
    return events


def check_stream(raw: bytes, discard: bool = False) -> list[dict[str, Any]]:
    """The events of a stream, each checked; sequence numbers count up from 0."""
    events = sse_events(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        if discard and event["type"] == DISCARD_EVENT:
            continue
        check_event(event)
    return events
