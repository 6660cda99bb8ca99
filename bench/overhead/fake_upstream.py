"""The fake upstream: OpenAI- and Anthropic-shaped answers from cached bytes, as cheap as possible.

Raw asyncio protocol on uvloop with httptools parsing, so that its own cost per
request stays far below any target's (the direct lane shows its ceiling). Every
answer is built once at start. A streamed answer writes its head and first event
at once, then the other events in bursts of ``STREAM_BURST``, each burst its own
``write`` and segment. One write per event made the fake itself hold its core
for about 3 ms per stream on a VM where every send to the other core is an
interrupt, and the load generator on that core could not see a target's first
chunk until the fake was done: the target's time to first chunk became the fake's.

Run: ``python -m bench.overhead.fake_upstream --port N``; prints ``ready PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
from typing import cast

import httptools
import uvloop

from bench.overhead import payloads

STREAM_BURST = 10  # events per write after the first
_STREAM_FLAG = re.compile(rb'"stream"\s*:\s*true')


def _json_response(body: bytes, status: bytes = b"200 OK") -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def _chunked_stream(events: list[bytes]) -> list[bytes]:
    """Head and first event in one write, then bursts of events, the last with the end."""
    framed = [b"%x\r\n%b\r\n" % (len(e), e) for e in events]
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    rest = framed[1:]
    bursts = [b"".join(rest[i : i + STREAM_BURST]) for i in range(0, len(rest), STREAM_BURST)]
    bursts[-1] += b"0\r\n\r\n"
    return [head + framed[0], *bursts]


OPENAI_JSON = _json_response(payloads.openai_json())
OPENAI_STREAM = _chunked_stream(payloads.openai_sse_events())
ANTHROPIC_JSON = _json_response(payloads.anthropic_json())
ANTHROPIC_STREAM = _chunked_stream(payloads.anthropic_sse_events())
NOT_FOUND = _json_response(
    b'{"error":{"message":"not found","type":"not_found"}}', b"404 Not Found"
)
HEALTH = _json_response(b'{"status":"ok"}')
MODELS = _json_response(b'{"object":"list","data":[{"id":"m","object":"model","owned_by":"x"}]}')


class FakeUpstream(asyncio.Protocol):
    """One keep-alive connection; answers each request as soon as its body is complete."""

    __slots__ = ("_body", "_parser", "_transport", "_url")

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        path = self._url.split(b"?", 1)[0]
        stream = bool(_STREAM_FLAG.search(b"".join(self._body)))
        if path.endswith(b"/chat/completions"):
            self._answer(transport, OPENAI_STREAM if stream else OPENAI_JSON)
        elif path.endswith(b"/messages"):
            self._answer(transport, ANTHROPIC_STREAM if stream else ANTHROPIC_JSON)
        elif path in (b"/health", b"/v1/health"):
            transport.write(HEALTH)
        elif path.endswith(b"/models"):
            transport.write(MODELS)
        else:  # /props among them: "not llama.cpp, a plain OpenAI-compatible server"
            transport.write(NOT_FOUND)

    @staticmethod
    def _answer(transport: asyncio.Transport, answer: bytes | list[bytes]) -> None:
        if isinstance(answer, bytes):
            transport.write(answer)
            return
        for part in answer:
            transport.write(part)


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(FakeUpstream, "127.0.0.1", port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    print(f"ready {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
