"""The pipeline: the one place where routing, the call and metering meet.

Every caller request that names a model ends in exactly one ``CallRecord``,
submitted in a ``finally``. The pipeline knows providers only through
``providers.base``; it must not branch on a provider's kind. The steps of one
call are ``call_flow.CallFlow``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from boundedcode_gateway.call_flow import (
    CallDeadline,
    CallFlow,
    JsonAnswer,
    SharedState,
    StreamAnswer,
)
from boundedcode_gateway.errors import GatewayError, ModelNotFound, internal_error
from boundedcode_gateway.llama_server.cache_keeper import CacheKeeper
from boundedcode_gateway.metering.meter import CallContext, Meter
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.policy.cache_misses import ContinuityTable
from boundedcode_gateway.policy.history_diff import HistoryTracker
from boundedcode_gateway.providers.base import Upstream
from boundedcode_gateway.reasoning_store.store import ReasoningStore
from boundedcode_gateway.upstream.http import HttpClient

__all__ = ["GatewayService", "JsonAnswer", "StreamAnswer"]


class GatewayService:
    """Routes a validated request to its upstream and meters the call."""

    def __init__(
        self,
        upstreams: dict[str, Upstream],
        http: HttpClient,
        writer: MeterWriter,
        reasoning: ReasoningStore,
        continuity: ContinuityTable | None = None,
        max_call_s: float | None = None,
    ) -> None:
        self.upstreams = upstreams
        self._max_call_s = max_call_s
        self._http = http
        self._writer = writer
        continuity = continuity if continuity is not None else ContinuityTable()
        self._shared = SharedState(http, reasoning, HistoryTracker(), continuity, set())
        self._keepers: dict[str, CacheKeeper] = {}

    def record_rejected(self, ctx: CallContext, model: str, exc: GatewayError) -> None:
        """Meter a request refused before routing (bad input that still named a model)."""
        Meter(self._writer, ctx, model).error(exc)

    async def chat(self, ctx: CallContext, body: dict[str, Any]) -> JsonAnswer | StreamAnswer:
        """Answer one validated chat-completions request."""
        model: str = body["model"]
        meter = Meter(self._writer, ctx, model, messages=len(body["messages"]))
        flow: CallFlow | None = None
        deadline = self._deadline(ctx)
        timeout: asyncio.Timeout | None = None
        try:
            upstream = self.upstreams.get(model)
            if upstream is None:
                raise ModelNotFound(
                    f"The model '{model}' does not exist on this gateway", param="model"
                )
            flow = CallFlow(self._shared, meter, upstream, self.keeper(upstream), body)
            if deadline is None:
                answer = await flow.run()
            else:
                async with (timeout := asyncio.timeout_at(deadline.at)):
                    answer = await flow.run()
        except GatewayError as exc:
            _end(meter, flow, exc)
            raise
        except asyncio.CancelledError:
            _end(meter, flow, None, cancelled=True)
            raise
        except Exception as exc:
            if deadline is not None and timeout is not None and timeout.expired():
                error: GatewayError = deadline.error()
                if flow is not None:
                    flow.interrupted(error)
            else:
                error = internal_error(ctx.call_id)
            _end(meter, flow, error)
            raise error from exc
        if isinstance(answer, JsonAnswer):
            flow.end(None)  # a streamed answer's relay ends the call
        else:
            answer.deadline = deadline
        return answer

    def _deadline(self, ctx: CallContext) -> CallDeadline | None:
        """``inference.max_call_s`` from the call's start (its body read included)."""
        if self._max_call_s is None:
            return None
        return CallDeadline.after(self._max_call_s, time.perf_counter() - ctx.started)

    @property
    def keepers(self) -> dict[str, CacheKeeper]:
        """The cache keepers made so far, by profile."""
        return self._keepers

    def keeper(self, upstream: Upstream) -> CacheKeeper | None:
        """The cache keeper of a profile whose server's cache can be read (made on first use)."""
        keeper = self._keepers.get(upstream.name)
        if keeper is None:
            server = upstream.cache_server()
            if server is None:
                return None
            keeper = CacheKeeper(upstream.name, server, self._http, self._writer)
            self._keepers[upstream.name] = keeper
        return keeper

    async def close(self) -> None:
        """Stop the follow-ups still running (before the upstreams and the writer close)."""
        for keeper in self._keepers.values():
            await keeper.close()

    def structured_output_refused(self, upstream: Upstream) -> bool:
        """Whether this profile's upstream refused a schema in its form (for the process's life)."""
        return (upstream.name, upstream.schema_form) in self._shared.schema_refused


def _end(
    meter: Meter, flow: CallFlow | None, error: GatewayError | None, cancelled: bool = False
) -> None:
    """Record a call that ended before its answer: through its flow once it has one."""
    if flow is not None:
        flow.end(error, cancelled)
    elif cancelled:
        meter.cancelled()
    elif error is not None:
        meter.error(error)
