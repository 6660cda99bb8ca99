"""The ASGI application: its lifespan owns the HTTP client, the upstreams and the meter writer."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from boundedcode_gateway import jsonl
from boundedcode_gateway.budgets.book import BudgetBook, budgets_configured
from boundedcode_gateway.budgets.store import LedgerSpendStore, SpendStore
from boundedcode_gateway.config import GatewayConfig
from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.ingress.render import Receive, Send, send_error
from boundedcode_gateway.ingress.routes import Router
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.policy.cache_misses import ContinuityTable
from boundedcode_gateway.providers.base import Upstream
from boundedcode_gateway.providers.registry import REASONING_FILES, build_upstreams
from boundedcode_gateway.reasoning_store.store import ReasoningStore
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
        self.writer = MeterWriter(config.calls_path, config.ledger_path, enabled=config.metering)
        self.reasoning = ReasoningStore(config.data_path, REASONING_FILES)
        # a restarted gateway goes on comparing each conversation with its previous call
        continuity = ContinuityTable.from_call_log(
            jsonl.read_objects(config.calls_path, tail_bytes=CONTINUITY_TAIL_BYTES)
        )
        # no book where no call can have a budget: nothing to check or count per call
        self.budgets = BudgetBook(config.budgets.task) if budgets_configured(config) else None
        # what the budgets spent before this process: the ledger, unless nothing is written
        self.spend_store: SpendStore | None = (
            LedgerSpendStore(config.ledger_path) if config.metering else None
        )
        prices = {name: p.price for name, p in config.models.items() if p.price is not None}
        self.service = GatewayService(
            self.upstreams,
            self.http,
            self.writer,
            self.reasoning,
            continuity,
            prices=prices,
            budgets=self.budgets,
        )
        self.router = Router(self.service, config.max_body_bytes)
        self._started = False

    async def startup(self) -> None:
        """Start the meter writer and learn each model's capabilities (failures are not fatal)."""
        if self._started:
            return
        self._started = True
        await self._restore_budgets()
        self.writer.start()
        await asyncio.gather(*(u.start() for u in self.upstreams.values()))
        results = await asyncio.gather(
            *(u.capabilities() for u in self.upstreams.values()), return_exceptions=True
        )
        for name, result in zip(self.upstreams, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("model %s: capabilities not known yet: %s", name, result)

    async def _restore_budgets(self) -> None:
        """Read what each caller and task spent before this process, once, off the loop.

        A ledger that cannot be read stops start-up: budgets are not enforced blind.
        """
        if self.budgets is None or self.spend_store is None:
            return
        try:
            spent = await asyncio.to_thread(self.spend_store.spent, self.budgets.today())
        except Exception as exc:
            raise RuntimeError(
                f"cannot read the budgets' spending from the ledger {self.config.ledger_path}: "
                f"{exc}"
            ) from exc
        self.budgets.restore(spent)
        log.info("budgets: spending of %d callers and tasks read from the ledger", len(spent))

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


def create_app(config: GatewayConfig) -> GatewayApp:
    """The gateway as an ASGI application for ``config``."""
    return GatewayApp(config)
