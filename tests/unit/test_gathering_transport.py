"""The server's gathering transport: writes of one loop turn leave in one send, none is lost."""

from __future__ import annotations

import asyncio
from typing import cast

from boundedcode_gateway.ingress.server import GatheringTransport


class RecordingTransport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def _wrap() -> tuple[RecordingTransport, GatheringTransport]:
    inner = RecordingTransport()
    loop = asyncio.get_running_loop()
    return inner, GatheringTransport(cast(asyncio.Transport, inner), loop)


async def test_writes_of_one_turn_leave_as_one_send() -> None:
    inner, outer = _wrap()
    outer.write(b"HTTP/1.1 200 OK\r\n\r\n")
    outer.write(b"")
    outer.writelines([b"{", b"}"])
    assert inner.sent == []
    assert outer.get_write_buffer_size() == 21
    await asyncio.sleep(0)
    assert inner.sent == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    outer.write(b"next")
    await asyncio.sleep(0)
    assert inner.sent[-1] == b"next"


async def test_close_sends_what_was_written_first() -> None:
    inner, outer = _wrap()
    outer.write(b"last words")
    outer.close()
    assert inner.sent == [b"last words"]
    assert inner.closed
    await asyncio.sleep(0)
    assert inner.sent == [b"last words"]


async def test_abort_drops_and_other_calls_pass_through() -> None:
    inner, outer = _wrap()
    outer.write(b"never sent")
    outer.abort()
    await asyncio.sleep(0)
    assert inner.sent == []
    assert inner.aborted
    assert outer.get_extra_info("sockname") == "info:sockname"
