"""The discard event: a stream extension only callers that declare it receive.

A caller that can drop what it showed of an answer declares so with the header
``X-BoundedCode-Stream-Discard: 1`` or with ``stream_options.boundedcode_discard:
true``. Only such a caller is sent, after a stream broke behind shown content,
the discard chunk and then the whole answer again; any other caller could glue
the second answer to the first. The contract is in docs/failures.md.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.openai_refusals import kind_of

HEADER = b"x-boundedcode-stream-discard"
HEADER_NAME = "X-BoundedCode-Stream-Discard"
STREAM_OPTION = "boundedcode_discard"

_HEADER_VALUES = {"1": True, "true": True, "0": False, "false": False}


def header_declares(value: str | None) -> bool:
    """Whether the header declares the caller understands the event (400 for a bad value)."""
    if value is None:
        return False
    declared = _HEADER_VALUES.get(value.strip().lower())
    if declared is None:
        raise InvalidRequest(
            f"Invalid {HEADER_NAME} header: use 1 (the caller drops what it showed when a "
            "discard event arrives) or 0",
            param=HEADER_NAME,
            code="invalid_value",
        )
    return declared


def check_stream_option(stream_options: dict[str, Any]) -> None:
    """``stream_options.boundedcode_discard``, when present, is a boolean."""
    value = stream_options.get(STREAM_OPTION)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(
            f"Invalid type for 'stream_options.{STREAM_OPTION}': expected a boolean, but got "
            f"{kind_of(value)} instead.",
            param=f"stream_options.{STREAM_OPTION}",
            code="invalid_type",
        )


def body_declares(body: dict[str, Any]) -> bool:
    stream_options = body.get("stream_options")
    return isinstance(stream_options, dict) and stream_options.get(STREAM_OPTION) is True


def without_stream_option(body: dict[str, Any]) -> dict[str, Any]:
    """The body with the gateway's own stream option taken out (no upstream knows it).

    The caller's body is not changed; a ``stream_options`` left empty goes too, since
    OpenAI refuses one on a request that does not stream.
    """
    stream_options = body.get("stream_options")
    if not isinstance(stream_options, dict) or STREAM_OPTION not in stream_options:
        return body
    rest = {k: v for k, v in stream_options.items() if k != STREAM_OPTION}
    out = dict(body)
    if rest:
        out["stream_options"] = rest
    else:
        del out["stream_options"]
    return out


def discard_chunk(call_id: str, model: str, reason: str) -> bytes:
    """The chunk telling the caller to drop what it showed of this answer."""
    return orjson.dumps(
        {
            "id": call_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [],
            "boundedcode": {"event": "discard", "reason": reason},
        }
    )
