"""What the page of calls is told as calls happen: a call started, read more of its prompt,
wrote its first token, streamed on, finished.

The request path only hands values over (``started``, ``progress``, ``first_token``,
``streaming``, ``finished``): each event is encoded once and put on every viewer's
queue. A viewer's queue is bounded; when it is full the oldest event goes and the
viewer's drop count grows, so a viewer that reads slowly, or not at all, costs the
calls one append each and never a wait. With no viewer an event is not even encoded;
only the table of calls in flight is kept, for a viewer that connects later.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from boundedcode_gateway.metering.records import CallRecord

# events a viewer may be behind by before the oldest are dropped
VIEWER_QUEUE_EVENTS = 512
# at most this many viewers at once (each holds a connection and a queue)
MAX_VIEWERS = 32
# a streaming call tells how far it got at most this often
STREAMING_EVERY_S = 0.5


class Viewer:
    """One connected page: its queue of encoded events and what it missed."""

    __slots__ = ("_wake", "admitted", "closed", "dropped", "queue")

    def __init__(self, limit: int, admitted: Callable[[], bool] | None = None) -> None:
        self.queue: deque[bytes] = deque(maxlen=limit)
        self.dropped = 0
        self.closed = False
        # whether the credential that opened the stream would open it now (None: always)
        self.admitted = admitted
        self._wake = asyncio.Event()

    def close(self) -> None:
        """The viewer left: whoever waits for its events stops waiting."""
        self.closed = True
        self._wake.set()

    def put(self, event: bytes) -> None:
        queue = self.queue
        if len(queue) == queue.maxlen:
            self.dropped += 1  # the deque lets the oldest go
        queue.append(event)
        self._wake.set()

    async def wait(self, timeout_s: float) -> bool:
        """Until an event is queued or the viewer left (True), or ``timeout_s`` passes."""
        if self.queue or self.closed:
            return True
        self._wake.clear()
        try:
            async with asyncio.timeout(timeout_s):
                await self._wake.wait()
        except TimeoutError:
            return False
        return True

    def take(self) -> Iterator[bytes]:
        queue = self.queue
        while queue:
            yield queue.popleft()


class CallEvents:
    """The calls in flight, and the viewers to tell about them."""

    def __init__(self, viewer_limit: int = VIEWER_QUEUE_EVENTS, max_viewers: int = MAX_VIEWERS):
        self._viewer_limit = viewer_limit
        self._max_viewers = max_viewers
        self._viewers: list[Viewer] = []
        # call id → what a viewer that connects now is shown of it
        self._in_flight: dict[str, dict[str, Any]] = {}
        # events the viewers that left had missed, added to the live ones' count
        self._dropped_before = 0

    # -- the request path

    def started(self, call_id: str, task: str, purpose: str, model: str, stream: bool) -> None:
        call = {
            "call_id": call_id,
            "task": task,
            "purpose": purpose,
            "model": model,
            "stream": stream,
            "started": time.time(),
        }
        self._in_flight[call_id] = call
        if self._viewers:
            self._tell("started", call)

    def progress(self, call_id: str, processed: int, total: int, cache: int) -> None:
        """How much of its prompt the server has read (llama.cpp's ``prompt_progress``)."""
        call = self._in_flight.get(call_id)
        if call is None:
            return
        call["progress"] = {"processed": processed, "total": total, "cache": cache}
        if self._viewers:
            self._tell("progress", {"call_id": call_id, **call["progress"]})

    def first_token(self, call_id: str, ttft_ms: float) -> None:
        call = self._in_flight.get(call_id)
        if call is None:
            return
        call["ttft_ms"] = ttft_ms
        if self._viewers:
            self._tell("first_token", {"call_id": call_id, "ttft_ms": ttft_ms})

    def streaming(self, call_id: str, chunks: int, elapsed_ms: float) -> None:
        """How many chunks of the answer have gone to the caller so far."""
        call = self._in_flight.get(call_id)
        if call is None:
            return
        call["chunks"] = chunks
        if self._viewers:
            self._tell("streaming", {"call_id": call_id, "chunks": chunks, "at_ms": elapsed_ms})

    def finished(self, record: CallRecord) -> None:
        """A call's record, as published (a view of the record bus: cheap, never raises)."""
        self._in_flight.pop(record.call_id, None)
        if self._viewers:
            # orjson writes the dataclass itself: no dict copied per record
            self._tell("finished", record)

    # -- the viewers

    @property
    def in_flight(self) -> list[dict[str, Any]]:
        return list(self._in_flight.values())

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    @property
    def dropped(self) -> int:
        """Events dropped for viewers too slow to read them, since the start."""
        return self._dropped_before + sum(v.dropped for v in self._viewers)

    def join(self, admitted: Callable[[], bool] | None = None) -> Viewer | None:
        """A new viewer, first told of the calls in flight; None when there are enough.
        ``admitted``: asked again by ``recheck_viewers``, the viewer ended when it says no."""
        if len(self._viewers) >= self._max_viewers:
            return None
        viewer = Viewer(self._viewer_limit, admitted)
        viewer.put(_event("in_flight", {"calls": self.in_flight}))
        self._viewers.append(viewer)
        return viewer

    def close_viewers(self) -> None:
        """End every viewer's stream: the gateway is stopping, and an open page would
        otherwise hold its shutdown until the grace period ran out."""
        for viewer in self._viewers:
            viewer.close()

    def recheck_viewers(self) -> None:
        """End the stream of every viewer no longer let in (a reload removed its key, made
        it an ordinary one, or turned the page off): the stream has no end of its own, so
        a key taken away must not go on watching through one opened before."""
        for viewer in self._viewers:
            if viewer.admitted is not None and not viewer.admitted():
                viewer.close()

    def leave(self, viewer: Viewer) -> None:
        if viewer in self._viewers:
            self._viewers.remove(viewer)
            self._dropped_before += viewer.dropped

    def _tell(self, kind: str, data: dict[str, Any] | CallRecord) -> None:
        event = _event(kind, data)
        for viewer in self._viewers:
            viewer.put(event)


def _event(kind: str, data: dict[str, Any] | CallRecord) -> bytes:
    """One Server-Sent Event, its kind in ``event:`` and its data one line of JSON."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
