"""Pieces shared by the fake upstreams.

Owns: the deterministic tokenizer, SSE framing (encode and a small test-side decoder),
the `Reply` script a test queues (answer + fault knobs), request recording, minimal raw-ASGI
I/O helpers, and the "generation" step that turns a `Reply` into tokens under a budget.

Must not know any provider's JSON shapes: those live in the provider fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import string
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
JSON = dict[str, Any]

# --------------------------------------------------------------------------- tokens

_TOKEN_RE = re.compile(r"\w+|[^\w\s]|\s")
_ALNUM = string.ascii_letters + string.digits


def tokenize(text: str) -> list[str]:
    """Split text into tokens: runs of word characters, single punctuation, single spaces.

    Concatenating the tokens gives the text back, and tokenize(a + b) == tokenize(a) +
    tokenize(b) whenever a ends or b starts with a non-word character, which is what makes
    the prompt-cache arithmetic of the fakes exact.
    """
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    """Number of tokens of `text` under `tokenize`."""
    return len(tokenize(text))


def common_prefix_len(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def fragments(text: str, tokens_per_fragment: int = 1) -> list[str]:
    """Split `text` into stream fragments of `tokens_per_fragment` tokens each."""
    toks = tokenize(text)
    step = max(1, tokens_per_fragment)
    return ["".join(toks[i : i + step]) for i in range(0, len(toks), step)]


def random_alnum(n: int) -> str:
    """Random string of ASCII letters and digits (ids of completions and tool calls)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


# --------------------------------------------------------------------------- SSE

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(obj: Any) -> bytes:
    """One SSE data event: `data: <json>\\n\\n`."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def parse_sse(raw: bytes) -> list[Any]:
    """Decode a whole SSE body into its data payloads (tests only).

    JSON payloads are parsed; `[DONE]` is returned as the string "[DONE]". Comment lines
    (keep-alive pings) are skipped.
    """
    out: list[Any] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = [ln[5:].lstrip(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
        if not data:
            continue
        payload = b"\n".join(data)
        out.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return out


# --------------------------------------------------------------------------- replies


@dataclass
class Reply:
    """One scripted answer to one request: the answer, and how the upstream fails to give it.

    Every fake takes this script and renders it in its own provider's wire shape, so one
    fault reads the same in a test whatever the upstream kind. A "chunk" is one event of the
    provider's stream: an OpenAI-shaped `data:` chunk, one of Anthropic's named events, one
    Gemini response chunk.

    The answer: `content`, `reasoning_content` (llama.cpp's reasoning, OpenAI-style
    reasoning tokens, an Anthropic thinking block, a Gemini thought part), `tool_calls` (each
    `{"name", "arguments"}` with `arguments` a JSON string or an object; an optional `"id"`
    pins the id), `finish_reason` (the provider's own word; by default derived: tool calls,
    a stop, or a length cut by a token budget).

    How it fails:
    - `status` (+ `error_body`, the whole body; the provider's default body if None): answer
      this HTTP error instead;
    - `headers`: extra response headers (e.g. `retry-after`), on errors and successes;
    - `delay_ms`: wait before answering (time to first byte); `chunk_delay_ms`: wait
      between stream chunks;
    - `break_after_chunks`: stream N chunks, then drop the connection (no finish, no
      terminator, no terminating HTTP chunk);
    - `error_event_after_chunks`: stream N chunks, then one error event in the provider's
      stream shape, then end the response without its terminator. The event carries
      `error_event` when given (the provider-shaped error object; for the OpenAI-shaped
      fakes a dict with a top-level `error` key is sent as is), else the provider's error for
      `error_event_status`, else the fake's default mid-stream error;
    - `cut_body`: a whole (non-streamed) answer sends half its body, then drops the connection;
    - `silent_after_chunks`: stream N chunks (a whole answer: its status and headers), then
      send nothing until the client leaves;
    - `silent_before_headers`: send nothing at all, not even the status, until the client
      leaves.

    A silence lasts at most `SILENCE_LIMIT_S`, then the connection is dropped.
    """

    content: str = "ok"
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    status: int | None = None
    error_body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_ms: int = 0
    chunk_delay_ms: int = 0
    break_after_chunks: int | None = None
    error_event_after_chunks: int | None = None
    error_event: dict[str, Any] | None = None
    error_event_status: int | None = None
    cut_body: bool = False
    silent_after_chunks: int | None = None
    silent_before_headers: bool = False


# a scripted silence ends here at the latest, so a test that waits for the wrong thing fails
# instead of hanging, and a fake server can always shut down
SILENCE_LIMIT_S = 10.0


def content_text(content: Any) -> str:
    """Text of a message `content`: a string, null, or an array of `text` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def default_reply(messages: Any) -> Reply:
    """The answer used when no reply is queued: `ok: ` + the last user message's first 5 words."""
    last_user = ""
    if isinstance(messages, list):
        for msg in messages:
            if isinstance(msg, dict) and msg.get("role") == "user":
                last_user = content_text(msg.get("content"))
    return Reply(content="ok: " + " ".join(last_user.split()[:5]))


@dataclass
class ToolCall:
    """A tool call the fake model makes, with its final id."""

    id: str
    name: str
    arguments: str


def reply_tool_calls(reply: Reply) -> list[ToolCall]:
    """The reply's tool calls with ids assigned (`call_<random>` unless pinned)."""
    calls: list[ToolCall] = []
    for spec in reply.tool_calls or []:
        args = spec.get("arguments", "")
        if not isinstance(args, str):  # convenience for tests: a dict is serialised here
            args = orjson.dumps(args).decode()
        call_id = str(spec.get("id") or "call_" + random_alnum(24))
        calls.append(ToolCall(id=call_id, name=str(spec["name"]), arguments=args))
    return calls


# --------------------------------------------------------------------------- generation


@dataclass
class Segment:
    """One piece of generated text. `kind`: markup | reasoning | content | tool."""

    kind: str
    text: str
    tool_index: int = -1


@dataclass
class Generated:
    """The outcome of running a reply through a token budget."""

    reasoning: str
    content: str
    tool_calls: list[ToolCall]
    tokens: list[str]
    reasoning_tokens: int
    finish_reason: str


def generate(
    segments: Iterable[Segment],
    tool_calls: Sequence[ToolCall],
    reply: Reply,
    limit: int | None,
) -> Generated:
    """Emit the segments' tokens in order, stopping at `limit` tokens (None: no limit).

    A tool call cut by the limit is dropped (its tokens were still generated).
    """
    tokens: list[str] = []
    parts: dict[str, list[str]] = {"reasoning": [], "content": []}
    kept: list[ToolCall] = []
    truncated = False
    reasoning_n = 0
    for seg in segments:
        toks = tokenize(seg.text)
        if limit is not None and len(tokens) + len(toks) > limit:
            toks = toks[: max(limit - len(tokens), 0)]
            truncated = True
        tokens.extend(toks)
        if seg.kind in parts:
            parts[seg.kind].append("".join(toks))
        if seg.kind == "reasoning":
            reasoning_n += len(toks)
        elif seg.kind == "tool" and not truncated:
            kept.append(tool_calls[seg.tool_index])
        if truncated:
            break
    derived = reply.finish_reason or ("tool_calls" if kept else "stop")
    finish = "length" if truncated else derived
    return Generated(
        reasoning="".join(parts["reasoning"]),
        content="".join(parts["content"]),
        tool_calls=kept,
        tokens=tokens,
        reasoning_tokens=reasoning_n,
        finish_reason=finish,
    )


# --------------------------------------------------------------------------- recording


@dataclass
class RecordedRequest:
    """One request as the fake received it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    raw_body: bytes
    # when the whole request had arrived (time.monotonic), to measure waits between requests
    received: float = field(default_factory=time.monotonic)

    def header(self, name: str, default: str | None = None) -> str | None:
        """Header value by case-insensitive name."""
        return self.headers.get(name.lower(), default)


class Recorder(list[RecordedRequest]):
    """Every request a fake received, in arrival order (a list with a few helpers)."""

    @property
    def last(self) -> RecordedRequest:
        """The most recent request."""
        return self[-1]

    def bodies(self, path: str | None = None) -> list[Any]:
        """Parsed JSON bodies, optionally only those sent to `path`."""
        return [r.body for r in self if path is None or r.path == path]


# --------------------------------------------------------------------------- ASGI I/O


@dataclass
class HttpRequest:
    """An HTTP request read off an ASGI connection."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    raw_body: bytes

    def json(self) -> Any:
        """The body parsed as JSON; raises `orjson.JSONDecodeError` when it is not JSON."""
        return orjson.loads(self.raw_body)

    def try_json(self) -> Any:
        """The body parsed as JSON, or None."""
        try:
            return self.json()
        except orjson.JSONDecodeError:
            return None

    def record(self) -> RecordedRequest:
        """A `RecordedRequest` copy for a `Recorder`."""
        return RecordedRequest(
            self.method, self.path, self.query, dict(self.headers), self.try_json(), self.raw_body
        )


async def read_request(scope: Scope, receive: Receive) -> HttpRequest:
    """Read headers and the whole body of an HTTP request."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        body.extend(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return HttpRequest(
        method=scope["method"],
        path=scope["path"],
        query=scope.get("query_string", b"").decode("latin-1"),
        headers=headers,
        raw_body=bytes(body),
    )


def encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """ASGI header list from a mapping."""
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def send_json(send: Send, status: int, obj: Any, headers: Mapping[str, str]) -> None:
    """Send a complete JSON response (Content-Length set)."""
    body = orjson.dumps(obj)
    all_headers = {**headers, "content-length": str(len(body))}
    await send(
        {"type": "http.response.start", "status": status, "headers": encode_headers(all_headers)}
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class ClientGone(Exception):
    """The client closed the connection; generation stops, as llama-server's does."""


class CallerLink:
    """The caller's side of one exchange: a ``send`` that raises ``ClientGone`` once the
    caller has disconnected, and ``gone`` to wait for that (a scripted silence ends there).

    Start it after the request body was read; ``close()`` it when the response is done.
    """

    def __init__(self, receive: Receive, send: Send) -> None:
        self.gone = asyncio.Event()
        self._send = send
        self.watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone.set()

    async def send(self, message: Message) -> None:
        if self.gone.is_set():
            raise ClientGone
        await self._send(message)

    async def silence(self) -> None:
        """Say nothing until the caller leaves (at most ``SILENCE_LIMIT_S``)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.gone.wait(), SILENCE_LIMIT_S)

    def close(self) -> None:
        self.watcher.cancel()


class StreamWriter:
    """Writes a response body piece by piece (`more_body: True`), so clients see each as sent."""

    def __init__(self, send: Send) -> None:
        self._send = send

    async def start(self, headers: Mapping[str, str], status: int = 200) -> None:
        """Send the status line and headers."""
        await self._send(
            {"type": "http.response.start", "status": status, "headers": encode_headers(headers)}
        )

    async def write(self, data: bytes) -> None:
        """Send raw body bytes and flush."""
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def event(self, obj: Any) -> None:
        """Send one `data: <json>` event."""
        await self.write(sse_event(obj))

    async def end(self) -> None:
        """Finish the HTTP response cleanly (terminating chunk)."""
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})


async def sleep_ms(ms: float) -> None:
    """Sleep for `ms` milliseconds (no-op for 0)."""
    if ms > 0:
        await asyncio.sleep(ms / 1000)


def error_event_payload(reply: Reply, default: JSON) -> JSON:
    """The JSON of an OpenAI-shaped in-stream error event for `reply`: `{"error": ...}`."""
    if reply.error_event is None:
        return {"error": default}
    if "error" in reply.error_event:
        return reply.error_event
    return {"error": reply.error_event}


def _first_stream_fault(reply: Reply, n_chunks: int) -> tuple[int, str]:
    """Where the stream stops being the answer (a chunk count) and how."""
    faults = [
        (at, kind)
        for at, kind in (
            (reply.error_event_after_chunks, "error"),
            (reply.break_after_chunks, "break"),
            (reply.silent_after_chunks, "silence"),
        )
        if at is not None
    ]
    return min(faults) if faults else (n_chunks, "done")


async def play_stream(
    link: CallerLink,
    headers: Mapping[str, str],
    chunks: Sequence[bytes],
    reply: Reply,
    *,
    error_event: bytes,
    terminator: bytes = b"",
) -> None:
    """Send a streamed answer: the status and headers, the encoded `chunks`, then the
    provider's `terminator` (OpenAI's `[DONE]`; nothing for Anthropic or Gemini), applying the
    reply's stream faults.

    A break returns without finishing the response: uvicorn then closes the socket mid-body,
    which is what a crashed upstream looks like to a client.
    """
    writer = StreamWriter(link.send)
    await writer.start(headers)
    cut, kind = _first_stream_fault(reply, len(chunks))
    for i, chunk in enumerate(chunks[: max(cut, 0)]):
        if i:
            await sleep_ms(reply.chunk_delay_ms)
        await writer.write(chunk)
        await asyncio.sleep(0)  # lets the disconnect watcher see a caller that left
    if kind == "break":
        return
    if kind == "silence":
        await link.silence()
        return
    await writer.write(error_event if kind == "error" else terminator)
    await writer.end()


async def play_whole(
    link: CallerLink, status: int, obj: Any, headers: Mapping[str, str], reply: Reply
) -> None:
    """Send a whole JSON answer, applying the reply's faults for one: a body cut short, or a
    silence after the headers."""
    body = orjson.dumps(obj)
    all_headers = {**headers, "content-length": str(len(body))}
    if not (reply.cut_body or reply.silent_after_chunks is not None):
        await send_json(link.send, status, obj, headers)
        return
    writer = StreamWriter(link.send)
    await writer.start(all_headers, status)
    if reply.cut_body:
        # the caller then returns, and uvicorn drops the connection mid-body
        await writer.write(body[: len(body) // 2])
    else:
        await link.silence()


async def wait_to_answer(link: CallerLink, reply: Reply) -> bool:
    """The reply's wait before its first byte; False when it says nothing at all (a silence
    before the headers), and the fake must then not answer."""
    if reply.silent_before_headers:
        await link.silence()
        return False
    await sleep_ms(reply.delay_ms)
    return True
