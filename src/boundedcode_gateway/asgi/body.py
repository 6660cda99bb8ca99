"""A request body's JSON parsed: small bodies at once, large ones off the loop within a budget.

A body of tiny JSON values (``[[],[],…]``) costs some 25 times its size in memory
once parsed, and the parse itself a second or more for the largest body the
gateway takes. Bodies above ``OFF_LOOP_BYTES`` are parsed in a worker thread
(orjson reads the bytes without the GIL and builds the objects with it, so the
loop is held up for the building only), and at most ``budget_bytes`` of them are
parsed at once: a large body arriving while the budget is spent waits for it.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import orjson

from boundedcode_gateway.errors import InvalidRequest

# bodies up to this size parse on the loop: a millisecond or two at worst
OFF_LOOP_BYTES = 1024 * 1024


def parse_json(raw: bytes) -> Any:
    """The body's JSON value, or a 400 ``invalid_json``."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # OpenAI's words, then where the parser stopped
        raise InvalidRequest(
            "We could not parse the JSON body of your request: what was sent was not valid "
            f"JSON ({exc}).",
            code="invalid_json",
        ) from None


_gc_lock = threading.Lock()
_gc_pauses = 0  # parses running with the collector paused
_gc_was_enabled = False


def _parse_without_gc(raw: bytes) -> Any:
    """``parse_json`` with the cycle collector paused: building millions of containers
    otherwise sets off full collections over all of them, each holding the GIL (a third of
    the time of a body of ``[[],[],…]`` without them; the loop waits on every one)."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        return parse_json(raw)
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


class BodyParser:
    """Parses request bodies; owns the parse budget and the thread large bodies parse in.

    The budget is a semaphore counted in bytes, first come first served: a large body
    waits until every body ahead of it has its share.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._available = budget_bytes
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._executor: ThreadPoolExecutor | None = None

    @property
    def parsing_bytes(self) -> int:
        """Bytes of large bodies being parsed (or granted a share to be) now."""
        return self.budget_bytes - self._available

    async def parse(self, raw: bytes) -> Any:
        if len(raw) <= OFF_LOOP_BYTES:
            return parse_json(raw)
        # a body larger than the whole budget takes all of it
        size = min(len(raw), self.budget_bytes)
        await self._take(size)
        loop = asyncio.get_running_loop()
        try:
            job: Future[Any] = self._pool().submit(_parse_without_gc, raw)
        except BaseException:
            self._give_back(size)
            raise
        # the share comes back when the parse ends, not when a caller that left stops
        # waiting for it: the thread holds the memory until then
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._give_back, size))
        return await asyncio.wrap_future(job)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def _take(self, size: int) -> None:
        if not self._waiting and self._available >= size:
            self._available -= size
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((size, granted))
        try:
            await granted
        except asyncio.CancelledError:
            granted_anyway = granted.done() and not granted.cancelled()
            # granted as the caller left: its share back; else those behind it may go on
            self._give_back(size if granted_anyway else 0)
            raise

    def _give_back(self, size: int) -> None:
        self._available += size
        while self._waiting:
            wanted, granted = self._waiting[0]
            if granted.done():  # its caller left while it waited
                self._waiting.popleft()
                continue
            if wanted > self._available:
                return
            self._waiting.popleft()
            self._available -= wanted
            granted.set_result(None)

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="body-parser")
        return self._executor
