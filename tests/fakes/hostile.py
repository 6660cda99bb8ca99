"""A hostile or broken upstream on 127.0.0.1: raw bytes on a socket, in a thread of its own.

The other fakes are ASGI apps under uvicorn, which only writes well-formed HTTP. This one
writes whatever a test scripts: odd statuses and interim responses, heads trickled in or
too large, compressed bombs, lines that never end, and answers that echo back the API
key the request carried. Each request takes the next queued ``Play`` (or a function of
the request that returns one); its steps are bytes written in turn (each flushed) and
pauses in seconds, then the connection is kept, closed, or held silent until the client
leaves (``client_left`` is then set).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from tests.fakes.threaded_server import ThreadedStreamServer

# a held connection waits for its client at most this long, so a failing test cannot hang
HOLD_LIMIT_S = 15.0


@dataclass
class Request:
    """One request as the upstream read it."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes

    @property
    def key(self) -> str:
        """The API key the request carried, however its provider sends it."""
        auth = self.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:]
        return self.headers.get("x-api-key") or self.headers.get("x-goog-api-key") or ""

    def json(self) -> Any:
        return orjson.loads(self.body)


Step = bytes | float


@dataclass
class Play:
    """What the upstream writes back: bytes, and pauses in seconds between them."""

    steps: list[Step]
    then: Literal["keep", "close", "hold"] = "close"


Script = Play | Callable[[Request], Play]


@dataclass
class HostileUpstream(ThreadedStreamServer):
    plays: deque[Script] = field(default_factory=deque)
    requests: list[Request] = field(default_factory=list)
    client_left: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def queue(self, *plays: Script) -> None:
        self.plays.extend(plays)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while await self._serve_one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            self.client_left.set()
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        line, *rest = head.split("\r\n")
        method, target, _ = line.split(" ", 2)
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (h.partition(":") for h in rest if h)
        }
        length = int(headers.get("content-length", "0"))
        request = Request(method, target, headers, await reader.readexactly(length))
        self.requests.append(request)
        if not self.plays:
            return False  # nothing scripted: hang up, which the test will notice
        script = self.plays.popleft()
        play = script(request) if callable(script) else script
        for step in _announced(play):
            if isinstance(step, float):
                if await _left_within(reader, step):
                    self.client_left.set()
                    return False
                continue
            writer.write(step)
            await writer.drain()
        if play.then == "hold":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(), HOLD_LIMIT_S)
            self.client_left.set()
            return False
        return play.then == "keep"


def _announced(play: Play) -> list[Step]:
    """The play's steps, its head saying ``Connection: close`` when the connection ends
    with the play, as a server that closes after an answer says so (a client would
    otherwise send its next request on a connection about to close)."""
    steps = list(play.steps)
    if play.then != "close":
        return steps
    for n, step in enumerate(steps):
        # the final head: interim 1xx heads come before it
        if isinstance(step, bytes) and step.startswith(b"HTTP/1.") and step[9:10] != b"1":
            head, blank, rest = step.partition(b"\r\n\r\n")
            if blank and b"\r\nconnection:" not in head.lower():
                steps[n] = head + b"\r\nConnection: close" + blank + rest
            break
    return steps


async def _left_within(reader: asyncio.StreamReader, pause_s: float) -> bool:
    """Pause; True as soon as the client closes its end (the gateway never pipelines, so
    nothing else arrives meanwhile)."""
    try:
        return await asyncio.wait_for(reader.read(1), pause_s) == b""
    except TimeoutError:
        return False


# -- building answers


def head(status: int, headers: dict[str, str] | None = None, reason: str = "X") -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def whole(status: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A response with a Content-Length."""
    return head(status, {**(headers or {}), "Content-Length": str(len(body))}) + body


def json_play(status: int, obj: Any, headers: dict[str, str] | None = None) -> Play:
    headers = {"Content-Type": "application/json", **(headers or {})}
    return Play([whole(status, orjson.dumps(obj), headers)])


def stream_head(headers: dict[str, str] | None = None) -> bytes:
    """The head of a stream whose body ends with the connection."""
    return head(200, {"Content-Type": "text/event-stream", **(headers or {})})


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None, model: str = "gpt-5.1") -> bytes:
    """One OpenAI chat-completion chunk as an SSE event."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    obj = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [choice],
    }
    return sse(obj)


def completion(text: str, model: str = "gpt-5.1", finish: str = "stop") -> dict[str, Any]:
    """A whole OpenAI chat completion."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": text}}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def openai_stream(pieces: Iterable[str], model: str = "gpt-5.1", finish: str = "stop") -> Play:
    """A whole OpenAI stream, ended with the connection."""
    events = [chunk({"role": "assistant", "content": ""}, model=model)]
    events += [chunk({"content": p}, model=model) for p in pieces]
    events += [chunk({}, finish, model=model), b"data: [DONE]\n\n"]
    return Play([stream_head(), *events])


def gzip_bomb(inflated_mib: int, prefix: bytes = b"") -> bytes:
    """``prefix`` then zeros, ``inflated_mib`` MiB in all, gzipped (about 1 KiB per MiB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    parts = [packer.compress(prefix)]
    parts += [packer.compress(zeros) for _ in range(inflated_mib)]
    parts.append(packer.flush())
    return b"".join(parts)


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data)
