"""The APIs a caller may speak, each translated to and from the one internal call.

The internal call is a chat-completions body: every front opens a call from its own
request (``open``: a ``FrontCall`` holding the chat body and what its answer repeats
of the request), the service answers the body as it answers a chat-completions
caller, and the call writes that answer back in the front's shape: a whole answer
(``answer``) or a stream (``stream``: one translator, fed the chat chunks the relay
produces). An error is the front's (``error``), whether or not a call was opened.
Routing, capabilities, the reasoning store, the failure table and metering are the
same for every front; the record's ``front`` says which one the caller spoke.

``ChatFront`` is the identity: OpenAI chat completions in and out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.fronts.sealing import SealBinding


class FrontStream(Protocol):
    """One streamed answer's translation: the chat chunks' bytes in (``data: ...`` events,
    as the relay writes them, several per call at times), the front's bytes out."""

    def feed(self, chunk: bytes) -> bytes: ...

    def end(self) -> bytes:
        """What the front sends after the last chunk (nothing for chat completions)."""
        ...


class FrontCall(Protocol):
    """One request in a front's shape, made a chat-completions call."""

    # the chat-completions body (checked by the router as any chat body is)
    body: Any

    def answer(self, status: int, body: bytes) -> bytes:
        """The whole answer (a chat completion's JSON) in the front's shape."""
        ...

    def stream(self) -> FrontStream:
        """The translator of the streamed answer."""
        ...


@runtime_checkable
class AdjustingCall(FrontCall, Protocol):
    """A call whose front changed the request on its own account (a tool it left out,
    a version it served as another): the record's ``adjustments`` get these."""

    adjustments: dict[str, Any]


class Front(Protocol):
    """One API a caller may speak."""

    # the record's ``front``
    name: str

    def open(self, parsed: Any, headers: Mapping[str, str], binding: SealBinding) -> FrontCall:
        """The call of a request in this front's shape; a ``GatewayError`` for a request
        this front refuses. ``binding``: the call's task and caller scope, which what the
        front signs or seals is bound to, and what it takes back must be."""
        ...

    def error(self, exc: GatewayError) -> tuple[int, bytes]:
        """The status and body of an error in this front's shape."""
        ...


@runtime_checkable
class TokenCounter(Front, Protocol):
    """A front whose requests are counted, not answered: the chat body of the call it
    opens is rendered and its tokens counted, never sent; recorded as a count (purpose
    ``token_count``), under the same access checks and budgets as the call."""

    def counted(self, tokens: int) -> bytes:
        """The answer: ``tokens`` in this front's shape."""
        ...


class _ChatCall:
    """Chat completions: the body and the answer as they are."""

    __slots__ = ("body",)

    def __init__(self, body: Any) -> None:
        self.body = body

    def answer(self, status: int, body: bytes) -> bytes:
        return body

    def stream(self) -> FrontStream:
        return _CHAT_STREAM


class _ChatStream:
    __slots__ = ()

    def feed(self, chunk: bytes) -> bytes:
        return chunk

    def end(self) -> bytes:
        return b""


_CHAT_STREAM = _ChatStream()


class ChatFront:
    """OpenAI chat completions: what the gateway speaks inside, passed through (the
    router does not open its calls: it answers them as they are)."""

    name = "chat"

    def open(self, parsed: Any, headers: Mapping[str, str], binding: SealBinding) -> FrontCall:
        return _ChatCall(parsed)

    def error(self, exc: GatewayError) -> tuple[int, bytes]:
        return exc.http_status, exc.to_json()


CHAT = ChatFront()
