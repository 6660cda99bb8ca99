"""uvicorn's httptools protocol with its writes gathered: one send per loop turn, not per message.

uvicorn writes a response's status line and headers, then its body, each with
its own ``transport.write`` and so its own ``send`` system call; a JSON answer
takes two where one does, and a stream's head and first chunk likewise. Writes
made in one turn of the event loop are joined and sent once at the end of it.

It also drops a caller that stops reading: uvicorn holds the answer's writes
while the transport's buffer is full (``pause_writing``) and would hold them,
and the upstream call behind them, for as long as the caller keeps its
connection open.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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


log = logging.getLogger(__name__)

# ``inference.write_stall_s``'s default
WRITE_STALL_S = 60.0


class GatheringHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's protocol on a ``GatheringTransport``; pass it as ``uvicorn.Config(http=...)``
    (``gathering_protocol`` gives it another write-stall limit).

    A caller whose connection stays full for ``write_stall_s`` (the transport's buffer
    above its high-water mark, and not drained below the low one) is cut off: uvicorn
    then reports the disconnect, and the call ends as any caller's leaving does.
    """

    write_stall_s: float = WRITE_STALL_S
    _stall: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        loop = asyncio.get_running_loop()
        # duck-typed: everything but write/close/abort goes to the real transport
        super().connection_made(cast(asyncio.Transport, GatheringTransport(transport, loop)))

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None:
            self._stall = self.loop.call_later(self.write_stall_s, self._stalled)

    def resume_writing(self) -> None:
        self._stop_stall_timer()
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_stall_timer()
        super().connection_lost(exc)

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


def gathering_protocol(write_stall_s: float) -> type[GatheringHttpToolsProtocol]:
    """The protocol class with its own write-stall limit (``inference.write_stall_s``)."""
    return type(
        "GatheringHttpToolsProtocol",
        (GatheringHttpToolsProtocol,),
        {"write_stall_s": write_stall_s},
    )
