"""The page's event fan-out: bounded per viewer, oldest dropped and counted, nothing
encoded without a viewer, and the calls in flight for one that connects late."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.ui.events import CallEvents


def record(call_id: str) -> CallRecord:
    return CallRecord(call_id, "2026-01-01T00:00:00.000Z", "t", "p", "m", status="ok")


def decoded(raw: bytes) -> tuple[str, object]:
    head, data = raw.rstrip(b"\n").split(b"\n")
    assert head.startswith(b"event: ") and data.startswith(b"data: ")
    return head[7:].decode(), orjson.loads(data[6:])


def test_a_viewer_is_first_shown_the_calls_in_flight() -> None:
    events = CallEvents()
    events.started("c1", "t", "agent_turn", "local", True)
    events.progress("c1", 64, 1000, 0)
    viewer = events.join()
    assert viewer is not None
    kind, data = decoded(next(viewer.take()))
    assert kind == "in_flight"
    assert data == {
        "calls": [
            {
                "call_id": "c1",
                "task": "t",
                "purpose": "agent_turn",
                "model": "local",
                "stream": True,
                "started": events.in_flight[0]["started"],
                "progress": {"processed": 64, "total": 1000, "cache": 0},
            }
        ]
    }


def test_events_in_order_and_the_call_leaves_when_finished() -> None:
    events = CallEvents()
    viewer = events.join()
    assert viewer is not None
    events.started("c1", "t", "p", "m", True)
    events.progress("c1", 10, 20, 5)
    events.first_token("c1", 12.5)
    events.streaming("c1", 7, 300.0)
    events.finished(record("c1"))
    kinds = [decoded(raw)[0] for raw in viewer.take()]
    assert kinds == ["in_flight", "started", "progress", "first_token", "streaming", "finished"]
    assert events.in_flight == []


def test_news_of_an_unknown_call_is_ignored() -> None:
    events = CallEvents()
    viewer = events.join()
    assert viewer is not None
    events.progress("nope", 1, 2, 0)
    events.first_token("nope", 1.0)
    events.streaming("nope", 1, 1.0)
    assert len(list(viewer.take())) == 1  # only the in-flight snapshot


def test_a_viewer_that_does_not_read_loses_the_oldest_and_they_are_counted() -> None:
    events = CallEvents(viewer_limit=4)
    slow = events.join()
    assert slow is not None
    for i in range(10):
        events.started(f"c{i}", "t", "p", "m", False)
    assert len(slow.queue) == 4 and slow.dropped == 7  # the snapshot and six calls
    assert [decoded(raw)[1]["call_id"] for raw in slow.take()] == ["c6", "c7", "c8", "c9"]  # type: ignore[index]
    events.leave(slow)
    assert events.dropped == 7 and events.viewers == 0


def test_without_a_viewer_nothing_is_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    import boundedcode_gateway.ui.events as module

    def must_not_encode(kind: str, data: object) -> bytes:
        raise AssertionError("encoded with no viewer")

    monkeypatch.setattr(module, "_event", must_not_encode)
    events = CallEvents()
    events.started("c1", "t", "p", "m", True)
    events.progress("c1", 1, 2, 0)
    events.first_token("c1", 1.0)
    events.finished(record("c1"))
    assert events.in_flight == []


def test_viewers_are_limited() -> None:
    events = CallEvents(max_viewers=2)
    assert events.join() is not None and events.join() is not None
    assert events.join() is None


async def test_a_waiting_viewer_wakes_for_an_event_or_when_closed() -> None:
    events = CallEvents()
    viewer = events.join()
    assert viewer is not None
    list(viewer.take())
    assert await viewer.wait(0.01) is False
    waiting = asyncio.ensure_future(viewer.wait(5))
    await asyncio.sleep(0)
    events.started("c1", "t", "p", "m", True)
    assert await waiting is True
    list(viewer.take())
    waiting = asyncio.ensure_future(viewer.wait(5))
    await asyncio.sleep(0)
    viewer.close()
    assert await waiting is True and viewer.closed


def test_a_recheck_ends_the_viewers_no_longer_admitted() -> None:
    events = CallEvents()
    keys = {"kept": True, "removed": True}
    kept = events.join(lambda: keys["kept"])
    removed = events.join(lambda: keys["removed"])
    unchecked = events.join()
    assert kept is not None and removed is not None and unchecked is not None
    events.recheck_viewers()
    assert not (kept.closed or removed.closed or unchecked.closed)
    keys["removed"] = False
    events.recheck_viewers()
    assert removed.closed and not kept.closed and not unchecked.closed

    async def woken() -> bool:
        return await removed.wait(60)

    # the stream's writer, waiting for events, stops waiting at once
    assert asyncio.run(asyncio.wait_for(woken(), 1))
