"""One call's meter: the record filled as the call goes, published once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future

from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.metering.bus import RecordSink
from boundedcode_gateway.metering.cost import Price, call_cost
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.text import clip
from boundedcode_gateway.upstream.metrics import CallMetrics

CLIENT_CLOSED = 499  # nginx's convention for "the caller went away"
# what a record keeps of an error's message
MAX_ERROR_MESSAGE_CHARS = 500


def derived_ttft(elapsed_ms: float, m: CallMetrics) -> float | None:
    """A non-streamed answer's time to first token, from the server's own timings: the
    time until now less decoding, plus one token's decode time (None without them)."""
    if m.decode_ms is None or not m.completion_tokens:
        return None
    decode = m.decode_ms
    return round(max(0.0, elapsed_ms - decode + decode / m.completion_tokens), 3)


class Meter:
    """Holds one call's record, its identity and outcome, and submits it exactly once.

    The call's own fields are filled by whoever ran the call, from what its steps
    returned (``call_flow.CallFlow``), before the outcome is submitted; its cost is
    computed from them here, with the price of the profile the call was routed to.
    """

    __slots__ = ("_done", "_durable", "_on_submit", "_price", "_sink", "ctx", "record")

    def __init__(
        self,
        sink: RecordSink,
        ctx: CallContext,
        model: str,
        messages: int = 0,
        price: Price | None = None,
        on_submit: Callable[[], None] | None = None,
    ) -> None:
        self._sink = sink
        self._price = price
        # the call is over once its record is submitted (the route counts it out)
        self._on_submit = on_submit
        self.ctx = ctx
        self.record = CallRecord(
            call_id=ctx.call_id,
            started_at=ctx.started_at,
            task=ctx.task,
            purpose=ctx.purpose,
            # the name a caller asked for, which need not be a profile's
            model_profile=clip(model),
            caller=ctx.caller.name if ctx.caller is not None else None,
            messages=messages,
            front=ctx.front,
            trace=ctx.trace,
        )
        self._done = False
        # with `metering.sync`, done once the record is written
        self._durable: Future[None] | None = None

    def ok(self, http_status: int = 200) -> None:
        self._submit("ok", http_status, None)

    def error(self, exc: GatewayError) -> None:
        if not self._done:
            self.record.error_message = clip(exc.message, MAX_ERROR_MESSAGE_CHARS)
        self._submit("error", exc.http_status, exc.code or exc.type)

    def cancelled(self) -> None:
        self._submit("error", CLIENT_CLOSED, "client_disconnected")

    def abandoned(self) -> None:
        """Work of the gateway's own that gave way to a caller's call: not a failure (status
        ``abandoned``); its HTTP request was closed before an answer, hence 499."""
        self._submit("abandoned", CLIENT_CLOSED, "abandoned")

    def _submit(self, status: str, http_status: int, code: str | None) -> None:
        if self._done:
            return
        self._done = True
        r = self.record
        r.status = status
        r.http_status = http_status
        r.error_code = code
        r.total_ms = self.ctx.elapsed_ms()
        r.cost_usd = call_cost(
            self._price,
            prompt_tokens=r.prompt_tokens,
            cached_tokens=r.cached_tokens,
            completion_tokens=r.completion_tokens,
            prefill_ms=r.prefill_ms,
            decode_ms=r.decode_ms,
        )
        self._durable = self._sink.publish(r)
        if self._on_submit is not None:
            self._on_submit()

    async def recorded(self) -> None:
        """Once the record is in the call log and the ledger, with ``metering.sync``; at once
        otherwise (and for a record not submitted yet)."""
        if self._durable is not None and not self._durable.done():
            await asyncio.wrap_future(self._durable)
