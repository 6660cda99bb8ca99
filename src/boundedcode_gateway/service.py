"""The pipeline: the one place where routing, the call and metering meet.

Every caller request that names a model ends in exactly one ``CallRecord``,
submitted in a ``finally``. The pipeline knows providers only through
``providers.base``; it must not branch on a provider's kind. The steps of one
call are ``call_flow.CallFlow``.

The routes come from a ``LiveConfig``, read once per call; a reload hands the
service a new one (``use``), and a route it no longer has is closed once the
calls on it have ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol

from boundedcode_gateway.budgets.book import Budgets
from boundedcode_gateway.budgets.reservation import Reservation
from boundedcode_gateway.budgets.view import budget_lines, budgets_of
from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.call_flow import (
    CallDeadline,
    CallFlow,
    ContentSink,
    JsonAnswer,
    SharedState,
    StreamAnswer,
)
from boundedcode_gateway.errors import GatewayError, ModelNotFound, internal_error
from boundedcode_gateway.limits.limiter import CallLimits
from boundedcode_gateway.live_config import LiveConfig, Route
from boundedcode_gateway.llama_server.cache_keeper import CacheKeeper
from boundedcode_gateway.metering.bus import RecordBus
from boundedcode_gateway.metering.meter import Meter
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.metering.request_facts import RequestFacts
from boundedcode_gateway.policy.cache_misses import ContinuityTable
from boundedcode_gateway.policy.history_diff import History, HistoryTracker
from boundedcode_gateway.providers.base import Upstream
from boundedcode_gateway.reasoning_store.backend import ReasoningBackend
from boundedcode_gateway.relay import CallWatcher
from boundedcode_gateway.text import clip
from boundedcode_gateway.upstream.http import HttpClient

__all__ = ["GatewayService", "JsonAnswer", "StreamAnswer"]

log = logging.getLogger(__name__)


class CallsWatcher(CallWatcher, Protocol):
    """Who is told of every call: its start, how its stream goes (``CallWatcher``) and its
    record (the page of calls, ``ui/events.py``, which sits above the service)."""

    def started(self, call_id: str, task: str, purpose: str, model: str, stream: bool) -> None: ...

    def finished(self, record: CallRecord) -> None: ...


class GatewayService:
    """Routes a validated request to its upstream, holds it to its budgets and meters it."""

    def __init__(
        self,
        live: LiveConfig,
        http: HttpClient,
        bus: RecordBus,
        reasoning: ReasoningBackend,
        continuity: ContinuityTable | None = None,
        budgets: Budgets | None = None,
        limits: CallLimits | None = None,
        history: History | None = None,
        events: CallsWatcher | None = None,
        content: ContentSink | None = None,
    ) -> None:
        self.live = live
        self._http = http
        self._bus = bus
        if budgets is not None:
            # every record published, the cache repairs' too, counts before the next
            # call is admitted
            bus.count("budgets", budgets.count)
        self._budgets = budgets
        # the rate and concurrency limits, counted and freed as each record is published
        self._limits = limits
        if limits is not None:
            bus.count("limits", limits.count)
        continuity = continuity if continuity is not None else ContinuityTable()
        history = history if history is not None else HistoryTracker()
        self._shared = SharedState(http, reasoning, history, continuity, set(), events, content)
        if events is not None:
            bus.subscribe("the page of calls", events.finished)
        self._events = events
        # routes a reload took out, until the calls on them end
        self._retiring: dict[Route, asyncio.Task[None]] = {}

    @property
    def upstreams(self) -> dict[str, Upstream]:
        """The upstream of each model profile new calls go to."""
        return self.live.upstreams

    def routes(self) -> Iterator[Route]:
        """Every route with calls that may still be on it: the live ones, then those
        retiring."""
        yield from self.live.routes.values()
        yield from self._retiring

    def serves(self, model: str) -> bool:
        """Whether ``model`` names a live profile, or one retiring after a reload."""
        return model in self.live.routes or any(r.name == model for r in self._retiring)

    def record_rejected(self, ctx: CallContext, asked: RequestFacts, exc: GatewayError) -> None:
        """Meter a request refused before routing (bad input that still named a model), with
        what it asked for: its stream flag, its messages, the provider its model names."""
        model = asked.model
        assert model is not None
        meter = Meter(self._bus, ctx, model, asked.messages, self.live.price_of(model))
        meter.record.stream = asked.stream
        _resolved(meter, self.live.routes.get(model))
        meter.error(exc)

    async def chat(self, ctx: CallContext, body: dict[str, Any]) -> JsonAnswer | StreamAnswer:
        """Answer one validated chat-completions request."""
        model: str = body["model"]
        route, on_submit = self._entered(model)
        price = self.live.price_of(model)
        meter = Meter(self._bus, ctx, model, len(body["messages"]), price, on_submit)
        stream = body.get("stream") is True
        # what a call refused before its flow (a budget, an unknown model) still says
        meter.record.stream = stream
        _resolved(meter, route)
        if self._events is not None:
            # the name as the record keeps it: clipped once, by the meter
            shown = meter.record.model_profile
            self._events.started(ctx.call_id, ctx.task, ctx.purpose, shown, stream)
        flow: CallFlow | None = None
        deadline = self._deadline(ctx)
        timeout: asyncio.Timeout | None = None
        try:
            upstream = await self._admitted(route, model, ctx, body)
            assert route is not None
            flow = CallFlow(self._shared, meter, upstream, route.fleet, self._keeper(route), body)
            if deadline is None:
                answer = await flow.run()
            else:
                async with (timeout := asyncio.timeout_at(deadline.at)):
                    answer = await flow.run()
        except GatewayError as exc:
            _end(meter, flow, exc)
            await meter.recorded()
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
            await meter.recorded()
            raise error from exc
        if isinstance(answer, JsonAnswer):
            flow.end(None)  # a streamed answer's relay ends the call
            # what the call kept stored, and (`metering.sync`) its record, before the caller has it
            await flow.recorded()
        else:
            answer.deadline = deadline
        return answer

    async def count_tokens(self, ctx: CallContext, body: dict[str, Any]) -> int:
        """The prompt tokens of one validated chat-completions body, as its profile's server
        renders and counts them; held to the caller's and the task's budgets as a call is,
        and recorded (its purpose ``token_count``, no tokens spent: nothing is generated)."""
        model: str = body["model"]
        route, on_submit = self._entered(model)
        # no price: a count spends nothing a budget or a bill counts
        meter = Meter(self._bus, ctx, model, len(body["messages"]), None, on_submit)
        _resolved(meter, route)
        try:
            await self._admitted(route, model, ctx, None)
            assert route is not None
            meter.record.attempts = 1
            fleet = route.fleet
            tokens = await fleet.count_tokens(body) if fleet is not None else None
            if tokens is None:
                raise _count_not_supported(model)
        except GatewayError as exc:
            meter.error(exc)
            await meter.recorded()
            raise
        except asyncio.CancelledError:
            meter.cancelled()
            raise
        except Exception as exc:
            error = internal_error(ctx.call_id)
            meter.error(error)
            await meter.recorded()
            raise error from exc
        meter.ok()
        await meter.recorded()
        return tokens

    def _entered(self, model: str) -> tuple[Route | None, Callable[[], None] | None]:
        """The profile's route with this call counted in flight on it, and what ends that
        count when the call's record is submitted."""
        route = self.live.routes.get(model)
        if route is None:
            return None, None
        route.enter()
        return route, route.leave

    async def _admitted(
        self, route: Route | None, model: str, ctx: CallContext, body: dict[str, Any] | None
    ) -> Upstream:
        """The upstream of the profile a call names, once the caller's and the task's
        budgets let it start: ``body``'s reservation held of them (a count of tokens,
        with no body, spends nothing and needs only something left)."""
        if route is None:
            raise ModelNotFound(
                f"The model '{clip(model)}' does not exist on this gateway", param="model"
            )
        limits, budgets = self._limits, self._budgets
        reservation = None
        if budgets is not None and body is not None:
            reservation = self.live.reservation_of(model, body)
        if limits is not None and budgets is not None and limits.windows.remote and budgets.remote:
            await _admitted_at_once(limits, budgets, ctx, model, reservation)
            return route.upstream
        if limits is not None:
            await limits.admit(ctx, model)
        if budgets is not None:
            await budgets.admit(ctx, reservation)
        return route.upstream

    def _deadline(self, ctx: CallContext) -> CallDeadline | None:
        """``inference.max_call_s`` from the call's start (its body read included)."""
        max_call_s = self.live.config.inference.max_call_s
        if max_call_s is None:
            return None
        return CallDeadline.after(max_call_s, time.perf_counter() - ctx.started)

    @property
    def keepers(self) -> dict[Upstream, CacheKeeper]:
        """The cache keepers made so far, by upstream (a route still retiring's too)."""
        return {
            route.upstream: route.fleet.cache_keeper
            for route in self.routes()
            if route.fleet is not None and route.fleet.cache_keeper is not None
        }

    def _keeper(self, route: Route) -> CacheKeeper | None:
        """The cache keeper of a profile whose servers' cache can be read (made on first
        use; a changed profile's new route gets one of its own)."""
        if route.fleet is None:
            return None
        return route.fleet.keeper(self._bus, self.live.price_of(route.name))

    def use(self, live: LiveConfig) -> None:
        """Serve new calls from ``live``; a route it does not keep is closed once the calls
        on it have ended (they go on with the upstream they started with)."""
        kept = set(live.routes.values())
        old, self.live = self.live, live
        # a price is not part of a route: a kept route's cache repairs take the new one
        for upstream, keeper in self.keepers.items():
            keeper.price = live.price_of(upstream.name)
        for route in old.routes.values():
            if route not in kept and route not in self._retiring:
                task = asyncio.get_running_loop().create_task(self._close_when_idle(route))
                self._retiring[route] = task
                # a changed profile's new upstream is sent a schema again
                refused = self._shared.schema_refused
                refused.difference_update([r for r in refused if r[0] == route.name])

    async def _close_when_idle(self, route: Route) -> None:
        await route.idle()
        try:
            await self._close_route(route)
        finally:
            self._retiring.pop(route, None)
        log.info("model %s: the upstream of its previous configuration is closed", route.name)

    async def _close_route(self, route: Route) -> None:
        await route.close()

    async def close(self) -> None:
        """Stop the follow-ups still running, then close every upstream (before the writer
        closes); a route still retiring is closed now."""
        retiring = list(self._retiring.items())
        for _, task in retiring:
            task.cancel()
        for _, task in retiring:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        routes = [*self.live.routes.values(), *(r for r, _ in retiring)]
        for keeper in self.keepers.values():
            await keeper.close()
        for route in routes:
            await route.close()

    async def servers_of(self, model: str) -> list[dict[str, Any]] | None:
        """The servers behind a live local profile as an operator is shown them (no key, no
        prompt); None for a cloud API or a name no live profile has."""
        route = self.live.routes.get(model)
        if route is None or route.fleet is None:
            return None
        return await route.fleet.servers()

    async def limits_view(self) -> dict[str, Any]:
        """Each budget's limits (spent, held by the calls in flight, left), each rate
        window's use and each concurrency limit's places: what the page shows."""
        out: dict[str, Any] = {"budgets": [], "windows": [], "in_flight": []}
        budgets = self._budgets
        if budgets is not None:
            day = datetime.now(UTC).date().isoformat()
            spent, held = await budgets.snapshot(day)
            tasks = [name for kind, name in spent if kind == "task"]
            lines = budget_lines(budgets_of(self.live.config, tasks), spent, day, held)
            out["budgets"] = [line.to_dict() for line in lines]
        if self._limits is not None:
            out.update(await self._limits.view())
        return out

    def slot_files_of(self, model: str) -> dict[str, Any] | None:
        """What the slot files did for a live local profile (None: none, or a cloud API)."""
        route = self.live.routes.get(model)
        if route is None or route.fleet is None:
            return None
        return route.fleet.slot_files_view()

    def structured_output_refused(self, upstream: Upstream) -> bool:
        """Whether this profile's upstream refused a schema in its form (for the process's life)."""
        return (upstream.name, upstream.schema_form) in self._shared.schema_refused


def _count_not_supported(model: str) -> GatewayError:
    exc = GatewayError(
        f"Counting tokens is not available for the model '{clip(model)}': "
        "only a profile served by llama.cpp counts them",
        status=501,
        error_type="not_supported_error",
        code="not_supported",
    )
    # not a failure a resend can cure
    exc.headers["x-should-retry"] = "false"
    return exc


def _resolved(meter: Meter, route: Route | None) -> None:
    """The record's provider and upstream model, where the call's model names a profile."""
    if route is not None:
        meter.record.provider = route.upstream.provider
        meter.record.upstream_model = route.upstream.upstream_model


async def _admitted_at_once(
    limits: CallLimits,
    budgets: Budgets,
    ctx: CallContext,
    model: str,
    reservation: Reservation | None,
) -> None:
    """A call's windows and budgets when both are in the shared database: asked at once,
    the call waits one round trip, not two; then its places. Both questions are always
    answered (each is one statement): the call counts in its windows whatever its budget
    says, as it does when they are asked in turn, and where both refuse the window's
    refusal is the answer. A call refused either way is recorded like any other, and its
    record lets go of what the other held (its reservation, through the ledger)."""
    counted, reserved = await asyncio.gather(
        limits.count_windows(ctx, model), budgets.admit(ctx, reservation), return_exceptions=True
    )
    if isinstance(counted, BaseException):
        raise counted
    if isinstance(reserved, BaseException):
        raise reserved
    await limits.take_places(ctx, counted)


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
