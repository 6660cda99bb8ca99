"""A TCP proxy on 127.0.0.1 in front of one port, that a test can cut and restore.

``cut()`` closes every connection through it at once (reset, as a database that went
away would) and stops listening, so that new connections are refused; ``restore()``
listens again on the same port. In between, nothing reaches the server behind it.

Plain protocols rather than streams: each connection's transport is known from the
moment it is made, so a cut (or the stop) reaches every one, also one accepted an
instant before whose handler had not run yet.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Self

from tests.fakes.threaded_server import ThreadedStreamServer


class _End(asyncio.Protocol):
    """One end of a proxied connection: what it receives goes out of the other end."""

    def __init__(self, proxy: TcpProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.other: _End | None = None
        self.waiting: list[bytes] = []  # received before the other end was connected
        self.ended = False  # the peer sent its last byte

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.proxy.transports.add(transport)

    def join(self, other: _End) -> None:
        self.other = other
        for data in self.waiting:
            self._forward(data)
        self.waiting.clear()
        if self.ended:
            self.eof_received()

    def data_received(self, data: bytes) -> None:
        if self.other is None:
            self.waiting.append(data)
        else:
            self._forward(data)

    def eof_received(self) -> bool:
        self.ended = True
        out = None if self.other is None else self.other.transport
        if out is not None and not out.is_closing() and out.can_write_eof():
            out.write_eof()
        return True  # the other direction may still carry data

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.proxy.transports.discard(self.transport)
        out = None if self.other is None else self.other.transport
        if out is not None:
            out.abort()

    def _forward(self, data: bytes) -> None:
        assert self.other is not None and self.other.transport is not None
        if not self.other.transport.is_closing():
            self.other.transport.write(data)


class _Accepted(_End):
    """The end a client connected to: it opens the other end, to the server behind."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if not self.proxy.listening:
            assert self.transport is not None
            self.transport.abort()
            return
        self.proxy.accepted += 1
        task = asyncio.get_running_loop().create_task(self._reach_server())
        self.proxy.tasks.add(task)
        task.add_done_callback(self.proxy.tasks.discard)

    async def _reach_server(self) -> None:
        loop = asyncio.get_running_loop()
        server = _End(self.proxy)
        try:
            await loop.create_connection(lambda: server, "127.0.0.1", self.proxy.target_port)
        except OSError:
            if self.transport is not None:
                self.transport.abort()
            return
        if self.transport is None or self.transport.is_closing() or not self.proxy.listening:
            if server.transport is not None:
                server.transport.abort()
            return
        server.join(self)
        self.join(server)


@dataclass
class TcpProxy(ThreadedStreamServer):
    target_port: int
    accepted: int = 0  # connections taken, over every period it listened
    listening: bool = True  # False from a cut until the restore

    def __post_init__(self) -> None:
        super().__post_init__()
        self.transports: set[asyncio.Transport] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._listener: socket.socket | None = None

    def start(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(0), self._loop).result(5)
        return self

    def cut(self) -> None:
        asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(10)

    def restore(self) -> None:
        asyncio.run_coroutine_threadsafe(self._listen(self.port), self._loop).result(10)

    async def _listen(self, port: int) -> None:
        listener = socket.socket()
        # the port is ours again at once after a cut
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        listener.setblocking(False)
        self.port = int(listener.getsockname()[1])
        self.listening = True
        self._listener = listener
        task = asyncio.get_running_loop().create_task(self._accept(listener))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        # An accept loop of its own rather than asyncio's server: Python 3.11's leaves a
        # connection it accepted just before the server was closed open and unanswered.
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError:
                return  # the listener was closed by a cut
            # one accepted after the cut is closed in connection_made
            await loop.connect_accepted_socket(lambda: _Accepted(self), conn)

    async def _cut(self) -> None:
        self.listening = False
        if self._listener is not None:
            # No accept after this (the loop waiting on it is left waiting, not cancelled: a
            # cancel could drop a connection it had just accepted, open).
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        for transport in list(self.transports):
            transport.abort()

    async def _close(self) -> None:
        await self._cut()
        await super()._close()
        # An aborted transport closes its socket on a later turn of the loop (and its end's
        # connection_lost aborts the other end): let those turns run before the loop stops.
        for _ in range(100):
            if not self.transports:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
