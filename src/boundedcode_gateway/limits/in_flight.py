"""A concurrency limit: at most ``limit`` calls in flight, the others waiting their turn in
a bounded queue that is fair between holders (API keys, tasks).

A call that finds no place waits, unless ``max_waiting`` calls already do (``QueueFull``
at once), and for no longer than ``max_wait_s`` (``WaitedTooLong``). A place that frees
goes to the holders that have waiters in turn, each holder's own waiters first come
first served: one holder's burst of forty waiters leaves another holder's single waiter
second in line, not forty-first. ``per_holder`` caps what one holder holds even while
places are free, so that a key capped at 1 of a local server's 2 slots always leaves
the other to the other keys; a waiter held back by its own holder's cap lets the
waiters of other holders pass.

A place is counted as taken when it is handed to a waiter, before that waiter's task
runs again; a waiter cancelled at that moment gives it on to the next one, so a
cancellation leaks no place and leaves no waiter behind. One event loop uses a limit.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType


class QueueFull(Exception):
    """No place was free and ``max_waiting`` calls already wait: refused at once."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"no place free and {waiting} call(s) already waiting")
        self.waiting = waiting


class WaitedTooLong(Exception):
    """A call waited ``max_wait_s`` without getting a place."""

    def __init__(self, waited_s: float) -> None:
        super().__init__(f"waited {waited_s:.3f} s without a place")
        self.waited_s = waited_s


class Ticket:
    """A place held by ``holder`` until released: ``release()``, or the end of a ``with``
    or ``async with`` block. Releasing twice frees the place once."""

    __slots__ = ("_limit", "_released", "holder")

    def __init__(self, limit: InFlightLimit, holder: str) -> None:
        self._limit = limit
        self.holder = holder
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limit._release(self.holder)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    async def __aenter__(self) -> Ticket:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class InFlightLimit:
    """At most ``limit`` places held at once, and at most ``per_holder`` by one holder
    (None: no cap of its own); at most ``max_waiting`` calls waiting, each at most
    ``max_wait_s``. The counters are for the metrics."""

    __slots__ = (
        "_held",
        "_in_flight",
        "_limit",
        "_max_wait_s",
        "_max_waiting",
        "_per_holder",
        "_queues",
        "_waiting",
        "refused_full",
        "refused_timeout",
    )

    def __init__(
        self,
        limit: int,
        max_waiting: int,
        max_wait_s: float,
        per_holder: int | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"a concurrency limit is 1 or more, not {limit}")
        if max_waiting < 0:
            raise ValueError(f"max_waiting is 0 or more, not {max_waiting}")
        if not max_wait_s > 0:
            raise ValueError(f"max_wait_s is more than 0, not {max_wait_s}")
        if per_holder is not None and per_holder < 1:
            raise ValueError(f"per_holder is 1 or more, not {per_holder}")
        self._limit = limit
        self._max_waiting = max_waiting
        self._max_wait_s = max_wait_s
        self._per_holder = per_holder
        self._in_flight = 0
        self._held: dict[str, int] = {}  # holders with places, and how many
        # each holder's waiters, first come first; the holders in the order of their turn
        # (the one served last goes last), only those with waiters
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}
        self._waiting = 0
        self.refused_full = 0
        self.refused_timeout = 0

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def per_holder(self) -> int | None:
        return self._per_holder

    def __repr__(self) -> str:
        return (
            f"InFlightLimit(in_flight={self._in_flight}/{self._limit}, "
            f"waiting={self._waiting}/{self._max_waiting})"
        )

    @property
    def in_flight(self) -> int:
        """Places held (handed to a waiter whose task has not run yet included)."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        return self._waiting

    def held(self, holder: str) -> int:
        """Places ``holder`` holds."""
        return self._held.get(holder, 0)

    def _may_take(self, holder: str) -> bool:
        return self._per_holder is None or self._held.get(holder, 0) < self._per_holder

    async def acquire(self, holder: str) -> Ticket:
        """A place for ``holder``: at once when one is free to it, else once its turn
        comes. ``QueueFull`` at once when the queue is full, ``WaitedTooLong`` when its
        turn does not come within ``max_wait_s``."""
        # a place free to a holder under its cap means every waiter is held back by its
        # own holder's cap (a freed place goes to a waiter at once), so none is passed
        if self._in_flight < self._limit and self._may_take(holder):
            self._take(holder)
            return Ticket(self, holder)
        if self._waiting >= self._max_waiting:
            self.refused_full += 1
            raise QueueFull(self._waiting)
        loop = asyncio.get_running_loop()
        place: asyncio.Future[None] = loop.create_future()
        queue = self._queues.get(holder)
        if queue is None:
            queue = self._queues[holder] = deque()
        queue.append(place)
        self._waiting += 1
        timer = loop.call_later(self._max_wait_s, self._expire, holder, place, loop.time())
        try:
            await place
        except asyncio.CancelledError:
            self._abandon(holder, place)
            raise
        finally:
            timer.cancel()
        return Ticket(self, holder)

    def _take(self, holder: str) -> None:
        self._in_flight += 1
        self._held[holder] = self._held.get(holder, 0) + 1

    def _release(self, holder: str) -> None:
        self._in_flight -= 1
        left = self._held[holder] - 1
        if left:
            self._held[holder] = left
        else:
            del self._held[holder]
        self._hand_on()

    def _hand_on(self) -> None:
        """Free places to waiters, in turn, while there are both."""
        while self._in_flight < self._limit and self._serve_next():
            pass

    def _serve_next(self) -> bool:
        """One step of handing a free place on: the first holder in turn whose cap allows
        has its first waiter served (or its waiters cancelled meanwhile dropped). False when
        no waiter may take the place."""
        for holder, queue in self._queues.items():
            if not self._may_take(holder):
                continue
            # waiters whose tasks were cancelled leave their own queue when they run
            # again; those first in line are dropped here, keeping the holder's turn
            while queue and queue[0].done():
                queue.popleft()
                self._waiting -= 1
            # the dict changes below, so the loop over it ends here
            del self._queues[holder]
            if not queue:
                return True
            place = queue.popleft()
            self._waiting -= 1
            if queue:
                self._queues[holder] = queue  # its next waiter's turn comes after the others'
            self._take(holder)
            place.set_result(None)
            return True
        return False

    def _abandon(self, holder: str, place: asyncio.Future[None]) -> None:
        """A waiting task was cancelled: it leaves the queue, or gives on the place it was
        handed at the same moment."""
        if not place.done() or place.cancelled():
            place.cancel()
            queue = self._queues.get(holder)
            if queue is not None and place in queue:
                queue.remove(place)
                self._waiting -= 1
                if not queue:
                    del self._queues[holder]
        elif place.exception() is None:
            self._release(holder)

    def _expire(self, holder: str, place: asyncio.Future[None], since: float) -> None:
        """``max_wait_s`` passed: a waiter still waiting leaves the queue, refused."""
        if place.done():
            return  # served, or cancelled: its own task sees to it
        queue = self._queues[holder]
        queue.remove(place)
        self._waiting -= 1
        if not queue:
            del self._queues[holder]
        self.refused_timeout += 1
        place.set_exception(WaitedTooLong(asyncio.get_running_loop().time() - since))
