"""Whether a server the gateway does not run is answering: one short request, its
verdict kept for a moment so that a readiness check polled often costs no more."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.upstream.http import HttpClient, read_body

PROBE_TIMEOUT_S = 2.0
# how long a verdict is reused
PROBE_TTL_S = 2.0
# llama.cpp's /health while it loads the model
LOADING = 503


class ServerProbe:
    """``GET url``: any answer but 503 means the server is up (a server without the path
    answers 404, which is as good); a refused connection or silence means it is not."""

    def __init__(
        self,
        url: str,
        http: HttpClient,
        headers: Callable[[], dict[str, str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._http = http
        self._headers = headers
        self._clock = clock
        parts = urlsplit(url)
        # the server by scheme, host and port only: a URL may carry credentials
        port = f":{parts.port}" if parts.port else ""
        self._where = f"the server at {parts.scheme}://{parts.hostname}{port}"
        self._verdict: str | None = None
        self._checked_at: float | None = None
        self._lock = asyncio.Lock()

    def _fresh(self) -> bool:
        at = self._checked_at
        return at is not None and self._clock() - at < PROBE_TTL_S

    async def check(self) -> str | None:
        """None when the server answers, else why it is not usable."""
        if self._fresh():
            return self._verdict
        async with self._lock:  # one probe at a time; the others take its verdict
            if not self._fresh():
                self._verdict = await self._probe()
                self._checked_at = self._clock()
            return self._verdict

    async def _probe(self) -> str | None:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                resp = await self._http.send("GET", self._url, self._headers(), resend_safe=True)
                await read_body(resp)
        except TimeoutError:
            return f"{self._where} did not answer within {PROBE_TIMEOUT_S:g} s"
        except GatewayError as exc:
            return f"{self._where} cannot be reached: {exc.message}"
        if resp.status == LOADING:
            return f"{self._where} answers 503 (loading its model)"
        return None
