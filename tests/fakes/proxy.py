"""A small HTTP proxy on 127.0.0.1 that records what it saw: CONNECT and absolute-form.

Like a company proxy, it reaches names its clients cannot resolve: each name in
``names`` is served on 127.0.0.1 at the port the request names. It can refuse every
request with a status (407, 403), and it reads the server name (SNI) out of the TLS
ClientHello that goes through a CONNECT tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tests.fakes.threaded_server import ThreadedStreamServer

REASONS = {403: "Forbidden", 407: "Proxy Authentication Required", 502: "Bad Gateway"}


@dataclass
class Seen:
    """One request the proxy received: CONNECT host:port, or an absolute-form request."""

    method: str
    target: str
    headers: dict[str, str]  # names lower-cased
    sni: str | None = None


@dataclass
class FakeProxy(ThreadedStreamServer):
    names: set[str]
    refuse: int | None = None  # answer every request with this status
    seen: list[Seen] = field(default_factory=list)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            line, *rest = head.split("\r\n")
            method, target, _ = line.split(" ", 2)
            headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (h.partition(":") for h in rest if h)
            }
            seen = Seen(method, target, headers)
            self.seen.append(seen)
            if self.refuse is not None:
                await _answer(writer, self.refuse)
            elif method == "CONNECT":
                await self._tunnel(seen, reader, writer)
            else:
                await self._forward(seen, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _open(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if host not in self.names:
            raise ConnectionError(f"the proxy cannot reach {host}")
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        self._writers.add(up_writer)
        return up_reader, up_writer

    async def _tunnel(
        self, seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        host, _, port = seen.target.rpartition(":")
        try:
            up_reader, up_writer = await self._open(host, int(port))
        except ConnectionError:
            await _answer(writer, 502)
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        # the client's first TLS record is its ClientHello, which names the server
        record = await reader.readexactly(5)
        record += await reader.readexactly(int.from_bytes(record[3:5], "big"))
        seen.sni = client_hello_server_name(record)
        up_writer.write(record)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def _forward(
        self, seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        url = urlsplit(seen.target)
        try:
            up_reader, up_writer = await self._open(url.hostname or "", url.port or 80)
        except ConnectionError:
            await _answer(writer, 502)
            return
        body = await reader.readexactly(int(seen.headers.get("content-length", "0")))
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        lines = [f"{seen.method} {path} HTTP/1.1"]
        skip = {"proxy-authorization", "proxy-connection", "connection"}
        lines += [f"{k}: {v}" for k, v in seen.headers.items() if k not in skip]
        lines.append("Connection: close")  # one request per connection keeps this proxy small
        up_writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await _pipe(up_reader, writer)
        up_writer.close()


async def _answer(writer: asyncio.StreamWriter, status: int) -> None:
    reason = REASONS.get(status, "Refused")
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
    )
    await writer.drain()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(1 << 16):
            sink.write(data)
            await sink.drain()
    except ConnectionError:
        pass
    finally:
        sink.close()


def client_hello_server_name(record: bytes) -> str | None:
    """The server_name extension of a TLS ClientHello record, if it has one."""
    try:
        if record[0] != 0x16 or record[5] != 0x01:  # handshake record, ClientHello
            return None
        at = 5 + 4 + 2 + 32  # record header, handshake header, version, random
        at += 1 + record[at]  # session id
        at += 2 + int.from_bytes(record[at : at + 2], "big")  # cipher suites
        at += 1 + record[at]  # compression methods
        end = at + 2 + int.from_bytes(record[at : at + 2], "big")
        at += 2
        while at + 4 <= end:
            kind = int.from_bytes(record[at : at + 2], "big")
            size = int.from_bytes(record[at + 2 : at + 4], "big")
            at += 4
            if kind == 0:  # server_name: list length (2), name type (1), name length (2), name
                length = int.from_bytes(record[at + 3 : at + 5], "big")
                return record[at + 5 : at + 5 + length].decode("ascii")
            at += size
    except IndexError:
        return None
    return None
