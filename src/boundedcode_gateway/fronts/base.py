"""The APIs a caller may speak, each translated to and from the one internal call.

The internal call is a chat-completions body: every front builds one from its own
request (``to_chat``), the service answers it as it answers a chat-completions
caller, and the front writes that answer back in its own shape: a whole answer
(``answer``), a stream (``stream``: one translator per answer, fed the chat chunks
the relay produces) and an error (``error``). Routing, capabilities, the
reasoning store, the failure table and metering are the same for every front; the
record's ``front`` says which one the caller spoke.

``ChatFront`` is the identity: OpenAI chat completions in and out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from boundedcode_gateway.errors import GatewayError


class FrontStream(Protocol):
    """One streamed answer's translation: the chat chunks' bytes in (``data: ...`` events,
    as the relay writes them, several per call at times), the front's bytes out."""

    def feed(self, chunk: bytes) -> bytes: ...

    def end(self) -> bytes:
        """What the front sends after the last chunk (nothing for chat completions)."""
        ...


class Front(Protocol):
    """One API a caller may speak."""

    # the record's ``front``
    name: str

    def to_chat(self, parsed: Any, headers: Mapping[str, str]) -> Any:
        """The chat-completions body of a request in this front's shape (checked by the
        caller as any chat-completions body is); a ``GatewayError`` for a request this
        front refuses."""
        ...

    def answer(self, status: int, body: bytes) -> bytes:
        """A whole answer (a chat completion's JSON) in this front's shape."""
        ...

    def stream(self, model: str) -> FrontStream:
        """The translator of one streamed answer to a request for ``model``."""
        ...

    def error(self, exc: GatewayError) -> tuple[int, bytes]:
        """The status and body of an error in this front's shape."""
        ...


class _ChatStream:
    __slots__ = ()

    def feed(self, chunk: bytes) -> bytes:
        return chunk

    def end(self) -> bytes:
        return b""


_CHAT_STREAM = _ChatStream()


class ChatFront:
    """OpenAI chat completions: what the gateway speaks inside, passed through."""

    name = "chat"

    def to_chat(self, parsed: Any, headers: Mapping[str, str]) -> Any:
        return parsed

    def answer(self, status: int, body: bytes) -> bytes:
        return body

    def stream(self, model: str) -> FrontStream:
        return _CHAT_STREAM

    def error(self, exc: GatewayError) -> tuple[int, bytes]:
        return exc.http_status, exc.to_json()


CHAT = ChatFront()
