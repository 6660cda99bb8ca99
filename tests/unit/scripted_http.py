"""A tiny HTTP/1.1 server on 127.0.0.1 whose answers are raw bytes a test scripts, in the
test's own event loop, for the unit tests of the HTTP client and what sends through it; and
the gateway's parts that meet it (an OpenAI adapter, a meter writer that keeps records).

Each request takes the next ``Answer``: its pieces are written in turn (each flushed), then
the connection is kept for the next request, closed, or held silent until the client
leaves. Requests are recorded with the number of the connection they came on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import zlib
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import pytest
import yaml

from boundedcode_gateway.config import parse_config
from boundedcode_gateway.metering.bus import RecordBus
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.providers.openai_compat.adapter import OpenAICompatUpstream
from boundedcode_gateway.upstream.http import HttpClient

# how long a held connection waits for its client at most, so a failing test cannot hang
HOLD_LIMIT_S = 10.0


@dataclass
class Answer:
    """One scripted answer: the bytes written, piece by piece, and what the connection does
    after them (``keep``: serve the next request; ``close``; ``hold``: say nothing more until
    the client closes)."""

    pieces: list[bytes]
    then: Literal["keep", "close", "hold"] = "keep"


@dataclass
class Seen:
    """One request as the server read it."""

    connection: int
    head: bytes
    body: bytes

    @property
    def request_line(self) -> str:
        return self.head.split(b"\r\n", 1)[0].decode("latin-1")

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.decode("latin-1").partition(":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None


@dataclass
class ScriptedServer:
    """Serves the queued answers in order; ``url`` once started."""

    answers: deque[Answer] = field(default_factory=deque)
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    # set once a held connection saw its client leave
    client_left: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.Server | None = None
    _connections: int = 0
    _handlers: set[asyncio.Task[Any]] = field(default_factory=set)
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    def queue(self, *answers: Answer) -> None:
        self.answers.extend(answers)

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            # closing each connection ends its handler (not cancelling it, which Python
            # 3.11's stream server reports as an error)
            for writer in self._writers:
                writer.close()
            if self._handlers:
                await asyncio.wait(self._handlers, timeout=HOLD_LIMIT_S)
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        number = self._connections
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.append(writer)
        try:
            while await self._serve_one(number, reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _serve_one(
        self, number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        seen = Seen(number, head, b"")
        length = seen.header("content-length")
        seen.body = await reader.readexactly(int(length)) if length else b""
        self.seen.append(seen)
        if not self.answers:  # nothing scripted: hang up, which the test will notice
            return False
        answer = self.answers.popleft()
        for piece in answer.pieces:
            writer.write(piece)
            await writer.drain()
        if answer.then == "hold":
            # a client that leaves with data unread resets the connection
            with contextlib.suppress(TimeoutError, ConnectionError):
                await asyncio.wait_for(reader.read(), HOLD_LIMIT_S)
            self.client_left.set()
            return False
        return answer.then == "keep"


@contextlib.asynccontextmanager
async def scripted_server(*answers: Answer) -> AsyncIterator[ScriptedServer]:
    server = ScriptedServer()
    server.queue(*answers)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


# -- building answers


def head(status: int, headers: dict[str, str] | None = None) -> bytes:
    """A status line and headers."""
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def whole(status: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A response with a Content-Length."""
    return head(status, {**(headers or {}), "Content-Length": str(len(body))}) + body


def json_answer(status: int, obj: Any, headers: dict[str, str] | None = None) -> Answer:
    headers = {"Content-Type": "application/json", **(headers or {})}
    return Answer([whole(status, orjson.dumps(obj), headers)])


def chunk(data: bytes) -> bytes:
    """One piece of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def chunked(status: int, pieces: Iterable[bytes], headers: dict[str, str] | None = None) -> Answer:
    """A whole chunked response, one write per piece."""
    start = head(status, {**(headers or {}), "Transfer-Encoding": "chunked"})
    return Answer([start, *(chunk(p) for p in pieces), LAST_CHUNK])


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data)


def deflated(data: bytes) -> bytes:
    return zlib.compress(data)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


# -- the gateway's parts around a scripted server


OPENAI_KEY_ENV = "SCRIPTED_OPENAI_KEY"


class RecordingWriter(RecordBus):
    """A record bus that keeps what is published, in memory (no files, no thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[CallRecord] = []

    def publish(self, record: CallRecord) -> None:
        super().publish(record)
        self.records.append(dataclasses.replace(record))


def openai_upstream(
    base_url: str, http: HttpClient, monkeypatch: pytest.MonkeyPatch, **profile: Any
) -> OpenAICompatUpstream:
    """The ``openai`` adapter for a profile ``gpt`` that sends to ``base_url``."""
    monkeypatch.setenv(OPENAI_KEY_ENV, "sk-scripted")
    gpt = {
        "provider": "openai",
        "model": "gpt-5.1",
        "api_key_env": OPENAI_KEY_ENV,
        "base_url": base_url + "/v1",
        **profile,
    }
    config = parse_config(yaml.safe_dump({"data_dir": "unused", "models": {"gpt": gpt}}))
    return OpenAICompatUpstream("gpt", config.models["gpt"], config, http)


def stream_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    """One OpenAI chat-completion chunk as an SSE event."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-5.1",
            "choices": [choice],
        }
    )


ROLE = stream_chunk({"role": "assistant", "content": ""})
FINISH = stream_chunk({}, "stop")
DONE = b"data: [DONE]\n\n"


def text_chunks(*pieces: str) -> list[bytes]:
    return [stream_chunk({"content": p}) for p in pieces]


def completion(text: str) -> dict[str, Any]:
    """A whole OpenAI chat completion."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-5.1",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": text},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
