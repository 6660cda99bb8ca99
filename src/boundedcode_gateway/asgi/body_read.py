"""A request body read whole, within its size limit and its pace.

The protocol's idle timer (``limits.idle_timeout_s``) is reset by any byte, so a
body trickled a byte a second would hold its connection, and whatever it sent
before, for as long as its sender likes. Here a body must keep a minimum rate on
average once it has run a grace period, and be whole by a deadline derived from
its declared length (a chunked body's from the size limit), capped; past either
it is a ``408 request_timeout`` and the connection is closed.

One timer per body, moved as bytes arrive to the moment the average would fall
below the rate if nothing more came: no per-chunk check of the clock is needed.

The pace bounds how long a body holds its bytes, not how many bodies hold them at
once: a ``ReadingBudget`` counts the bytes of every body being read, and a body
that would pass it while others are read is a ``503 server_busy`` (the bodies
already admitted go on; one read alone always is).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from boundedcode_gateway.asgi.render import Receive
from boundedcode_gateway.config import LimitsSettings
from boundedcode_gateway.errors import BodiesOverBudget, BodyTooLarge, BodyTooSlow, CallerLeft


@dataclass(frozen=True, slots=True)
class BodyPace:
    """How fast a body must arrive: ``limits.body_grace_s``, ``min_body_rate_kib_s``
    (here in bytes a second) and ``max_body_s``."""

    grace_s: float
    min_rate: float
    max_s: float

    @classmethod
    def of(cls, limits: LimitsSettings) -> BodyPace:
        return cls(limits.body_grace_s, limits.min_body_rate, limits.max_body_s)

    def deadline_s(self, length: int) -> float:
        """Seconds a body of ``length`` bytes may take from its start, at most."""
        return min(self.max_s, self.grace_s + length / self.min_rate)

    def due_s(self, received: int) -> float:
        """Seconds from the start by which more than ``received`` bytes must have come
        for the average to stay at the rate (never before the grace has run)."""
        return max(self.grace_s, received / self.min_rate)


class ReadingBudget:
    """The bytes of request bodies being read at once (``limits.max_reading_mib``)."""

    __slots__ = ("budget_bytes", "reading_bytes")

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.reading_bytes = 0

    def take(self, size: int, own: int) -> None:
        """Count ``size`` more bytes of a body that has ``own`` counted already, or refuse
        them (counting nothing). A body read alone is never refused: any body up to the
        size limit can be read, whatever the budget."""
        if self.reading_bytes + size > self.budget_bytes and self.reading_bytes > own:
            raise BodiesOverBudget(
                "The gateway is reading as many request bytes at once as "
                f"limits.max_reading_mib ({self.budget_bytes / (1 << 20):g} MiB) allows; "
                "try again shortly",
                retryable=True,
            )
        self.reading_bytes += size

    def give_back(self, size: int) -> None:
        self.reading_bytes -= size


def _declared_length(scope: dict[str, Any]) -> str | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            return str(value.decode("latin-1"))
    return None


def _too_slow(pace: BodyPace, received: int, elapsed: float, whole_s: float) -> BodyTooSlow:
    # which of the two the timer was set to (it may fire a clock tick early)
    if whole_s <= pace.due_s(received):
        limit = (
            f"limits.max_body_s ({pace.max_s:g} s)"
            if whole_s >= pace.max_s
            else f"its length at limits.min_body_rate_kib_s ({pace.min_rate / 1024:g} KiB/s) "
            f"after limits.body_grace_s ({pace.grace_s:g} s)"
        )
        reason = f"was not whole within {whole_s:.1f} s: {limit}"
    else:
        reason = (
            f"arrived below limits.min_body_rate_kib_s ({pace.min_rate / 1024:g} KiB/s): "
            f"{received} bytes in {elapsed:.1f} s"
        )
    return BodyTooSlow(f"The request body {reason}")


def _left(received: int, declared: str | None) -> CallerLeft:
    of = f"{received} of {declared} bytes" if declared is not None else f"{received} bytes"
    return CallerLeft(f"The caller closed its connection after {of} of its request body")


async def read_request_body(
    scope: dict[str, Any],
    receive: Receive,
    limit: int,
    pace: BodyPace,
    budget: ReadingBudget | None = None,
) -> bytes:
    """The request body; refused with 413 as soon as it passes ``limit`` bytes, with 408
    as soon as it falls behind ``pace``, with 503 when ``budget`` cannot hold it;
    ``CallerLeft`` when the caller closes its connection before the body is whole."""
    declared = _declared_length(scope)
    length = limit
    if declared is not None and declared.isdigit():
        length = int(declared)
        if length > limit:
            raise BodyTooLarge(
                f"Request body of {declared} bytes exceeds the limit of {limit} bytes"
            )
    loop = asyncio.get_running_loop()
    started = loop.time()
    whole_s = pace.deadline_s(length)
    parts: list[bytes] = []
    size = 0
    counted = 0  # of ``budget``, given back once the body is read or refused
    timer = asyncio.timeout_at(started + min(whole_s, pace.due_s(0)))
    try:
        async with timer:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _left(size, declared)
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge(f"Request body exceeds the limit of {limit} bytes")
                if budget is not None:
                    budget.take(len(chunk), counted)
                    counted += len(chunk)
                parts.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(parts)
                # a moment already past fires at once: the average is below the rate
                timer.reschedule(started + min(whole_s, pace.due_s(size)))
    except TimeoutError:
        if not timer.expired():
            raise
        raise _too_slow(pace, size, loop.time() - started, whole_s) from None
    finally:
        if budget is not None:
            budget.give_back(counted)
