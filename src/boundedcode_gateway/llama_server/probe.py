"""Whether a local server the gateway does not run is answering: one short ``GET /health``
through the server's API client, its verdict kept for a moment so that a readiness check
polled often costs no more."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.llama_server.api import LlamaServerAPI, ServerRefused

PROBE_TIMEOUT_S = 2.0
# how long a verdict is reused
PROBE_TTL_S = 2.0
# llama.cpp's /health while it loads the model
LOADING = 503


class ServerProbe:
    """``GET /health`` of the server at ``root``: any answer but 503 means it is up (a
    server that is not llama.cpp may answer 404, which is as good); a refused connection
    or silence means it is not."""

    def __init__(
        self, api: LlamaServerAPI, root: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._api = api
        self._root = root
        self._clock = clock
        parts = urlsplit(root)
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
                await self._api.health(self._root)
        except TimeoutError:
            return f"{self._where} did not answer within {PROBE_TIMEOUT_S:g} s"
        except GatewayError as exc:
            return f"{self._where} cannot be reached: {exc.message}"
        except ServerRefused as refused:
            if refused.status == LOADING:
                return f"{self._where} answers 503 (loading its model)"
        return None
