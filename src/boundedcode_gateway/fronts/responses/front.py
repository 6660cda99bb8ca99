"""The Responses API front (``POST /v1/responses``): OpenAI's Responses API, served
statelessly on top of the one chat-completions call.

The translation is pure and lives in its own modules: ``request.py`` (a request as a
chat body), ``response.py`` (a chat completion as a ``Response``), ``stream.py`` (the
stream's events), ``errors.py``. This class only joins them to the ``Front``
protocol, whose ``answer`` and ``stream`` are given the chat answer and the model
alone: what the ``Response`` repeats of the request (its ``Echo``) is kept in the
call's context by ``to_chat``. The answer runs in a task made after ``to_chat``
returned, and a task starts with a copy of its maker's context, so each call sees
its own request's echo and no other.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

import orjson

from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.fronts.base import FrontStream
from boundedcode_gateway.fronts.responses.errors import error_answer
from boundedcode_gateway.fronts.responses.request import to_chat_request
from boundedcode_gateway.fronts.responses.response import Echo, Frame, from_chat_completion
from boundedcode_gateway.fronts.responses.stream import ResponsesStream
from boundedcode_gateway.fronts.sealing import Sealer
from boundedcode_gateway.providers.openai_shapes import SYSTEM_STAMPS, Stamps

_ECHO: ContextVar[Echo | None] = ContextVar("responses_echo", default=None)


class ResponsesFront:
    """OpenAI's Responses API, without stored responses."""

    name = "responses"

    def __init__(self, sealer: Sealer, stamps: Stamps = SYSTEM_STAMPS) -> None:
        self._sealer = sealer
        self._stamps = stamps

    def to_chat(self, parsed: Any, headers: Mapping[str, str]) -> Any:
        body, echo = to_chat_request(parsed, self._sealer)
        _ECHO.set(echo)
        return body

    def _echo(self, model: str) -> Echo:
        echo = _ECHO.get()
        return echo if echo is not None and echo.model == model else Echo(model=model)

    def answer(self, status: int, body: bytes) -> bytes:
        completion = orjson.loads(body)
        echo = _ECHO.get()
        if echo is None:
            model = completion.get("model") if isinstance(completion, dict) else None
            echo = Echo(model=model if isinstance(model, str) else "")
        frame = Frame.new(echo, self._stamps)
        return orjson.dumps(from_chat_completion(completion, frame, self._sealer, self._stamps))

    def stream(self, model: str) -> FrontStream:
        frame = Frame.new(self._echo(model), self._stamps)
        return ResponsesStream(frame, self._sealer, self._stamps)

    def error(self, exc: GatewayError) -> tuple[int, bytes]:
        return error_answer(exc)
