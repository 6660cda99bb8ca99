"""uvicorn's httptools protocol with its writes gathered: one send per loop turn, not per message.

uvicorn writes a response's status line and headers, then its body, each with
its own ``transport.write`` and so its own ``send`` system call; a JSON answer
takes two where one does, and a stream's head and first chunk likewise. Writes
made in one turn of the event loop are joined and sent once at the end of it.
"""

from __future__ import annotations

import asyncio
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


class GatheringHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's protocol on a ``GatheringTransport``; pass it as ``uvicorn.Config(http=...)``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        loop = asyncio.get_running_loop()
        # duck-typed: everything but write/close/abort goes to the real transport
        super().connection_made(cast(asyncio.Transport, GatheringTransport(transport, loop)))
