"""The rate and concurrency limits of one gateway's calls: each call admitted against its
caller's, its task's and its profile's limits before it is sent, and settled when its
record is published.

A call counts 1 in each requests window when it is admitted; it is refused while a
tokens or evaluated-tokens window is full, and adds what it spent to those windows when
it ends (counted in the window it started in: ``windows.settle``), so a token window
passes its limit by at most what the calls in flight when it filled spend. A call over
any window is refused with the wait after which it would fit (``Retry-After``). Within a
concurrency limit it waits its turn (``in_flight.py``): per caller, per task, then per
profile, whose ``in_flight_per_caller`` caps one caller below the profile's places; a
queue that is full or a wait past ``max_wait_s`` refuses it.

The counts are this process's (one gateway); the gateway's own work (cache repairs,
slot saves) counts toward no limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.config import RateLimitSettings, RateLimitsSettings, WindowSettings
from boundedcode_gateway.database.pool import DatabaseUnavailable
from boundedcode_gateway.errors import RateLimited, RateStoreUnavailable
from boundedcode_gateway.limits.in_flight import InFlightLimit, QueueFull, Ticket, WaitedTooLong
from boundedcode_gateway.limits.windows import (
    Admission,
    Settlement,
    WindowCount,
    WindowKey,
    WindowLimit,
    admit,
    settle,
    used,
)
from boundedcode_gateway.lru import IdleLru
from boundedcode_gateway.metering.records import CallRecord

# (holder kind, its name): "caller", "task" or "profile"
Holder = tuple[str, str]
# the windows kept, all holders together; the least recently used goes first
MAX_WINDOWS = 100_000
# a refused call that found no place waits this long before it is sent again
IN_FLIGHT_RETRY_AFTER_S = 1
_METRICS = ("requests", "tokens", "input_tokens", "output_tokens", "evaluated_tokens")


class WindowStore(Protocol):
    """Where the windows are counted: this process (``LocalWindows``), or a database
    several gateways share (``shared.SharedWindows``)."""

    # whether an admission waits on a database (so it is worth overlapping)
    remote: bool

    async def admit(self, asks: Sequence[tuple[WindowKey, WindowLimit, int]]) -> list[Admission]:
        """Each ask's verdict, in order; counted in every window only where all fit."""
        ...

    async def settle(self, spent: Sequence[Settlement]) -> None:
        """Add what a call spent to each window, in the window it started in."""
        ...

    async def counts(self) -> tuple[list[tuple[WindowKey, WindowCount]], float]:
        """Each window's counts, and the time they are read at (the page's view)."""
        ...


class LocalWindows:
    """The windows of this process alone."""

    remote = False

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._windows: IdleLru[WindowKey, WindowCount] = IdleLru(MAX_WINDOWS)

    async def counts(self) -> tuple[list[tuple[WindowKey, WindowCount]], float]:
        """Each window's counts, and the time they are read at."""
        return [(key, self._windows.peek(key) or WindowCount()) for key in self._windows], (
            self._clock()
        )

    async def admit(self, asks: Sequence[tuple[WindowKey, WindowLimit, int]]) -> list[Admission]:
        now = self._clock()
        verdicts = [
            admit(self._windows.get(key) or WindowCount(), limit, now, amount)
            for key, limit, amount in asks
        ]
        if all(v.allowed for v in verdicts):
            for (key, _, _), verdict in zip(asks, verdicts, strict=True):
                self._windows.put(key, verdict.state)
        return verdicts

    async def settle(self, spent: Sequence[Settlement]) -> None:
        now = self._clock()
        for key, limit, actual, counted_in in spent:
            state = self._windows.get(key)
            if state is not None:
                after = settle(state, limit, now, 0, actual, counted_in=counted_in)
                self._windows.put(key, after)


@dataclass(slots=True)
class _Held:
    """What an admitted call holds until its record is published: the token windows it
    is to be counted in (and the window each was in when it started), its places."""

    windows: list[tuple[WindowKey, WindowLimit, float]]
    tickets: list[tuple[Holder, Ticket]]


@dataclass(frozen=True, slots=True)
class Counted:
    """A call counted in its windows: the limits it is held to, and what it holds."""

    limits: list[tuple[Holder, RateLimitSettings]]
    held: _Held


@dataclass(slots=True)
class LimitCounts:
    """What the limits refused, for ``/metrics``."""

    rate_refused: int = 0
    in_flight_refused: int = 0
    # calls admitted uncounted while the shared windows' database did not answer
    uncounted: int = 0


class CallLimits:
    """One gateway's rate and concurrency limits, their counts, and the calls in flight."""

    def __init__(
        self,
        settings: RateLimitsSettings,
        key_limits: dict[str, RateLimitSettings] | None = None,
        windows: WindowStore | None = None,
    ) -> None:
        self.counts = LimitCounts()
        self.windows: WindowStore = windows if windows is not None else LocalWindows()
        self._settling: set[asyncio.Task[None]] = set()
        self._places: dict[Holder, InFlightLimit] = {}
        self._held: dict[str, _Held] = {}
        self.use(settings, key_limits or {})

    def use(self, settings: RateLimitsSettings, key_limits: dict[str, RateLimitSettings]) -> None:
        """Hold new calls to ``settings`` (a reload): the windows' counts are kept; a
        concurrency limit whose settings changed starts anew for new calls."""
        self.settings = settings
        self._key_limits = key_limits
        self._places = {
            holder: places
            for holder, places in self._places.items()
            if self._place_settings(holder) == (places.limit, places.per_holder)
        }

    def limits_of(self, ctx: CallContext, profile: str) -> list[tuple[Holder, RateLimitSettings]]:
        """The limits a call is held to, in the order its places are taken."""
        holders: list[Holder] = [("task", ctx.task), ("profile", profile)]
        if ctx.caller is not None:
            holders.insert(0, ("caller", ctx.caller.name))
        found = [(holder, self._settings_of(holder)) for holder in holders]
        return [(holder, settings) for holder, settings in found if settings is not None]

    async def admit(self, ctx: CallContext, profile: str) -> None:
        """Admit the call or refuse it (``RateLimited``); wait for its places."""
        await self.take_places(ctx, await self.count_windows(ctx, profile))

    async def count_windows(self, ctx: CallContext, profile: str) -> Counted:
        """Count the call in its windows or refuse it (``RateLimited``): the first half of
        ``admit``, which the service may ask beside the budgets."""
        limits = self.limits_of(ctx, profile)
        counted = Counted(limits, _Held([], []))
        asks: list[tuple[WindowKey, WindowLimit, int]] = []
        for (kind, name), settings in limits:
            for metric in _METRICS:
                window: WindowSettings | None = getattr(settings, metric)
                if window is not None:
                    limit = WindowLimit(window.limit, window.window_s)
                    asks.append(((kind, name, metric), limit, 1 if metric == "requests" else 0))
        if asks:
            await self._admit_windows(asks, counted.held)
        return counted

    async def take_places(self, ctx: CallContext, counted: Counted) -> None:
        """Wait for the call's places (refused, ``RateLimited``, past the queue's bounds):
        the second half of ``admit``. From here the call holds them until its record is
        published."""
        held = counted.held
        try:
            for holder, _ in counted.limits:
                await self._take_places(ctx, holder, held)
        except BaseException:
            self._release(held)
            raise
        if counted.limits:
            self._held[ctx.call_id] = held

    async def _admit_windows(
        self, asks: list[tuple[WindowKey, WindowLimit, int]], held: _Held
    ) -> None:
        try:
            verdicts = await self.windows.admit(asks)
        except DatabaseUnavailable:
            if self.settings.when_store_down == "fail_closed":
                error = RateStoreUnavailable(
                    "The rate limits' database is not answering, and rate limits do not let "
                    "calls through uncounted (rate_limits.when_store_down: fail_closed). "
                    "The call was not sent; try again shortly."
                )
                error.headers["Retry-After"] = "1"
                raise error from None
            self.counts.uncounted += 1
            return
        waits = [
            (math.inf if v.retry_after_s is None else v.retry_after_s, key[2], _name(key[:2]))
            for (key, _, _), v in zip(asks, verdicts, strict=True)
            if not v.allowed
        ]
        if waits:
            self.counts.rate_refused += 1
            raise _over_rate(waits)
        for (key, limit, _), verdict in zip(asks, verdicts, strict=True):
            if key[2] != "requests":
                held.windows.append((key, limit, verdict.state.start))

    async def _take_places(self, ctx: CallContext, holder: Holder, held: _Held) -> None:
        places = self._places_of(holder)
        if places is None:
            return
        caller = ctx.caller.name if ctx.caller is not None else ""
        try:
            held.tickets.append((holder, await places.acquire(caller)))
        except (QueueFull, WaitedTooLong) as exc:
            self.counts.in_flight_refused += 1
            error = RateLimited(
                f"Too many calls in flight: {_name(holder)} has {places.in_flight} of its "
                f"{places.limit} at once, and this call {_why(exc, self.settings.max_wait_s)}. "
                "The call was not sent; send it again shortly."
            )
            error.headers["Retry-After"] = str(IN_FLIGHT_RETRY_AFTER_S)
            raise error from None

    def _place_settings(self, holder: Holder) -> tuple[int, int | None] | None:
        settings = self._settings_of(holder)
        if settings is None:
            return None
        per_caller = settings.in_flight_per_caller if holder[0] == "profile" else None
        if settings.in_flight is None and per_caller is None:
            return None
        # a cap per caller alone: as many places as there could be callers
        return settings.in_flight or 1_000_000, per_caller

    def _settings_of(self, holder: Holder) -> RateLimitSettings | None:
        kind, name = holder
        if kind == "caller":
            return self._key_limits.get(name) or self.settings.per_caller
        if kind == "task":
            return self.settings.per_task
        return self.settings.profiles.get(name)

    def _places_of(self, holder: Holder) -> InFlightLimit | None:
        places = self._places.get(holder)
        if places is not None:
            return places
        wanted = self._place_settings(holder)
        if wanted is None:
            return None
        limit, per_caller = wanted
        places = InFlightLimit(
            limit, self.settings.max_waiting, self.settings.max_wait_s, per_holder=per_caller
        )
        self._places[holder] = places
        return places

    def count(self, record: CallRecord) -> None:
        """A call ended (its record is published): what it spent counts in its token
        windows, and its places are free."""
        held = self._held.pop(record.call_id, None)
        if held is None:
            return
        self._release(held)
        if not held.windows:
            return
        prompt, completion = record.prompt_tokens or 0, record.completion_tokens or 0
        spent = {
            "tokens": prompt + completion,
            "input_tokens": prompt,
            "output_tokens": completion,
            "evaluated_tokens": record.evaluated_tokens or 0,
        }
        # off the call's path, in one statement for a shared window
        task = asyncio.get_running_loop().create_task(self._settle(held, spent))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    def _release(self, held: _Held) -> None:
        """Free a call's places; a limit nobody holds or waits for is let go (a task's,
        of which there is one per task id), to be made again on its next use."""
        for holder, ticket in held.tickets:
            ticket.release()
            places = self._places.get(holder)
            if places is not None and places.in_flight == 0 and places.waiting == 0:
                del self._places[holder]

    async def _settle(self, held: _Held, spent: dict[str, int]) -> None:
        settlements = [(key, limit, spent[key[2]], started) for key, limit, started in held.windows]
        with contextlib.suppress(DatabaseUnavailable):
            await self.windows.settle(settlements)

    async def settled(self) -> None:
        """Wait for the settlements under way (tests; a stop)."""
        if self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)

    async def view(self) -> dict[str, list[dict[str, object]]]:
        """Each window's use and each concurrency limit's places, as the page shows them
        (a window no limit of the configuration names any more is left out)."""
        counted, now = await self.windows.counts()
        windows: list[dict[str, object]] = []
        for (kind, name, metric), state in counted:
            settings = self._settings_of((kind, name))
            window: WindowSettings | None = (
                getattr(settings, metric) if settings is not None else None
            )
            if window is None:
                continue
            limit = WindowLimit(window.limit, window.window_s)
            windows.append(
                {
                    "holder": kind,
                    "name": name,
                    "metric": metric,
                    "used": round(used(state, limit, now), 3),
                    "limit": window.limit,
                    "window_s": window.window_s,
                }
            )
        places: list[dict[str, object]] = [
            {
                "holder": kind,
                "name": name,
                "in_flight": limit.in_flight,
                "waiting": limit.waiting,
                "limit": limit.limit,
                "per_caller": limit.per_holder,
            }
            for (kind, name), limit in self._places.items()
        ]
        return {"windows": windows, "in_flight": places}

    @property
    def in_flight(self) -> dict[Holder, InFlightLimit]:
        """The concurrency limits in use, by holder (for ``/metrics`` and the views)."""
        return dict(self._places)


def _name(holder: Holder) -> str:
    kind, name = holder
    return f"{kind} '{name}'"


def _why(exc: QueueFull | WaitedTooLong, max_wait_s: float) -> str:
    if isinstance(exc, QueueFull):
        return f"found {exc.waiting} calls already waiting"
    return f"waited {max_wait_s:g} s for a place"


def _over_rate(waits: list[tuple[float, str, str]]) -> RateLimited:
    """The refusal of a call over one window or more: the longest wait among them."""
    wait, metric, _ = max(waits)
    named = "; ".join(f"{h} is over its {m} limit" for _, m, h in sorted(waits))
    kind = "requests" if metric == "requests" else "tokens"
    if math.isinf(wait):
        error = RateLimited(
            f"Rate limit exceeded: {named}, and this call alone is more than the limit. "
            "The call was not sent.",
            error_type=kind,
        )
        error.headers["x-should-retry"] = "false"
    else:
        error = RateLimited(
            f"Rate limit exceeded: {named}. The call was not sent; it fits again in {wait:.1f} s.",
            error_type=kind,
        )
        error.headers["Retry-After"] = str(max(1, math.ceil(wait)))
    return error
