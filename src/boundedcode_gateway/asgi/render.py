"""Writing answers to the ASGI ``send`` channel: JSON bodies, SSE streams, error bodies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from boundedcode_gateway.errors import GatewayError

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]
Receive = Callable[[], Awaitable[Message]]


class ErrorShape(Protocol):
    """How a caller's API words an error (a front, in ``fronts/``)."""

    def error(self, exc: GatewayError) -> tuple[int, bytes]:
        """(the status, the body) ``exc`` is answered with."""
        ...


JSON_HEADERS: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json")]
SSE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


async def send_json(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A complete JSON answer, with its length (not chunked)."""
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_body(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """A complete answer of another content type, with its length."""
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(
    send: Send, exc: GatewayError, close: bool = False, front: ErrorShape | None = None
) -> None:
    """The error in the shape of the caller's front (OpenAI's, by default) with its status."""
    # the front's rendering first: it may add headers of its own (Anthropic's request-id)
    status, body = front.error(exc) if front is not None else (exc.http_status, exc.to_json())
    extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers.items()]
    if close:
        extra.append((b"connection", b"close"))
    await send_json(send, status, body, extra)


async def start_stream(send: Send, first: bytes) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    await send({"type": "http.response.body", "body": first, "more_body": True})


async def send_chunk(send: Send, chunk: bytes) -> None:
    await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def end_stream(send: Send) -> None:
    await send({"type": "http.response.body", "body": b"", "more_body": False})
