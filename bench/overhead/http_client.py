"""A minimal keep-alive HTTP/1.1 client for the load generator: one request at a time.

An asyncio protocol with httptools parsing (Content-Length and chunked bodies
alike), so the load generator's own cost per request stays small and the times
it takes are those of the bytes on the socket: sent, first body byte, complete.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import cast

import httptools


@dataclass(slots=True)
class Timing:
    """One exchange, in ``perf_counter_ns`` units (ns); ``first`` is the first body byte."""

    sent: int
    first: int
    done: int
    status: int
    body: bytes


class _Exchange(asyncio.Protocol):
    __slots__ = ("_body", "_done", "_first", "_parser", "_waiter", "closed", "transport")

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._body: list[bytes] = []
        self._first = 0
        self._done = 0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(exc)

    def on_body(self, body: bytes) -> None:
        if not self._first:
            self._first = time.perf_counter_ns()
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._done = time.perf_counter_ns()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def exchange(self, request: bytes) -> Timing:
        assert self.transport is not None
        self._body = []
        self._first = 0
        self._waiter = asyncio.get_running_loop().create_future()
        sent = time.perf_counter_ns()
        self.transport.write(request)
        await self._waiter
        status = self._parser.get_status_code()
        return Timing(sent, self._first or self._done, self._done, status, b"".join(self._body))


def build_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The request's bytes, built once and sent many times."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"host: {host}:{port}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Connection:
    """One kept-alive connection; reopened if the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._proto: _Exchange | None = None

    async def _open(self) -> _Exchange:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(_Exchange, self.host, self.port)
        return proto

    async def send(self, request: bytes) -> Timing:
        if self._proto is None or self._proto.closed:
            self._proto = await self._open()
        return await self._proto.exchange(request)

    def close(self) -> None:
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        self._proto = None
