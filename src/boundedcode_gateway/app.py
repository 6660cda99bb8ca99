"""The ASGI application: its lifespan owns the HTTP client, the upstreams and the meter writer."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from boundedcode_gateway import jsonl
from boundedcode_gateway.config import GatewayConfig, UpstreamLimitsSettings
from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.ingress.render import Receive, Send, send_error
from boundedcode_gateway.ingress.routes import Router
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.policy.cache_misses import ContinuityTable
from boundedcode_gateway.providers.base import Upstream
from boundedcode_gateway.providers.registry import REASONING_FILES, build_upstreams
from boundedcode_gateway.reasoning_store.store import ReasoningStore
from boundedcode_gateway.service import GatewayService
from boundedcode_gateway.upstream.http import HttpClient, Limits, Timeouts
from boundedcode_gateway.upstream.proxy import ProxySettings

log = logging.getLogger(__name__)


# how much of the call log's end a start reads for the conversations' previous calls
CONTINUITY_TAIL_BYTES = 8 * 1024 * 1024


class GatewayApp:
    """ASGI callable; ``startup()``/``shutdown()`` also run from the ASGI lifespan."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        proxies = ProxySettings.from_environ(os.environ)
        if proxies.describe():
            log.info("proxy: %s", proxies.describe())
        inference = config.inference
        self.http = HttpClient(
            Timeouts(
                inference.connect_timeout_s,
                inference.read_timeout_s,
                inference.upstream_limits.header_timeout_s,
            ),
            proxies,
            upstream_limits(inference.upstream_limits),
        )
        self.upstreams: dict[str, Upstream] = build_upstreams(config, self.http)
        self.writer = MeterWriter(config.calls_path, config.ledger_path, enabled=config.metering)
        self.reasoning = ReasoningStore(config.data_path, REASONING_FILES)
        # a restarted gateway goes on comparing each conversation with its previous call
        continuity = ContinuityTable.from_call_log(
            jsonl.read_objects(config.calls_path, tail_bytes=CONTINUITY_TAIL_BYTES)
        )
        self.service = GatewayService(
            self.upstreams, self.http, self.writer, self.reasoning, continuity, inference.max_call_s
        )
        self.router = Router(self.service, config.max_body_bytes)
        self._started = False

    async def startup(self) -> None:
        """Start the meter writer and learn each model's capabilities (failures are not fatal)."""
        if self._started:
            return
        self._started = True
        self.writer.start()
        await asyncio.gather(*(u.start() for u in self.upstreams.values()))
        results = await asyncio.gather(
            *(u.capabilities() for u in self.upstreams.values()), return_exceptions=True
        )
        for name, result in zip(self.upstreams, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("model %s: capabilities not known yet: %s", name, result)

    async def shutdown(self) -> None:
        """Close upstream connections and write every call still queued."""
        await self.service.close()
        for upstream in self.upstreams.values():
            await upstream.close()
        await self.http.close()
        await asyncio.to_thread(self.writer.close)
        await asyncio.to_thread(self.reasoning.close)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if not self._started:
                await send_error(
                    send, GatewayError("the gateway is starting", code="starting", status=503)
                )
                return
            await self.router(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def upstream_limits(settings: UpstreamLimitsSettings) -> Limits:
    """``inference.upstream_limits`` in bytes, as the HTTP client and the relay apply them."""
    return Limits(
        body_bytes=int(settings.max_body_mib * (1 << 20)),
        inflated_bytes=int(settings.max_inflated_mib * (1 << 20)),
        event_bytes=int(settings.max_event_mib * (1 << 20)),
        head_bytes=int(settings.max_header_kib * (1 << 10)),
    )


def create_app(config: GatewayConfig) -> GatewayApp:
    """The gateway as an ASGI application for ``config``."""
    return GatewayApp(config)
