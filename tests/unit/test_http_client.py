"""The gateway's own HTTP client (providers/http.py) against a scripted server: bodies by
length, chunked and close-delimited, compressed bodies, back-pressure on a slow reader,
timeouts, cut answers and the pool."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable

import pytest

from boundedcode_gateway.errors import (
    ResponseTooLarge,
    StreamBroken,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from boundedcode_gateway.upstream import http as http_module
from boundedcode_gateway.upstream.http import HttpClient, Limits, Timeouts, iter_body, read_body
from tests.unit.scripted_http import (
    Answer,
    ScriptedServer,
    chunk,
    chunked,
    deflated,
    gzipped,
    head,
    scripted_server,
    whole,
)

BODY = b'{"answer": "' + b"forty-two " * 300 + b'"}'
# a read timeout far shorter than any test's wait, which a silent server outlasts anyway
READ_S = 0.3


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    http = HttpClient(Timeouts(connect_s=5.0, read_s=READ_S))
    yield http
    await http.close()


async def _get(http: HttpClient, server: ScriptedServer, resend_safe: bool = False) -> bytes:
    resp = await http.send("POST", server.url + "/x", {}, b"{}", resend_safe=resend_safe)
    return await read_body(resp)


async def test_a_body_with_a_length_is_read_whole_and_the_connection_kept(
    client: HttpClient,
) -> None:
    async with scripted_server(Answer([whole(200, BODY)]), Answer([whole(200, b"2")])) as server:
        assert await _get(client, server) == BODY
        assert await _get(client, server) == b"2"
    assert [s.connection for s in server.seen] == [1, 1]
    assert server.seen[0].request_line == "POST /x HTTP/1.1"
    assert server.seen[0].header("content-length") == "2"


async def test_a_chunked_body_arrives_piece_by_piece_and_the_connection_is_kept(
    client: HttpClient,
) -> None:
    pieces = [b"data: one\n\n", b"data: two\n\n", b"data: three\n\n"]
    async with scripted_server(chunked(200, pieces), Answer([whole(200, b"next")])) as server:
        resp = await client.send("POST", server.url + "/s", {}, b"{}")
        assert resp.status == 200
        got = [piece async for piece in iter_body(resp)]
        resp.release()
        assert b"".join(got) == b"".join(pieces)
        assert await _get(client, server) == b"next"
    assert [s.connection for s in server.seen] == [1, 1]


async def test_a_body_without_length_ends_with_the_connection(client: HttpClient) -> None:
    close_delimited = Answer([head(200, {"Content-Type": "text/event-stream"}), BODY], "close")
    async with scripted_server(close_delimited, Answer([whole(200, b"again")])) as server:
        assert await _get(client, server) == BODY
        # that connection is gone: the next request opens another
        assert await _get(client, server) == b"again"
    assert [s.connection for s in server.seen] == [1, 2]


@pytest.mark.parametrize(
    ("encoding", "encode"), [("gzip", gzipped), ("deflate", deflated)], ids=["gzip", "deflate"]
)
async def test_a_compressed_body_is_decoded(
    client: HttpClient, encoding: str, encode: Callable[[bytes], bytes]
) -> None:
    packed = encode(BODY)
    headers = {"Content-Encoding": encoding}
    # whole, and chunked in pieces that split the compressed stream anywhere
    split = [packed[:7], packed[7:100], packed[100:]]
    async with scripted_server(
        Answer([whole(200, packed, headers)]), chunked(200, split, headers)
    ) as server:
        assert await _get(client, server) == BODY
        resp = await client.send("POST", server.url + "/s", {}, b"{}")
        assert b"".join([p async for p in iter_body(resp)]) == BODY


async def test_a_compressed_body_that_is_not_is_a_broken_answer(client: HttpClient) -> None:
    bad = Answer([whole(200, b"not gzip at all", {"Content-Encoding": "gzip"})])
    async with scripted_server(bad) as server:
        with pytest.raises(StreamBroken):
            await _get(client, server)


async def test_a_body_cut_short_is_a_broken_answer(client: HttpClient) -> None:
    cut = Answer([head(200, {"Content-Length": str(len(BODY))}), BODY[:100]], "close")
    async with scripted_server(cut) as server:
        with pytest.raises(StreamBroken, match="cut short"):
            await _get(client, server)


async def test_a_chunked_stream_cut_short_is_a_broken_stream(client: HttpClient) -> None:
    start = head(200, {"Transfer-Encoding": "chunked"})
    async with scripted_server(Answer([start, chunk(b"data: one\n\n")], "close")) as server:
        resp = await client.send("POST", server.url + "/s", {}, b"{}")
        got: list[bytes] = []
        with pytest.raises(StreamBroken, match="broke"):
            async for piece in iter_body(resp):
                got.append(piece)
        assert got == [b"data: one\n\n"]


async def test_no_status_within_the_read_timeout_is_an_upstream_timeout(
    client: HttpClient,
) -> None:
    async with scripted_server(Answer([], "hold")) as server:
        with pytest.raises(UpstreamTimeout):
            await client.send("POST", server.url + "/x", {}, b"{}")
        # the client hung up, which is what stops an upstream's work
        await asyncio.wait_for(server.client_left.wait(), 5)


async def test_silence_inside_a_body_is_a_broken_answer(client: HttpClient) -> None:
    stalled = Answer([head(200, {"Content-Length": str(len(BODY))}), BODY[:10]], "hold")
    async with scripted_server(stalled) as server:
        with pytest.raises(StreamBroken, match="timeout"):
            await _get(client, server)
        await asyncio.wait_for(server.client_left.wait(), 5)


async def test_silence_inside_a_stream_is_a_broken_stream(client: HttpClient) -> None:
    start = head(200, {"Transfer-Encoding": "chunked"})
    async with scripted_server(Answer([start, chunk(b"data: 1\n\n")], "hold")) as server:
        resp = await client.send("POST", server.url + "/s", {}, b"{}")
        with pytest.raises(StreamBroken, match="read timeout"):
            async for _ in iter_body(resp):
                pass
        resp.close()
        await asyncio.wait_for(server.client_left.wait(), 5)


async def test_a_slow_reader_pauses_the_upstream_and_loses_nothing(client: HttpClient) -> None:
    """Back-pressure: a body larger than every socket buffer on the way, not read for a
    while, stops being read from the socket past the high-water mark; nothing is lost."""
    size = 64 << 20
    body = bytes(range(256)) * (size // 256)
    sent_all = asyncio.Event()

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(head(200, {"Content-Length": str(size)}))
        writer.write(body)
        await writer.drain()
        sent_all.set()
        writer.close()

    server = await asyncio.start_server(flood, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        resp = await client.send("POST", f"http://127.0.0.1:{port}/big", {}, b"{}")
        proto = resp._proto
        assert proto.transport is not None
        for _ in range(1000):  # until the client stops reading (bounded)
            if not proto.transport.is_reading():
                break
            await asyncio.sleep(0.005)
        assert not proto.transport.is_reading()
        # what the client holds stays near the mark: the rest waits in the socket buffers
        # and the server's own, which cannot hold 64 MiB, so the server has not finished
        assert proto.buffered <= http_module._HIGH_WATER + (1 << 20)
        assert not sent_all.is_set()
        digest = hashlib.sha256()
        total = 0
        async for piece in iter_body(resp):
            digest.update(piece)
            total += len(piece)
        assert total == size and digest.digest() == hashlib.sha256(body).digest()
        await asyncio.wait_for(sent_all.wait(), 10)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_pooled_connection_closed_before_answering_is_replaced_when_safe(
    client: HttpClient,
) -> None:
    # the second request meets the connection the server dropped without answering
    async with scripted_server(
        Answer([whole(200, b"one")]), Answer([], "close"), Answer([whole(200, b"two")])
    ) as server:
        assert await _get(client, server) == b"one"
        assert await _get(client, server, resend_safe=True) == b"two"
    assert [s.connection for s in server.seen] == [1, 1, 2]
    # the same request both times
    assert server.seen[1].head == server.seen[2].head


async def test_a_pooled_connection_closed_before_answering_is_an_error_when_not_safe(
    client: HttpClient,
) -> None:
    async with scripted_server(Answer([whole(200, b"one")]), Answer([], "close")) as server:
        assert await _get(client, server) == b"one"
        with pytest.raises(UpstreamUnavailable) as info:
            await _get(client, server)
    assert info.value.retryable and len(server.seen) == 2


async def test_an_idle_connection_past_the_pool_timeout_is_not_reused(client: HttpClient) -> None:
    async with scripted_server(Answer([whole(200, b"1")]), Answer([whole(200, b"2")])) as server:
        assert await _get(client, server) == b"1"
        [pooled] = [proto for idle in client._idle.values() for proto in idle]
        # idle as long as a server's keep-alive limit (the clock is the event loop's own)
        pooled.idle_since -= http_module.POOL_IDLE_TIMEOUT_S
        assert await _get(client, server) == b"2"
    assert [s.connection for s in server.seen] == [1, 2]


async def test_a_refused_connection_is_unavailable_and_resendable(client: HttpClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UpstreamUnavailable, match="cannot connect") as info:
        await client.send("POST", f"http://127.0.0.1:{port}/x", {}, b"{}")
    assert info.value.retryable


async def test_a_response_released_half_read_closes_its_connection(client: HttpClient) -> None:
    start = head(200, {"Transfer-Encoding": "chunked"})
    first = Answer([start, chunk(b"data: 1\n\n")], "hold")
    async with scripted_server(first, Answer([whole(200, b"fresh")])) as server:
        resp = await client.send("POST", server.url + "/s", {}, b"{}")
        body = iter_body(resp)
        assert await anext(body) == b"data: 1\n\n"
        resp.release()  # not read whole: not reusable
        await asyncio.wait_for(server.client_left.wait(), 5)
        assert await _get(client, server) == b"fresh"
    assert [s.connection for s in server.seen] == [1, 2]


# -- hostile answers: bombs, heads past their limit, interim responses, cancelled reads


def bomb(inflated_mib: int) -> bytes:
    """Zeros, gzipped: about 1 KiB per MiB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join([*(packer.compress(zeros) for _ in range(inflated_mib)), packer.flush()])


async def test_a_compressed_stream_inflates_piece_by_piece_the_loop_running_between(
    client: HttpClient,
) -> None:
    packed = bomb(32)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    try:
        async with scripted_server(Answer([whole(200, packed, {"Content-Encoding": "gzip"})])) as s:
            resp = await client.send("POST", s.url + "/s", {}, b"{}")
            sizes = [len(piece) async for piece in iter_body(resp)]
    finally:
        ticker.cancel()
    assert sum(sizes) == 32 << 20
    assert max(sizes) <= http_module.INFLATE_PIECE
    # other work ran between the pieces: the event loop was never held for the whole body
    assert ticks >= len(sizes) - 1


async def test_a_bomb_read_whole_stops_at_the_inflated_limit_holding_no_more() -> None:
    http = HttpClient(Timeouts(5.0, READ_S), limits=Limits(inflated_bytes=1 << 20))
    packed = bomb(256)
    try:
        async with scripted_server(Answer([whole(200, packed, {"Content-Encoding": "gzip"})])) as s:
            resp = await http.send("POST", s.url + "/s", {}, b"{}")
            tracemalloc.start()
            try:
                with pytest.raises(ResponseTooLarge, match=r"max_inflated_mib \(1 MiB\)"):
                    await read_body(resp)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    finally:
        await http.close()
    assert peak < 4 << 20  # the limit and a piece or two, never the 256 MiB


async def test_a_body_past_its_limit_closes_the_connection() -> None:
    limits = Limits(body_bytes=64 << 10)
    http = HttpClient(Timeouts(5.0, READ_S), limits=limits)
    endless = Answer([head(200, {"Transfer-Encoding": "chunked"}), chunk(bytes(128 << 10))], "hold")
    try:
        async with scripted_server(endless) as server:
            resp = await http.send("POST", server.url + "/s", {}, b"{}")
            with pytest.raises(ResponseTooLarge, match=r"max_body_mib \(0.0625 MiB\)"):
                await read_body(resp)
            await asyncio.wait_for(server.client_left.wait(), 5)
    finally:
        await http.close()


@pytest.mark.parametrize("at_once", [True, False], ids=["at-once", "in-pieces"])
async def test_a_head_past_its_limit_is_refused(at_once: bool) -> None:
    http = HttpClient(Timeouts(5.0, READ_S), limits=Limits(head_bytes=1 << 10))
    padding = [f"X-Pad-{i}: {'p' * 200}\r\n".encode() for i in range(8)]
    if at_once:
        answer = Answer([b"HTTP/1.1 200 OK\r\n" + b"".join(padding) + b"Content-Length: 0\r\n\r\n"])
    else:  # one header line that never ends, read piece by piece until past the limit
        answer = Answer([b"HTTP/1.1 200 OK\r\nX-Pad: ", *(b"p" * 400 for _ in range(4))], "hold")
    try:
        async with scripted_server(answer) as server:
            with pytest.raises(ResponseTooLarge, match=r"max_header_kib \(1 KiB\)"):
                await http.send("POST", server.url + "/s", {}, b"{}")
            if not at_once:
                await asyncio.wait_for(server.client_left.wait(), 5)
    finally:
        await http.close()


async def test_interim_responses_come_before_the_answer(client: HttpClient) -> None:
    interim = head(100) + head(103, {"Link": "</a.css>; rel=preload"})
    async with scripted_server(Answer([interim, whole(200, b"the answer")])) as server:
        resp = await client.send("POST", server.url + "/x", {}, b"{}")
        assert resp.status == 200 and "link" not in resp.headers
        assert await read_body(resp) == b"the answer"


async def test_a_status_that_is_no_interim_response_is_the_answer(client: HttpClient) -> None:
    async with scripted_server(Answer([head(102, {"Content-Length": "0"})])) as server:
        resp = await client.send("POST", server.url + "/x", {}, b"{}")
        assert resp.status == 102  # the caller's side decides what to make of it


async def test_a_read_cancelled_midway_closes_the_connection(client: HttpClient) -> None:
    slow = Answer([head(200, {"Content-Length": "100"}), b"{"], "hold")
    async with scripted_server(slow) as server:
        resp = await client.send("POST", server.url + "/x", {}, b"{}")
        reading = asyncio.create_task(read_body(resp))
        await asyncio.sleep(0.05)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        # the upstream sees the gateway leave, and stops working on the answer
        await asyncio.wait_for(server.client_left.wait(), 5)
