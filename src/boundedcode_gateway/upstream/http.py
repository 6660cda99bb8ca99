"""The one shared HTTP client for every upstream, and the mapping of transport errors.

Owns connection pooling, timeouts and the way to each upstream origin (directly,
or through the HTTP proxy the environment names: see ``proxy.py``). It must not know
any provider's payloads: it moves bytes and turns transport failures into the
gateway's error tree.

A small HTTP/1.1 client of its own (an asyncio protocol with httptools parsing)
rather than aiohttp's: the gateway sends one kind of request (a POST or GET with a
body already serialised) and reads one kind of answer, and replacing aiohttp's
general request machinery cut the gateway's own CPU per request by about a third
(docs/performance.md, "Where it started").
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import zlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass
from typing import cast
from urllib.parse import SplitResult, urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from boundedcode_gateway.errors import (
    ProxyRefused,
    ResponseTooLarge,
    StreamBroken,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from boundedcode_gateway.upstream.proxy import Proxy, ProxySettings, connect_request

# llama-server closes idle kept-alive connections after 5 s (cpp-httplib's default);
# a pooled connection older than that would be reset under the next request.
POOL_IDLE_TIMEOUT_S = 4.0
# llama-server also closes a connection after a streamed answer or an error status,
# so a pooled connection may be dead however young; each failed try discards one.
STALE_CONNECTION_TRIES = 3
# a streamed body buffered beyond this (a slow caller) pauses reading the upstream
_HIGH_WATER = 1 << 20
# a proxy's answer to CONNECT larger than this is not an answer
_CONNECT_ANSWER_LIMIT = 16 << 10
_USER_AGENT = "boundedcode-gateway"
# a compressed body is inflated at most this much at a time, the event loop running
# between two pieces: a bomb never allocates past its limit nor holds the loop for long
INFLATE_PIECE = 256 << 10
# interim responses skipped on the way to the answer's own head (RFC 9110, 15.2)
_INTERIM = frozenset({100, 103})


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float
    read_s: float
    # from the first byte of a response head to its end (``read_s`` is the wait for
    # that first byte: llama-server sends its head with the first token, or with the
    # whole answer when it is not streamed)
    header_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Limits:
    """What an upstream's answer may hold (``inference.upstream_limits``), in bytes."""

    # an answer read whole, as received
    body_bytes: int = 64 << 20
    # the same once its Content-Encoding is undone
    inflated_bytes: int = 64 << 20
    # one event of a stream (enforced by the stream's reader, ``relay.py``)
    event_bytes: int = 8 << 20
    # one streamed answer, as inflated (``relay.py``)
    stream_bytes: int = 256 << 20
    # what is kept of one streamed answer while it streams (``upstream/metrics.py``)
    captured_bytes: int = 32 << 20
    # the status line and headers, interim responses included
    head_bytes: int = 64 << 10


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


class _Stale(Exception):
    """The connection closed before any byte of the response: the request was not answered."""


class _Cut(Exception):
    """The connection closed in the middle of the response."""


class _HeadTooLarge(Exception):
    """The response head passed its limit before it ended."""


class _Protocol(asyncio.Protocol):
    """One upstream connection; at most one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, head_limit: int) -> None:
        self._loop = loop
        self._head_limit = head_limit
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.closed = False
        self.error: Exception | None = None
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        # the response head: bytes received while it had not ended, and the size of its
        # header lines (interim responses included in both); when it began (None until
        # its first byte, and again after an interim response)
        self.head_bytes = 0
        self._header_bytes = 0
        self.head_started: float | None = None
        self._interim = False

    # -- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        heading = not self.headers_done
        if heading:
            self.head_bytes += len(data)
            if self.head_started is None:
                self.head_started = self._loop.time()
                self._wake()  # the wait for the head's end is now the shorter one
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(_Cut("the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(_Cut(f"the upstream's answer is not valid HTTP: {exc}"))
        if heading and self._head_too_large():
            self.headers_done = False  # a head past the limit is never handed over
            self._fail(
                _HeadTooLarge(
                    f"the upstream's response head is larger than "
                    f"inference.upstream_limits.max_header_kib ({self._head_limit >> 10} KiB)"
                )
            )

    def _head_too_large(self) -> bool:
        """The header lines (all received at once), or a head not ended after as many
        bytes, past the limit."""
        if self._header_bytes > self._head_limit:
            return True
        return not self.headers_done and self.head_bytes > self._head_limit

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.complete:
            return
        if self.headers_done and not self._has_length():
            # a body delimited by the end of the connection ends here
            self.on_message_complete()
            return
        self._fail(_Cut("the connection was closed") if self.got_bytes else _Stale(str(exc or "")))

    def pause_writing(self) -> None:  # request bodies are small; the kernel buffers them
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))
        self._header_bytes += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status in _INTERIM:
            # 100 Continue, 103 Early Hints: the answer's own head follows
            self._interim = True
            self.raw_headers = []
            return
        self.status = status
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            self.head_started = None  # the next head has its own deadline
            self._wake()
            return
        self.complete = True
        # asked here: once the message is done the parser no longer knows
        self.keep_alive = not self.closed and self._parser.should_keep_alive()
        self._wake()

    # -- the exchange

    def _has_length(self) -> bool:
        return any(
            n.lower() in (b"content-length", b"transfer-encoding") for n, _ in self.raw_headers
        )

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        if self.error is None:
            self.error = exc
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def start(self, request: bytes) -> None:
        if self.closed or self.transport is None:
            raise _Stale("the pooled connection was closed")
        self._reset()
        self.error = None
        self.transport.write(request)

    async def wait(self, timeout_s: float) -> None:
        """Until the parser made progress; TimeoutError after ``timeout_s`` of silence."""
        if self.error is not None:
            raise self.error
        waiter = self._loop.create_future()
        self._waiter = waiter
        timer = self._loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def take(self) -> bytes:
        """What the body has buffered so far."""
        chunks = self.chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _Decoder:
    """Content-Encoding gzip/deflate, for an upstream that compresses unasked."""

    def __init__(self, encoding: str) -> None:
        wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
        self._z = zlib.decompressobj(wbits)

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """What ``data`` inflates to, ``INFLATE_PIECE`` bytes at most at a time."""
        z = self._z
        while True:
            piece = z.decompress(data, INFLATE_PIECE)
            data = z.unconsumed_tail
            if piece:
                yield piece
            # a full piece may leave output pending even with all input taken
            if not data and len(piece) < INFLATE_PIECE:
                return

    def flush(self) -> bytes:
        return self._z.flush()


class UpstreamResponse:
    """An answer whose status and headers have arrived; the body is read as it comes."""

    def __init__(
        self,
        client: HttpClient,
        key: _PoolKey,
        proto: _Protocol,
        read_s: float,
        limits: Limits,
    ) -> None:
        self._client = client
        self._key = key
        self._proto = proto
        self._read_s = read_s
        self._limits = limits
        # body bytes as received (before any Content-Encoding is undone)
        self.received = 0
        self.status = proto.status
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(
            CIMultiDict((n.decode("latin-1"), v.decode("latin-1")) for n, v in proto.raw_headers)
        )
        encoding = self.headers.get("content-encoding", "").lower()
        self._decoder = _Decoder(encoding) if encoding in ("gzip", "deflate") else None
        self._done = False

    async def _next(self) -> bytes | None:
        """The next bytes of the body as received, or None at its end."""
        proto = self._proto
        while not proto.chunks:
            if proto.complete:
                return None
            await proto.wait(self._read_s)
        data = proto.take()
        self.received += len(data)
        return data

    async def iter_chunks(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives, inflated piece by piece when it is compressed."""
        decoder = self._decoder
        while (data := await self._next()) is not None:
            if decoder is None:
                if data:
                    yield data
                continue
            later = False
            for piece in decoder.pieces(data):
                if later:
                    await asyncio.sleep(0)  # the loop runs between two inflated pieces
                later = True
                yield piece
        if decoder is not None and (rest := decoder.flush()):
            yield rest

    async def read(self) -> bytes:
        """The whole body, within ``max_body_mib`` as received and ``max_inflated_mib`` as
        inflated; ``ResponseTooLarge`` (the connection closed) past either."""
        limits = self._limits
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.body_bytes:
            self.close()
            raise self._too_large()
        parts: list[bytes] = []
        size = 0
        async with contextlib.aclosing(self.iter_chunks()) as pieces:
            async for piece in pieces:
                size += len(piece)
                if self.received > limits.body_bytes:
                    self.close()
                    raise self._too_large()
                if self._decoder is not None and size > limits.inflated_bytes:
                    self.close()
                    raise ResponseTooLarge(
                        "the upstream's compressed answer inflates past "
                        f"inference.upstream_limits.max_inflated_mib "
                        f"({_mib(limits.inflated_bytes)})"
                    )
                parts.append(piece)
        self.release()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _too_large(self) -> ResponseTooLarge:
        return ResponseTooLarge(
            "the upstream's answer is larger than inference.upstream_limits.max_body_mib "
            f"({_mib(self._limits.body_bytes)})"
        )

    def release(self) -> None:
        """Give the connection back to the pool if the answer was read whole, else close it."""
        if self._done:
            return
        self._done = True
        if self._proto.reusable():
            self._client._put_back(self._key, self._proto)
        else:
            self._proto.close()

    def close(self) -> None:
        """Close the connection (an upstream stops generating when its caller goes)."""
        if not self._done:
            self._done = True
            self._proto.close()


_PoolKey = tuple[str, str, int]  # scheme, host, port


class HttpClient:
    """Pooled keep-alive connections to the upstreams; created inside the running event loop."""

    def __init__(
        self,
        timeouts: Timeouts,
        proxies: ProxySettings | None = None,
        limits: Limits | None = None,
    ) -> None:
        self._timeouts = timeouts
        self._proxies = proxies or ProxySettings()
        self.limits = limits or Limits()
        self._idle: dict[_PoolKey, list[_Protocol]] = {}
        # the way to each origin, decided on its first request: a proxy, or None (direct)
        self._routes: dict[_PoolKey, Proxy | None] = {}
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    def _take_idle(self, key: _PoolKey) -> _Protocol | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            proto = idle.pop()
            if not proto.closed and now - proto.idle_since < POOL_IDLE_TIMEOUT_S:
                return proto
            proto.close()
        return None

    def _put_back(self, key: _PoolKey, proto: _Protocol) -> None:
        if self._closed:
            proto.close()
            return
        proto.idle_since = time.monotonic()
        self._idle.setdefault(key, []).append(proto)

    def _route(self, key: _PoolKey) -> Proxy | None:
        try:
            return self._routes[key]
        except KeyError:
            route = self._routes[key] = self._proxies.proxy_for(*key)
            return route

    async def _connect(self, key: _PoolKey, proxy: Proxy | None) -> _Protocol:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        via = f" through the proxy {proxy.address} ({proxy.variable})" if proxy else ""
        head_limit = self.limits.head_bytes
        try:
            async with asyncio.timeout(self._timeouts.connect_s):
                if proxy is None:
                    _, proto = await loop.create_connection(
                        lambda: _Protocol(loop, head_limit), host, port, ssl=context
                    )
                elif context is None:  # plain HTTP: absolute-form requests to the proxy
                    _, proto = await loop.create_connection(
                        lambda: _Protocol(loop, head_limit), proxy.host, proxy.port
                    )
                else:
                    proto = await _tunnel(loop, proxy, host, port, context, head_limit)
        except TimeoutError as exc:
            raise UpstreamTimeout(f"the upstream did not answer in time{via}") from exc
        except OSError as exc:
            raise UpstreamUnavailable(
                f"cannot connect to the upstream{via}: {exc}", retryable=True
            ) from exc
        return proto

    async def send(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes | None = None,
        *,
        resend_safe: bool = False,
    ) -> UpstreamResponse:
        """Send a request and return the response once its headers arrived.

        A connection the server closed before answering is replaced and the request
        resent, when ``resend_safe`` (the upstream takes an idempotency key, or it is a GET).
        """
        parts = urlsplit(url)
        key = _pool_key(parts)
        proxy = self._route(key)
        # through a proxy a plain-HTTP request names its whole URL (absolute form)
        forward = proxy if proxy is not None and key[0] == "http" else None
        request = _request_bytes(method, parts, key, headers, body, forward)
        tries = STALE_CONNECTION_TRIES if resend_safe else 1
        for attempt in range(1, tries + 1):
            proto = self._take_idle(key) or await self._connect(key, proxy)
            try:
                proto.start(request)
                while not proto.headers_done:
                    await proto.wait(self._head_wait(proto))
            except _Stale as exc:
                proto.close()
                if attempt == tries:
                    raise UpstreamUnavailable(
                        f"the upstream closed the connection: {exc}", retryable=True
                    ) from exc
                continue
            except TimeoutError as exc:
                proto.close()
                if proto.head_started is not None:
                    raise UpstreamTimeout(
                        "the upstream began its response head but did not end it within "
                        "inference.upstream_limits.header_timeout_s "
                        f"({self._timeouts.header_s:g} s)"
                    ) from exc
                raise UpstreamTimeout("the upstream did not answer in time") from exc
            except _HeadTooLarge as exc:
                proto.close()
                raise ResponseTooLarge(str(exc)) from None
            except _Cut as exc:
                proto.close()
                raise UpstreamUnavailable(
                    f"the upstream could not be reached: {exc}", retryable=True
                ) from exc
            except BaseException:
                proto.close()  # cancelled mid-exchange: the connection is in an unknown state
                raise
            if forward is not None and proto.status == 407:
                proto.close()
                raise _refused(forward, key, "407 Proxy Authentication Required")
            return UpstreamResponse(self, key, proto, self._timeouts.read_s, self.limits)
        raise AssertionError("unreachable")

    def _head_wait(self, proto: _Protocol) -> float:
        """How long to wait for the head: for its first byte ``read_s`` (a slow first
        token), then until ``header_s`` after that byte (a head trickled in)."""
        if proto.head_started is None:
            return self._timeouts.read_s
        left = proto.head_started + self._timeouts.header_s - asyncio.get_running_loop().time()
        return max(left, 0.0)

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for proto in idle:
                proto.close()
        self._idle.clear()


class _ConnectAnswer(asyncio.Protocol):
    """Reads a proxy's answer to CONNECT; the same connection then carries the tunnel."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.head: asyncio.Future[bytes] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.head.done():
            return
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end >= 0 and self.transport is not None:
            self.transport.pause_reading()  # what follows is TLS, read by the TLS layer
            self.head.set_result(bytes(self._buffer[:end]))
        elif len(self._buffer) > _CONNECT_ANSWER_LIMIT:
            self.head.set_exception(ConnectionError("the proxy's answer to CONNECT is too long"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(
                ConnectionError("the proxy closed the connection before answering CONNECT")
            )


async def _tunnel(
    loop: asyncio.AbstractEventLoop,
    proxy: Proxy,
    host: str,
    port: int,
    context: ssl.SSLContext,
    head_limit: int,
) -> _Protocol:
    """A TLS connection to ``host:port`` inside a CONNECT tunnel through ``proxy``."""
    raw, answer = await loop.create_connection(lambda: _ConnectAnswer(loop), proxy.host, proxy.port)
    try:
        raw.write(connect_request(host, port, proxy))
        status_line = (await answer.head).split(b"\r\n", 1)[0].decode("latin-1")
        status, said = status_line.split(" ", 2)[1:2], status_line.partition(" ")[2]
        if status != ["200"]:
            if said.startswith("4"):  # 407, 403: the proxy will not carry this request
                raise _refused(proxy, ("https", host, port), said)
            # 502, 504: the proxy could not reach the upstream, as a refused connection
            raise ConnectionError(f"the proxy answered {said or status_line}")
        proto = _Protocol(loop, head_limit)
        # TLS inside the tunnel, verified for (and SNI naming) the upstream, not the proxy
        transport = await loop.start_tls(raw, proto, context, server_hostname=host)
        if transport is None:
            raise ConnectionError("the TLS handshake inside the proxy tunnel did not complete")
        proto.connection_made(transport)
        return proto
    except BaseException:
        raw.close()
        raise


def _refused(proxy: Proxy, key: _PoolKey, answer: str) -> ProxyRefused:
    _, host, port = key
    hint = f" (check the credentials in {proxy.variable})" if answer.startswith("407") else ""
    return ProxyRefused(
        f"the proxy {proxy.address} ({proxy.variable}) refused to reach {host}:{port}: "
        f"{answer}{hint}"
    )


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of ``url``, the scheme's port where it names none: where a
    request goes, as the connection pool keys it."""
    return _pool_key(urlsplit(url))


def _pool_key(parts: SplitResult) -> _PoolKey:
    scheme = parts.scheme or "http"
    return scheme, parts.hostname or "", parts.port or (443 if scheme == "https" else 80)


def _request_bytes(
    method: str,
    parts: SplitResult,
    key: _PoolKey,
    headers: dict[str, str],
    body: bytes | None,
    proxy: Proxy | None,
) -> bytes:
    scheme, host, port = key
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    default_port = (scheme == "https" and port == 443) or (scheme == "http" and port == 80)
    host_header = host if default_port else f"{host}:{port}"
    if ":" in host and not host.startswith("["):
        host_header = f"[{host}]" if default_port else f"[{host}]:{port}"
    if proxy is not None:
        target = f"{scheme}://{host_header}{target}"
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}"]
    given = {k.lower() for k in headers}
    if "user-agent" not in given:
        lines.append(f"User-Agent: {_USER_AGENT}")
    if "accept" not in given:
        lines.append("Accept: */*")
    lines.extend(f"{k}: {v}" for k, v in headers.items())
    if proxy is not None and proxy.authorization is not None:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head


async def read_body(resp: UpstreamResponse) -> bytes:
    """The whole body; a body cut short is a broken answer."""
    try:
        return await resp.read()
    except TimeoutError as exc:
        resp.close()
        raise StreamBroken("the upstream stopped sending its answer (timeout)") from exc
    except (_Cut, _Stale, zlib.error) as exc:
        resp.close()
        raise StreamBroken(f"the upstream's answer was cut short: {exc}") from exc
    except BaseException:
        # too large (closed already), or cancelled: the connection is in an unknown
        # state, and closing it stops the upstream's work
        resp.close()
        raise


async def iter_body(resp: UpstreamResponse) -> AsyncIterator[bytes]:
    """The body as it arrives; a connection lost mid-way is a broken stream."""
    try:
        async for chunk in resp.iter_chunks():
            yield chunk
    except TimeoutError as exc:
        raise StreamBroken("no data from the upstream within the read timeout") from exc
    except (_Cut, _Stale, zlib.error) as exc:
        raise StreamBroken(f"the upstream stream broke: {exc}") from exc
