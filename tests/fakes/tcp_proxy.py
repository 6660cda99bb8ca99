"""A TCP proxy on 127.0.0.1 in front of one port, that a test can cut and restore.

``cut()`` closes every connection through it at once (reset, as a database that went
away would) and stops listening, so that new connections are refused; ``restore()``
listens again on the same port. In between, nothing reaches the server behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from tests.fakes.threaded_server import ThreadedStreamServer

CHUNK = 64 * 1024


@dataclass
class TcpProxy(ThreadedStreamServer):
    target_port: int
    accepted: int = 0  # connections taken, over every period it listened

    def cut(self) -> None:
        asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(10)

    def restore(self) -> None:
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _listen(self) -> None:
        # the port is ours again at once: the listening socket asks for SO_REUSEADDR
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction until it ends; then end the other side's writing too."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError, RuntimeError):
        if not writer.is_closing() and writer.can_write_eof():
            writer.write_eof()
