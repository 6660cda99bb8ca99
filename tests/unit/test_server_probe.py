"""``llama_server/probe.py``: a server is up when it answers anything but 503; one probe's
verdict is reused for a moment, and probes at once share one request."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from boundedcode_gateway.llama_server import probe
from boundedcode_gateway.llama_server.api import LlamaServerAPI
from boundedcode_gateway.llama_server.probe import PROBE_TTL_S, ServerProbe
from boundedcode_gateway.upstream.http import HttpClient, Timeouts
from tests.unit.scripted_http import Answer, scripted_server, whole


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def http() -> AsyncIterator[HttpClient]:
    client = HttpClient(Timeouts(connect_s=2.0, read_s=5.0))
    yield client
    await client.close()


def no_headers(root: str) -> dict[str, str]:
    return {}


async def test_a_verdict_is_reused_until_it_is_old(http: HttpClient) -> None:
    health = whole(200, b'{"status":"ok"}')
    loading = whole(503, b'{"error":{"code":503,"message":"Loading model"}}')
    async with scripted_server(Answer([health]), Answer([loading])) as srv:
        clock = Clock()
        check = ServerProbe(LlamaServerAPI(http, no_headers), srv.url, clock)
        assert await asyncio.gather(*(check.check() for _ in range(5))) == [None] * 5
        assert len(srv.seen) == 1 and srv.seen[0].request_line == "GET /health HTTP/1.1"
        clock.now += PROBE_TTL_S
        reason = await check.check()
        assert reason is not None and "503" in reason and srv.url in reason
        assert await check.check() == reason and len(srv.seen) == 2


async def test_a_server_without_health_that_answers_is_up(http: HttpClient) -> None:
    async with scripted_server(Answer([whole(404, b"not found")])) as srv:
        assert await ServerProbe(LlamaServerAPI(http, no_headers), srv.url).check() is None


async def test_a_refused_connection_is_named(http: HttpClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once it is closed
    root = f"http://user:secret@127.0.0.1:{port}"
    reason = await ServerProbe(LlamaServerAPI(http, no_headers), root).check()
    assert reason is not None
    assert reason.startswith(f"the server at http://127.0.0.1:{port} cannot be reached")
    assert "secret" not in reason


async def test_silence_is_a_verdict_after_the_probe_timeout(
    http: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe, "PROBE_TIMEOUT_S", 0.2)
    async with scripted_server(Answer([], "hold")) as srv:
        reason = await ServerProbe(LlamaServerAPI(http, no_headers), srv.url).check()
    assert reason is not None and "did not answer within 0.2 s" in reason
