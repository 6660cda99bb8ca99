"""uvicorn's httptools protocol with its writes gathered, and the limits of a caller's connection.

uvicorn writes a response's status line and headers, then its body, each with
its own ``transport.write`` and so its own ``send`` system call; a JSON answer
takes two where one does, and a stream's head and first chunk likewise. Writes
made in one turn of the event loop are joined and sent once at the end of it.

uvicorn closes a connection left idle after a response (``timeout_keep_alive``),
but not one that never sends a request, sends its head a byte at a time, sends
an endless head or stops half-way through its body: each holds a file descriptor
and its buffers for as long as the caller likes. The protocol here bounds them:
the head must be complete within ``header_timeout_s`` of the connection's start
(or of the request's first byte) and within ``max_header_bytes``, and a kept-alive
connection between requests, like a body, must not stay idle for ``idle_timeout_s``.
A body's pace is the router's (read with ``asgi/body_read.py``), where its front is known.
At most ``max_connections`` are open at once: one more is answered 503 and closed as
it opens, before it can hold a head or a body.

It also drops a caller that stops reading: uvicorn holds the answer's writes
while the transport's buffer is full (``pause_writing``) and would hold them,
and the upstream call behind them, for as long as the caller keeps its
connection open.
"""

from __future__ import annotations

import asyncio
import http
import logging
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from boundedcode_gateway.config import LimitsSettings
from boundedcode_gateway.errors import GatewayError

log = logging.getLogger(__name__)

# ``inference.write_stall_s``'s default
WRITE_STALL_S = 60.0

# what a caller gets for a head over the limit, or a request that does not parse
_HEAD_TOO_LARGE = GatewayError(
    "The request's headers exceed the gateway's limit",
    code="request_header_fields_too_large",
    status=431,
    error_type="invalid_request_error",
)
_TOO_MANY_CONNECTIONS = GatewayError(
    "The gateway has as many connections open as limits.max_connections allows; try again shortly",
    code="too_many_connections",
    status=503,
    error_type="server_error",
)
# connections refused for the cap are told at most this often, with their count
CAP_LOG_EVERY_S = 10.0
_NOT_HTTP = GatewayError(
    "The request is not valid HTTP/1.1",
    code="invalid_http_request",
    status=400,
    error_type="invalid_request_error",
)


class GatheringTransport:
    """Wraps a transport: ``write`` collects, one callback per loop turn sends the lot."""

    __slots__ = ("_loop", "_pending", "_scheduled", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._pending.append(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def writelines(self, lines: list[bytes]) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        self._scheduled = False
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()  # what was written before close still goes out
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        pending = sum(len(d) for d in self._pending)
        return pending + self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def error_response(error: GatewayError) -> bytes:
    """A whole HTTP/1.1 response carrying the error's body; the connection closes after it."""
    body = error.to_json()
    head = (
        f"HTTP/1.1 {error.http_status} {http.HTTPStatus(error.http_status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class GatheringHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's protocol on a ``GatheringTransport``, with the connection limits of the module.

    Pass ``protocol_for(limits)`` as ``uvicorn.Config(http=...)``; this class itself
    carries the defaults of ``LimitsSettings``. The one timer of a connection is armed
    after the parser has taken a read, and only when a head or a body is still
    unfinished, so a request that arrives whole costs no timer at all.
    """

    write_stall_s: ClassVar[float] = WRITE_STALL_S
    header_timeout_s: ClassVar[float] = LimitsSettings().header_timeout_s
    max_header_bytes: ClassVar[int] = LimitsSettings().max_header_bytes
    idle_timeout_s: ClassVar[float] = LimitsSettings().idle_timeout_s
    max_connections: ClassVar[int] = LimitsSettings().max_connections
    # connections refused for the cap since the last line that told of them
    _cap_refused: ClassVar[int] = 0
    _cap_told_at: ClassVar[float] = float("-inf")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn's keep-alive timeout; it only reaches loop.call_later, which takes a float
        self.timeout_keep_alive = self.idle_timeout_s  # type: ignore[assignment]
        self._limit_timer: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None
        self._in_head = False
        self._in_body = False
        self._head_started = 0.0  # loop time the head began (or the connection, before one)
        self._head_bytes = 0  # bytes read while the head was unfinished
        self._header_bytes = 0  # bytes of the URL and the headers as parsed
        self._body_seen = 0.0  # loop time of the body's latest bytes
        self._head_too_large = False
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        loop = asyncio.get_running_loop()
        # duck-typed: everything but write/close/abort goes to the real transport
        super().connection_made(cast(asyncio.Transport, GatheringTransport(transport, loop)))
        if len(self.connections) > self.max_connections:
            self._refuse_over_cap()
            return
        # a connection that never sends a request is closed like a head that never ends
        self._begin_head()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self._stop_stall_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)
        elif self._in_body:
            self._body_seen = self.loop.time()
        super().data_received(data)
        if self._refused:
            return  # answered as not HTTP
        # the parser keeps an unfinished head in memory: refuse it once it is too large
        if self._head_too_large or (self._in_head and self._head_bytes > self.max_header_bytes):
            self._refuse(_HEAD_TOO_LARGE)
        elif self._limit_timer is None:
            self._arm()

    def _unsupported_upgrade_warning(self) -> None:
        # a request asking for WebSocket or HTTP/2 is answered as the HTTP/1.1 request it
        # also is: nothing for an operator to hear of, once per request
        return

    def send_400_response(self, msg: str) -> None:
        # uvicorn's own answer is text/plain; every answer of the gateway is OpenAI-shaped
        log.info("refused a request: %s", msg)
        self._refuse(_NOT_HTTP)

    # -- the parser's callbacks

    def on_message_begin(self) -> None:
        if not self._in_head:
            self._begin_head()
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_timer()
        self._in_head = False
        if self._header_bytes > self.max_header_bytes:
            self._head_too_large = True  # answered once the parser returns
            return
        self._in_body = True
        self._body_seen = self.loop.time()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._head_too_large:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._stop_timer()
        self._in_body = False
        if not self._head_too_large:
            super().on_message_complete()

    # -- the limits

    def _begin_head(self) -> None:
        self._in_head = True
        self._head_started = self.loop.time()
        self._head_bytes = 0
        self._header_bytes = 0

    def _arm(self) -> None:
        """The timer of what is unfinished: the head's deadline, or the body's idle limit."""
        if self._in_head:
            due = self._head_started + self.header_timeout_s
        elif self._in_body:
            due = self._body_seen + self.idle_timeout_s
        else:
            return
        self._limit_timer = self.loop.call_at(due, self._limit_reached)

    def _stop_timer(self) -> None:
        if self._limit_timer is not None:
            self._limit_timer.cancel()
            self._limit_timer = None

    def _limit_reached(self) -> None:
        """Close the connection if its head or body is overdue; a body that moved on since
        the timer was set gets a new one (set when it fires, not on every chunk)."""
        self._limit_timer = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        overdue = (self._in_head and now >= self._head_started + self.header_timeout_s) or (
            self._in_body and now >= self._body_seen + self.idle_timeout_s
        )
        if overdue:
            self.transport.close()
        else:
            self._arm()

    def _refuse_over_cap(self) -> None:
        """Answer 503 and close; told on stderr at most every ``CAP_LOG_EVERY_S`` (a flood
        of connections would otherwise be a flood of lines, written on the loop)."""
        cls = GatheringHttpToolsProtocol
        cls._cap_refused += 1
        now = self.loop.time()
        if now - cls._cap_told_at >= CAP_LOG_EVERY_S:
            log.warning(
                "refused %d connection(s): %d open, limits.max_connections is %d",
                cls._cap_refused,
                len(self.connections) - 1,
                self.max_connections,
            )
            cls._cap_refused = 0
            cls._cap_told_at = now
        self._refuse(_TOO_MANY_CONNECTIONS)

    def _refuse(self, error: GatewayError) -> None:
        self._refused = True
        self._stop_timer()
        if not self.transport.is_closing():
            self.transport.write(error_response(error))
            self.transport.close()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            self._stall = self.loop.call_later(self.write_stall_s, self._stalled)

    def resume_writing(self) -> None:
        self._stop_stall_timer()
        super().resume_writing()

    def _stop_stall_timer(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stalled(self) -> None:
        self._stall = None
        log.warning(
            "a caller left its answer unread for %g s (inference.write_stall_s); "
            "its connection is closed",
            self.write_stall_s,
        )
        self.transport.abort()


def protocol_for(
    limits: LimitsSettings, write_stall_s: float = WRITE_STALL_S
) -> type[GatheringHttpToolsProtocol]:
    """The protocol class with these limits and this write-stall limit
    (``inference.write_stall_s``), for ``uvicorn.Config(http=...)``."""
    attributes = {
        "header_timeout_s": limits.header_timeout_s,
        "max_header_bytes": limits.max_header_bytes,
        "idle_timeout_s": limits.idle_timeout_s,
        "max_connections": limits.max_connections,
        "write_stall_s": write_stall_s,
    }
    return type("LimitedHttpToolsProtocol", (GatheringHttpToolsProtocol,), attributes)
