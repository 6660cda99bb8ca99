"""The one shared HTTP client for every upstream, and the mapping of transport errors.

Owns connection pooling and timeouts. It must not know any provider's payloads:
it moves bytes and turns aiohttp's exceptions into the gateway's error tree.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from boundedcode_gateway.errors import StreamBroken, UpstreamTimeout, UpstreamUnavailable

# llama-server closes idle kept-alive connections after 5 s (cpp-httplib's default);
# a pooled connection older than that would be reset under the next request.
POOL_IDLE_TIMEOUT_S = 4.0
# llama-server also closes a connection after a streamed answer or an error status,
# so a pooled connection may be dead however young; each failed try discards one.
STALE_CONNECTION_TRIES = 3

# Failures that happen before any response byte: the request was not answered.
_STALE_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float
    read_s: float


class HttpClient:
    """A pooled aiohttp session; created inside the running event loop."""

    def __init__(self, timeouts: Timeouts) -> None:
        self._timeouts = timeouts
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=0, keepalive_timeout=POOL_IDLE_TIMEOUT_S, enable_cleanup_closed=False
        )
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self._timeouts.connect_s, sock_read=self._timeouts.read_s
        )
        return aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=True, trust_env=False
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = self._open()
        return self._session

    async def send(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes | None = None,
        *,
        resend_safe: bool = False,
    ) -> aiohttp.ClientResponse:
        """Send a request and return the response once its headers arrived.

        A connection the server closed before answering is replaced and the request
        resent, when ``resend_safe`` (the upstream takes an idempotency key, or it is a GET).
        """
        tries = STALE_CONNECTION_TRIES if resend_safe else 1
        for attempt in range(1, tries + 1):
            try:
                return await self.session.request(method, url, headers=headers, data=body)
            except aiohttp.ClientConnectorError as exc:
                raise UpstreamUnavailable(
                    f"cannot connect to the upstream: {exc.os_error}", retryable=True
                ) from exc
            except _STALE_ERRORS as exc:
                if attempt == tries:
                    raise UpstreamUnavailable(
                        f"the upstream closed the connection: {exc}", retryable=True
                    ) from exc
            except TimeoutError as exc:
                raise UpstreamTimeout("the upstream did not answer in time") from exc
            except aiohttp.ClientError as exc:
                raise UpstreamUnavailable(
                    f"the upstream could not be reached: {exc}", retryable=True
                ) from exc
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def read_body(resp: aiohttp.ClientResponse) -> bytes:
    """The whole body; a body cut short is a broken answer."""
    try:
        return await resp.read()
    except TimeoutError as exc:
        raise StreamBroken("the upstream stopped sending its answer (timeout)") from exc
    except aiohttp.ClientError as exc:
        raise StreamBroken(f"the upstream's answer was cut short: {exc}") from exc


async def iter_body(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body as it arrives; a connection lost mid-way is a broken stream."""
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
    except TimeoutError as exc:
        raise StreamBroken("no data from the upstream within the read timeout") from exc
    except (aiohttp.ClientError, asyncio.IncompleteReadError) as exc:
        raise StreamBroken(f"the upstream stream broke: {exc}") from exc
