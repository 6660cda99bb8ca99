"""Errors in the Responses API's shapes (pure).

An error before the answer starts is OpenAI's error body with the chat path's status
(the Responses API uses the same ``{"error": {message, type, param, code}}``); a
prompt longer than the model's context is ``context_length_exceeded``, as for chat.
An error inside a stream is an ``error`` event and then ``response.failed``, whose
``error`` keeps the gateway's code (``upstream_stream_broken``,
``context_length_exceeded``, …): Codex reads that code to decide whether to compact
the conversation or try again.
"""

from __future__ import annotations

from typing import Any

from boundedcode_gateway.errors import GatewayError

JSON = dict[str, Any]


def error_answer(exc: GatewayError) -> tuple[int, bytes]:
    """The status and body of an error answered instead of a response."""
    return exc.http_status, exc.to_json()


def failure_of(error: JSON) -> tuple[JSON, JSON]:
    """(the ``error`` event, the failed response's ``error``) of an in-stream chat error."""
    message = error.get("message")
    text = message if isinstance(message, str) and message else "The answer failed."
    code = error.get("code") if isinstance(error.get("code"), str) else None
    param = error.get("param") if isinstance(error.get("param"), str) else None
    kind = error.get("type") if isinstance(error.get("type"), str) else None
    event: JSON = {"type": "error", "code": code, "message": text, "param": param}
    failed: JSON = {"code": code or "server_error", "message": text, "param": param, "type": kind}
    return event, failed
