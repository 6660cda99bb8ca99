"""The Messages front (``POST /v1/messages``) and its token count
(``POST /v1/messages/count_tokens``), on the ``Front`` protocol: ``open`` makes the
chat body (request.py) and the call it returns writes the answer (response.py) or the
stream (stream.py) back; errors are errors.py's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.fronts.base import FrontStream
from boundedcode_gateway.fronts.messages.errors import from_gateway_error
from boundedcode_gateway.fronts.messages.request import check_headers, to_chat_body
from boundedcode_gateway.fronts.messages.response import answer_body
from boundedcode_gateway.fronts.messages.stream import MessagesStream
from boundedcode_gateway.fronts.sealing import SealBinding, Sealer


class MessagesCall:
    """One request of the Messages API: its chat body, answered in Anthropic's shapes;
    what the front left out or changed, for the record (``adjustments``)."""

    __slots__ = ("_sealer", "adjustments", "body")

    def __init__(self, body: dict[str, Any], sealer: Sealer, adjustments: dict[str, Any]) -> None:
        self.body = body
        self._sealer = sealer
        self.adjustments = adjustments

    def answer(self, status: int, body: bytes) -> bytes:
        return answer_body(body, self.body["model"], self._sealer.sign)

    def stream(self) -> FrontStream:
        return MessagesStream(self.body["model"], self._sealer.sign)


class MessagesFront:
    """Anthropic's Messages API; thinking blocks signed with the gateway's key."""

    name = "messages"
    # count_tokens takes the request without max_tokens
    _counting = False

    def __init__(self, sealer: Sealer) -> None:
        self._sealer = sealer

    def open(self, parsed: Any, headers: Mapping[str, str], binding: SealBinding) -> MessagesCall:
        rules = check_headers(headers)
        adjustments: dict[str, Any] = {}
        sealer = self._sealer.bound(binding)
        body = to_chat_body(
            parsed,
            sealer.verify,
            counting=self._counting,
            rules=rules,
            adjustments=adjustments,
        )
        return MessagesCall(body, sealer, adjustments)

    def error(self, exc: GatewayError) -> tuple[int, bytes]:
        return from_gateway_error(exc)


class MessagesCountFront(MessagesFront):
    """``count_tokens``: the same request without ``max_tokens``, counted, not answered."""

    _counting = True

    def counted(self, tokens: int) -> bytes:
        return orjson.dumps({"input_tokens": tokens})
