"""The ASGI application: its lifespan owns the HTTP client, the upstreams and the meter writer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from boundedcode_gateway.config import GatewayConfig
from boundedcode_gateway.errors import GatewayError, internal_error
from boundedcode_gateway.ingress.body import BodyParser
from boundedcode_gateway.ingress.render import Receive, Send, send_error
from boundedcode_gateway.ingress.routes import Router
from boundedcode_gateway.metering.calllog import read_tail
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.policy.cache_misses import ContinuityTable
from boundedcode_gateway.policy.history_diff import HistoryTracker
from boundedcode_gateway.providers.base import Upstream
from boundedcode_gateway.providers.registry import REASONING_FILES, build_upstreams
from boundedcode_gateway.reasoning_store.store import ReasoningStore
from boundedcode_gateway.retention import FolderSweeper
from boundedcode_gateway.service import GatewayService
from boundedcode_gateway.upstream.http import HttpClient, Timeouts
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
        self.http = HttpClient(
            Timeouts(config.inference.connect_timeout_s, config.inference.read_timeout_s),
            proxies,
        )
        self.upstreams: dict[str, Upstream] = build_upstreams(config, self.http)
        self.writer = MeterWriter(
            config.calls_path,
            config.ledger_path,
            enabled=config.metering.enabled,
            sync=config.metering.sync,
            rotate_bytes=config.retention.call_log_bytes,
            rotated_files=config.retention.call_log_files,
        )
        retention = config.retention
        memory = (retention.tasks_in_memory, retention.task_idle_s)
        self.reasoning = ReasoningStore(config.data_path, REASONING_FILES, *memory)
        # a restarted gateway goes on comparing each conversation with its previous call
        continuity = ContinuityTable.from_call_log(
            read_tail(config.calls_path, CONTINUITY_TAIL_BYTES), *memory
        )
        self.service = GatewayService(
            self.upstreams,
            self.http,
            self.writer,
            self.reasoning,
            continuity,
            HistoryTracker(*memory),
        )
        self.sweeper = (
            FolderSweeper(self.reasoning, retention.task_days)
            if retention.task_days is not None
            else None
        )
        self._sweeping: asyncio.Task[None] | None = None
        self.body_parser = BodyParser(config.limits.max_parsing_bytes)
        self.router = Router(self.service, config.max_body_bytes, self.body_parser)
        self._started = False

    async def startup(self) -> None:
        """Start the meter writer and learn each model's capabilities (failures are not fatal)."""
        if self._started:
            return
        self._started = True
        self.writer.start()
        if self.sweeper is not None:
            self._sweeping = asyncio.create_task(self.sweeper.run())
        await asyncio.gather(*(u.start() for u in self.upstreams.values()))
        results = await asyncio.gather(
            *(u.capabilities() for u in self.upstreams.values()), return_exceptions=True
        )
        for name, result in zip(self.upstreams, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("model %s: capabilities not known yet: %s", name, result)

    async def shutdown(self) -> None:
        """Close upstream connections and write every call still queued."""
        if self._sweeping is not None:
            self._sweeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeping
        await self.service.close()
        for upstream in self.upstreams.values():
            await upstream.close()
        await self.http.close()
        await asyncio.to_thread(self.writer.close)
        await asyncio.to_thread(self.reasoning.close)
        self.body_parser.close()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if not self._started:
                await send_error(
                    send, GatewayError("the gateway is starting", code="starting", status=503)
                )
                return
            await self._route(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _route(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """The router, under a last catch-all: a fault that escapes it is still answered in
        OpenAI's shape (uvicorn's own answer would be a text/plain 500)."""
        try:
            await self.router(scope, receive, send)
        except Exception:
            error = internal_error(f"{scope.get('method')} {scope.get('path')}")
            # once the answer has begun, uvicorn refuses a second start: nothing more to say
            with contextlib.suppress(Exception):
                await send_error(send, error)

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


def create_app(config: GatewayConfig) -> GatewayApp:
    """The gateway as an ASGI application for ``config``."""
    return GatewayApp(config)
