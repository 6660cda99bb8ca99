"""The record bus: each record published once, to the writer, the counters and the views,
each view from a bounded queue of its own drained off the publisher's way."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest

from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.metering.bus import RecordBus
from boundedcode_gateway.metering.calllog import read_calls
from boundedcode_gateway.metering.meter import Meter
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.metering.writer import MeterWriter
from tests.unit.test_metering import make_record


class Durable:
    """A writer stand-in: keeps what it is handed, flushes at once."""

    def __init__(self) -> None:
        self.records: list[str] = []
        self.flushed = 0

    def submit(self, record: CallRecord) -> Future[None] | None:
        self.records.append(record.call_id)
        return None

    def flush(self, timeout: float = 5.0) -> bool:
        self.flushed += 1
        return True


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.001)


async def test_each_subscriber_sees_every_record_once_in_the_order_published() -> None:
    durable = Durable()
    bus = RecordBus(durable)
    counted: list[str] = []
    first: list[str] = []
    second: list[str] = []
    bus.count("counter", lambda r: counted.append(r.call_id))
    bus.subscribe("first", lambda r: first.append(r.call_id))
    bus.start()
    bus.subscribe("second", lambda r: second.append(r.call_id))  # after the start too
    await asyncio.sleep(0)
    ids = [f"call-{i:05d}" for i in range(50)]
    for i in range(50):
        bus.publish(make_record(i))
    assert counted == ids  # in publish itself: before any later call is admitted
    assert durable.records == ids
    assert first == second == []  # the views: once publish has returned, off its way
    await until(lambda: len(first) == len(second) == 50)
    assert first == second == ids
    await bus.close()


async def test_a_slow_view_holds_up_neither_publish_nor_the_others() -> None:
    bus = RecordBus(Durable())
    gate = asyncio.Event()
    slow: list[str] = []
    fast: list[str] = []

    async def slow_view(record: CallRecord) -> None:
        await gate.wait()
        slow.append(record.call_id)

    async def fast_view(record: CallRecord) -> None:
        fast_too.append(record.call_id)

    fast_too: list[str] = []
    bus.subscribe("slow", slow_view)
    bus.subscribe("fast", lambda r: fast.append(r.call_id))
    bus.subscribe("fast too", fast_view)
    bus.start()
    began = time.monotonic()
    for i in range(3):
        bus.publish(make_record(i))
    assert time.monotonic() - began < 0.5
    await until(lambda: len(fast) == len(fast_too) == 3)
    assert slow == []
    gate.set()
    await until(lambda: len(slow) == 3)
    assert slow == fast == fast_too
    await bus.close()


async def test_a_full_view_drops_for_itself_alone_and_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    durable = Durable()
    bus = RecordBus(durable)
    counted: list[str] = []
    small: list[str] = []
    large: list[str] = []
    bus.count("counter", lambda r: counted.append(r.call_id))
    bus.subscribe("small", lambda r: small.append(r.call_id), bound=2)
    bus.subscribe("large", lambda r: large.append(r.call_id))
    for i in range(5):  # not started: the queues fill
        bus.publish(make_record(i))
    assert bus.dropped == 3
    assert caplog.text.count("not shown to small: its queue is full") == 1
    assert len(counted) == len(durable.records) == 5  # lose nothing
    bus.start()
    await until(lambda: len(large) == 5)
    await until(lambda: len(small) == 2)
    assert small == ["call-00000", "call-00001"]  # the first, in order
    await bus.close()


async def test_close_lets_every_view_handle_what_is_queued() -> None:
    durable = Durable()
    bus = RecordBus(durable)
    seen: list[str] = []
    bus.subscribe("view", lambda r: seen.append(r.call_id))
    bus.start()
    for i in range(100):
        bus.publish(make_record(i))
    await bus.close()
    assert seen == [f"call-{i:05d}" for i in range(100)]
    bus.publish(make_record(100))  # after close: the writer still, the views no more
    await asyncio.sleep(0.01)
    assert len(seen) == 100 and len(durable.records) == 101


async def test_a_failing_subscriber_is_logged_and_the_record_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    durable = Durable()
    bus = RecordBus(durable)
    after: list[str] = []

    def broken(record: CallRecord) -> None:
        raise ValueError("no")

    bus.count("broken counter", broken)
    bus.subscribe("broken view", broken)
    bus.subscribe("after", lambda r: after.append(r.call_id))
    bus.start()
    with caplog.at_level(logging.ERROR):
        bus.publish(make_record(0))
        bus.publish(make_record(1))
        await until(lambda: len(after) == 2)
        await bus.close()
    assert durable.records == ["call-00000", "call-00001"]
    assert "broken counter, a subscriber of call records, failed on call-00000" in caplog.text
    assert "broken view, a subscriber of call records, failed on call-00001" in caplog.text


async def test_flush_waits_for_the_views_then_the_writer() -> None:
    durable = Durable()
    bus = RecordBus(durable)
    gate = threading.Event()
    seen: list[str] = []

    def view(record: CallRecord) -> None:
        seen.append(record.call_id)

    async def held(record: CallRecord) -> None:
        while not gate.is_set():
            await asyncio.sleep(0.001)

    bus.subscribe("view", view)
    bus.subscribe("held", held)
    bus.start()
    bus.publish(make_record(0))
    assert not await asyncio.to_thread(bus.flush, 0.05)  # "held" has not handled it
    gate.set()
    assert await asyncio.to_thread(bus.flush, 5.0)
    assert seen == ["call-00000"] and durable.flushed == 1
    await bus.close()


async def test_a_record_published_from_another_thread_reaches_the_views() -> None:
    bus = RecordBus(Durable())
    seen: list[str] = []
    bus.subscribe("view", lambda r: seen.append(r.call_id))
    bus.start()
    await asyncio.to_thread(bus.publish, make_record(0))
    await until(lambda: seen == ["call-00000"])
    await bus.close()


async def test_a_sync_meter_waits_for_its_record_to_be_written(tmp_path: Path) -> None:
    writer = MeterWriter(tmp_path / "calls.jsonl", tmp_path / "ledger.db", sync=True)
    bus = RecordBus(writer)
    bus.start()
    writer.start()
    try:
        meter = Meter(bus, CallContext.new("task-a", "agent_turn"), "local")
        meter.ok()
        await meter.recorded()
        [logged] = read_calls(tmp_path / "calls.jsonl")
        assert logged["call_id"] == meter.record.call_id
    finally:
        await bus.close()
        writer.close()
