"""The Responses API front (``POST /v1/responses``): OpenAI's Responses API, served
statelessly on top of the one chat-completions call.

The translation is pure and lives in its own modules: ``request.py`` (a request as a
chat body), ``response.py`` (a chat completion as a ``Response``), ``stream.py`` (the
stream's events), ``errors.py``. This module joins them to the ``Front`` protocol:
``open`` makes the chat body and keeps what the ``Response`` repeats of the request
(its ``Echo``) in the call it returns, for the answer or the stream, with what the
translation left out of the request for the record (``adjustments``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.fronts.base import FrontStream
from boundedcode_gateway.fronts.responses.errors import error_answer
from boundedcode_gateway.fronts.responses.request import to_chat_request
from boundedcode_gateway.fronts.responses.response import Echo, Frame, from_chat_completion
from boundedcode_gateway.fronts.responses.stream import ResponsesStream
from boundedcode_gateway.fronts.sealing import SealBinding, Sealer
from boundedcode_gateway.wire.chat import SYSTEM_STAMPS, Stamps


class ResponsesCall:
    """One request of the Responses API: its chat body, and what its answer repeats."""

    __slots__ = ("_echo", "_sealer", "_stamps", "adjustments", "body")

    def __init__(
        self, body: Any, echo: Echo, sealer: Sealer, stamps: Stamps, adjustments: dict[str, Any]
    ) -> None:
        self.body = body
        # what the translation left out of the request (dropped tools, …), for the record
        self.adjustments = adjustments
        self._echo = echo
        self._sealer = sealer
        self._stamps = stamps

    def answer(self, status: int, body: bytes) -> bytes:
        completion = orjson.loads(body)
        frame = Frame.new(self._echo, self._stamps)
        return orjson.dumps(from_chat_completion(completion, frame, self._sealer, self._stamps))

    def stream(self) -> FrontStream:
        frame = Frame.new(self._echo, self._stamps)
        return ResponsesStream(frame, self._sealer, self._stamps)


class ResponsesFront:
    """OpenAI's Responses API, without stored responses."""

    name = "responses"

    def __init__(self, sealer: Sealer, stamps: Stamps = SYSTEM_STAMPS) -> None:
        self._sealer = sealer
        self._stamps = stamps

    def open(self, parsed: Any, headers: Mapping[str, str], binding: SealBinding) -> ResponsesCall:
        notes: dict[str, Any] = {}
        sealer = self._sealer.bound(binding)
        body, echo = to_chat_request(parsed, sealer, notes)
        return ResponsesCall(body, echo, sealer, self._stamps, notes)

    def error(self, exc: GatewayError) -> tuple[int, bytes]:
        return error_answer(exc)
