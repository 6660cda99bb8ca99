"""The record bus: each call's record is published once, to every subscriber.

Three kinds of subscriber, by what a record is to them:

- the writer (``durable``): the record must reach the call log and the ledger. It is
  handed the record in ``publish`` and queues it itself (``writer.py``: its bounded queue,
  its thread, its overflow and the ledger's backlog); the future it gives back is what a
  ``metering.sync`` answer waits on. It is handed the record last, so every other
  subscriber has seen a record before it can be durable.
- a counter (``count``): state the admission of the next call reads (the budgets). It is
  called in ``publish``, so a record is counted before any later call is admitted; it
  must be cheap and never wait.
- a view (``subscribe``): the page of calls, the metrics, the failure log. Each has a
  bounded queue of its own, drained on the event loop after ``publish`` returns, in the
  order published; a view that fails holds up neither ``publish`` nor the others. A
  coroutine view has a task of its own, so one that waits holds up no other; plain
  functions are drained together, once per turn of the loop (a task each would cost
  more than they do). A full queue drops the record for that view alone, counted in
  ``dropped``.

Every subscriber sees every record, also those the writer drops or does not keep
(metering off). ``publish`` never blocks and never raises; it may be called from another
thread than the loop's (the view is then woken through the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Protocol

from boundedcode_gateway.metering.records import CallRecord

logger = logging.getLogger(__name__)

# records a view may have waiting before it drops
VIEW_QUEUE_RECORDS = 10_000
# how often ``flush`` looks whether the views have caught up
FLUSH_POLL_S = 0.001
# under sustained overload every record drops; log the first drop and then every Nth
DROP_LOG_EVERY = 1000

Handler = Callable[[CallRecord], Awaitable[None] | None]


class DurableSink(Protocol):
    """What the bus needs of the writer: a hand-off that never blocks, and a flush."""

    def submit(self, record: CallRecord) -> Future[None] | None: ...

    def flush(self, timeout: float = 5.0) -> bool: ...


class RecordSink(Protocol):
    """Where a meter sends its call's record: done once the record is durable, with
    ``metering.sync`` (None otherwise)."""

    def publish(self, record: CallRecord) -> Future[None] | None: ...


def _failed(subscriber: str, record: CallRecord) -> None:
    """A subscriber that raised: logged; the record still goes to the others."""
    logger.exception("%s, a subscriber of call records, failed on %s", subscriber, record.call_id)


class _View:
    """One view's queue, and how far its handler has got."""

    def __init__(self, name: str, handler: Handler, bound: int) -> None:
        self.name = name
        self.handler = handler
        self.bound = bound
        # a coroutine view is drained by a task of its own, woken by `wake`
        self.waits = inspect.iscoroutinefunction(handler)
        self.dropped = 0
        self.offered = 0  # records put on the queue
        # records the handler has finished with (the loop's alone to write)
        self.handled = 0
        self._queue: deque[CallRecord] = deque()
        self._wake = asyncio.Event()
        self._closing = False

    def offer(self, record: CallRecord) -> bool:
        """Queue the record; False when the queue is full (the record is not queued)."""
        if len(self._queue) >= self.bound:
            self.dropped += 1
            return False
        self._queue.append(record)
        self.offered += 1
        return True

    def wake(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._closing = True
        self._wake.set()

    def drain_now(self) -> None:
        """Hand a plain function every record queued, in order."""
        handled = 0
        while self._queue:
            record = self._queue.popleft()
            try:
                self.handler(record)
            except Exception:
                _failed(self.name, record)
            handled += 1
        self.handled += handled

    async def drain(self) -> None:
        """Hand a coroutine each record, in order, until closed and empty."""
        while True:
            while self._queue:
                record = self._queue.popleft()
                try:
                    done = self.handler(record)
                    if done is not None:
                        await done
                except Exception:
                    _failed(self.name, record)
                self.handled += 1
            if self._closing:
                return
            self._wake.clear()
            await self._wake.wait()


class RecordBus:
    """Publishes each call record to the writer, the counters and the views."""

    def __init__(self, durable: DurableSink | None = None) -> None:
        self._durable = durable
        self._counters: tuple[tuple[str, Callable[[CallRecord], None]], ...] = ()
        self._views: tuple[_View, ...] = ()
        self._plain: tuple[_View, ...] = ()  # the views drained together
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._scheduled = False  # a drain of the plain views is on the loop's way
        self._closed = False

    def count(self, name: str, counter: Callable[[CallRecord], None]) -> None:
        """Call ``counter`` with each record as it is published (cheap, never waits)."""
        self._counters = (*self._counters, (name, counter))

    def subscribe(self, name: str, handler: Handler, bound: int = VIEW_QUEUE_RECORDS) -> None:
        """Hand each record to ``handler`` from a queue of its own (``bound`` records)."""
        view = _View(name, handler, bound)
        self._views = (*self._views, view)
        if not view.waits:
            self._plain = (*self._plain, view)
        elif self._loop is not None:
            self._tasks.append(self._loop.create_task(view.drain()))

    @property
    def dropped(self) -> int:
        """Records a view's full queue refused, all views together."""
        return sum(v.dropped for v in self._views)

    def start(self) -> None:
        """Start draining the views on the running loop; what was published before waits
        for it. Starting twice is harmless."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._tasks = [self._loop.create_task(v.drain()) for v in self._views if v.waits]
        self._scheduled = True
        self._loop.call_soon(self._drain_plain)

    def publish(self, record: CallRecord) -> Future[None] | None:
        """Hand the record to every subscriber; never blocks, never raises. The writer's
        future: done once the record is written, with ``metering.sync``."""
        for name, counter in self._counters:
            try:
                counter(record)
            except Exception:
                _failed(name, record)
        if not self._closed:
            for view in self._views:
                self._offer(view, record)
        return self._durable.submit(record) if self._durable is not None else None

    def _offer(self, view: _View, record: CallRecord) -> None:
        if not view.offer(record):
            self._log_drop(view, record)
            return
        if self._loop is None:
            return  # drained once started
        if view.waits:
            self._on_loop(view.wake)
        elif not self._scheduled:
            self._scheduled = True
            self._on_loop(self._drain_plain)

    def _on_loop(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        assert loop is not None
        if threading.get_ident() == self._loop_thread:
            loop.call_soon(callback)
            return
        # a closed loop drains nothing any more: the record stays queued
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback)

    def _drain_plain(self) -> None:
        self._scheduled = False
        for view in self._plain:
            view.drain_now()

    def _log_drop(self, view: _View, record: CallRecord) -> None:
        if view.dropped == 1 or view.dropped % DROP_LOG_EVERY == 0:
            logger.warning(
                "call record %s not shown to %s: its queue is full (%d dropped so far)",
                record.call_id,
                view.name,
                view.dropped,
            )

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every view has handled, and the writer written, every record published
        so far; False on timeout. Not from the loop's own thread, which drains the views."""
        deadline = time.monotonic() + timeout
        targets = [(v, v.offered) for v in self._views]
        # polled: a lock taken per record handled would cost every call, for the tests
        while not all(v.handled >= n for v, n in targets):
            if self._loop is None or time.monotonic() >= deadline:
                return False
            time.sleep(FLUSH_POLL_S)
        if self._durable is None:
            return True
        return self._durable.flush(max(0.0, deadline - time.monotonic()))

    async def close(self) -> None:
        """Let each view handle what is queued, then stop; later records go to the
        counters and the writer only."""
        self._closed = True
        self._drain_plain()
        for view in self._views:
            view.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
