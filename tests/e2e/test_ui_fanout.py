"""A viewer of the page of calls that never reads its event stream holds up no call: 200
concurrent streamed calls all end and are all recorded while it stays connected. (Its
queue's bound and drop count are tested in tests/unit/test_ui_events.py; what a viewer
costs the calls in time is measured by ``python -m bench.ui_fanout``, not asserted here.)"""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp

from tests.e2e.conftest import Gateway, Upstreams

CALLS = 200


async def streamed_calls(url: str, n: int) -> list[bytes]:
    body = {
        "model": "local",
        "messages": [{"role": "user", "content": "count to three"}],
        "max_tokens": 10,
        "stream": True,
    }
    connector = aiohttp.TCPConnector(limit=n)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(i: int) -> bytes:
            headers = {"X-BoundedCode-Task": f"fan-{i % 10}"}
            async with session.post(
                url + "/v1/chat/completions", json=body, headers=headers
            ) as resp:
                assert resp.status == 200
                return await resp.read()

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_a_viewer_that_never_reads_holds_up_no_call(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.llama.total_slots = 8
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = gateway.url.removeprefix("http://").split(":")
    stalled.connect((host, int(port)))
    stalled.sendall(b"GET /ui/api/events HTTP/1.1\r\nhost: " + host.encode() + b"\r\n\r\n")
    try:
        deadline = time.monotonic() + 5
        while gateway.app.events.viewers == 0:
            assert time.monotonic() < deadline, "the viewer never connected"
            time.sleep(0.01)
        answers = asyncio.run(streamed_calls(gateway.url, CALLS))
        assert all(a.endswith(b"data: [DONE]\n\n") for a in answers)
        events = gateway.app.events
        assert events.viewers == 1 and events.in_flight == []
        assert len(gateway.calls()) == CALLS
    finally:
        stalled.close()
