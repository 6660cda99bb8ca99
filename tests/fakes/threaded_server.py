"""A raw asyncio stream server on 127.0.0.1, run on an event loop in a thread of its own.

For fakes that speak bytes rather than ASGI (a proxy, an upstream that misbehaves
on the wire): the subclass answers each connection in ``_handle`` and registers
its writer in ``_writers`` so that ``stop`` can close it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Self


class ThreadedStreamServer:
    """Start with ``start()`` (the port is then known), stop with ``stop()``."""

    port: int = 0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self) -> Self:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        )
        self._server = started.result(5)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError
