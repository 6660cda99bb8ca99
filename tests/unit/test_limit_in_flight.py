"""A concurrency limit (``limits/in_flight.py``): places taken and handed on, the bounded
queue, fairness between holders, a holder's own cap, waits that time out, and waiters
cancelled at any moment leaving no place and no waiter behind."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boundedcode_gateway.limits.in_flight import (
    InFlightLimit,
    QueueFull,
    Ticket,
    WaitedTooLong,
)

LONG_S = 5.0  # a wait no test reaches


async def turns(n: int = 5) -> None:
    """Let every task that can run, run."""
    for _ in range(n):
        await asyncio.sleep(0)


def waiter(limit: InFlightLimit, holder: str) -> asyncio.Task[Ticket]:
    return asyncio.get_running_loop().create_task(limit.acquire(holder))


async def served_in_order(
    limit: InFlightLimit, first: Ticket, waiters: list[tuple[str, asyncio.Task[Ticket]]]
) -> list[str]:
    """With one place: release it again and again; which waiter each release served."""
    order = []
    ticket = first
    pending = list(waiters)
    while pending:
        ticket.release()
        await turns()
        done = [(label, task) for label, task in pending if task.done()]
        assert len(done) == 1, f"one release served {[label for label, _ in done]}"
        order.append(done[0][0])
        pending.remove(done[0])
        ticket = done[0][1].result()
    ticket.release()
    return order


# -- places


@pytest.mark.parametrize(
    ("limit", "max_waiting", "max_wait_s", "per_holder"),
    [(0, 1, 1.0, None), (1, -1, 1.0, None), (1, 1, 0.0, None), (1, 1, 1.0, 0)],
)
def test_the_settings_are_checked(
    limit: int, max_waiting: int, max_wait_s: float, per_holder: int | None
) -> None:
    with pytest.raises(ValueError):
        InFlightLimit(limit, max_waiting, max_wait_s, per_holder)


async def test_a_free_place_is_taken_at_once_and_released_once() -> None:
    limit = InFlightLimit(2, 4, LONG_S)
    first = await limit.acquire("a")
    second = await limit.acquire("b")
    assert (limit.in_flight, limit.waiting, limit.held("a"), limit.held("b")) == (2, 0, 1, 1)
    first.release()
    first.release()
    assert (limit.in_flight, limit.held("a")) == (1, 0)
    with second:
        pass
    assert limit.in_flight == 0
    async with await limit.acquire("a"):
        assert limit.in_flight == 1
    assert limit.in_flight == 0


async def test_a_waiting_call_is_served_when_a_place_frees() -> None:
    limit = InFlightLimit(1, 4, LONG_S)
    held = await limit.acquire("a")
    waiting = waiter(limit, "b")
    await turns()
    assert not waiting.done()
    assert (limit.in_flight, limit.waiting) == (1, 1)
    held.release()
    # the place is the waiter's from the release, before its task runs again
    assert (limit.in_flight, limit.waiting, limit.held("b")) == (1, 0, 1)
    ticket = await waiting
    assert ticket.holder == "b"
    ticket.release()
    assert limit.in_flight == 0


async def test_the_queue_is_bounded() -> None:
    limit = InFlightLimit(1, 2, LONG_S)
    held = await limit.acquire("a")
    waiters = [waiter(limit, "a"), waiter(limit, "b")]
    await turns()
    with pytest.raises(QueueFull):
        await limit.acquire("c")
    assert (limit.refused_full, limit.waiting) == (1, 2)
    # a queue of none: a call finds a place or is refused
    none_wait = InFlightLimit(1, 0, LONG_S)
    async with await none_wait.acquire("a"):
        with pytest.raises(QueueFull):
            await none_wait.acquire("b")
    assert none_wait.refused_full == 1
    assert await served_in_order(limit, held, [("a", waiters[0]), ("b", waiters[1])]) == [
        "a",
        "b",
    ]
    assert (limit.in_flight, limit.waiting) == (0, 0)


# -- fairness


async def test_one_holders_burst_does_not_make_another_wait_behind_it() -> None:
    limit = InFlightLimit(1, 50, LONG_S)
    held = await limit.acquire("a")
    burst = [(f"a{i}", waiter(limit, "a")) for i in range(40)]
    await turns()
    single = ("b0", waiter(limit, "b"))
    await turns()
    order = await served_in_order(limit, held, [*burst, single])
    assert order[:3] == ["a0", "b0", "a1"]
    assert order[3:] == [f"a{i}" for i in range(2, 40)]


async def test_holders_with_waiters_are_served_in_turn_each_first_come_first() -> None:
    limit = InFlightLimit(1, 10, LONG_S)
    held = await limit.acquire("x")
    waiters = []
    for label in ("a0", "a1", "b0", "a2", "c0", "b1"):
        waiters.append((label, waiter(limit, label[0])))
        await turns()
    order = await served_in_order(limit, held, waiters)
    assert order == ["a0", "b0", "c0", "a1", "b1", "a2"]


# -- a holder's own cap


@dataclass
class Capped:
    """A limit of 2 with 1 a holder, checked at every step."""

    limit: InFlightLimit

    def check(self) -> None:
        assert self.limit.in_flight <= 2
        for holder in ("a", "b", "c"):
            assert self.limit.held(holder) <= 1, f"{holder} holds 2 of 2"


async def test_a_key_capped_at_one_of_two_places_never_holds_two() -> None:
    capped = Capped(InFlightLimit(2, 10, LONG_S, per_holder=1))
    limit = capped.limit
    first = await limit.acquire("a")
    capped.check()
    # a place is free, but not to "a"
    second = waiter(limit, "a")
    third = waiter(limit, "a")
    await turns()
    capped.check()
    assert (limit.in_flight, limit.waiting) == (1, 2)
    # the free place is another key's at once
    other = await limit.acquire("b")
    capped.check()
    other.release()
    capped.check()
    assert not second.done()
    first.release()
    capped.check()
    await turns()
    capped.check()
    assert second.done() and not third.done()
    (await second).release()
    capped.check()
    await turns()
    capped.check()
    (await third).release()
    capped.check()
    assert (limit.in_flight, limit.waiting) == (0, 0)


async def test_a_waiter_held_back_by_its_own_cap_lets_others_pass() -> None:
    capped = Capped(InFlightLimit(2, 10, LONG_S, per_holder=1))
    limit = capped.limit
    a = await limit.acquire("a")
    a_waiting = waiter(limit, "a")  # first in line, held back by its cap
    await turns()
    b = await limit.acquire("b")
    c_waiting = waiter(limit, "c")  # held back by the limit
    await turns()
    capped.check()
    b.release()
    capped.check()
    await turns()
    assert c_waiting.done() and not a_waiting.done()
    assert (limit.held("a"), limit.held("c")) == (1, 1)
    a.release()
    capped.check()
    await turns()
    assert a_waiting.done()
    (await a_waiting).release()
    (await c_waiting).release()
    assert (limit.in_flight, limit.waiting) == (0, 0)


# -- waits that end without a place


async def test_a_call_waits_no_longer_than_max_wait_s() -> None:
    limit = InFlightLimit(1, 4, 0.05)
    held = await limit.acquire("a")
    with pytest.raises(WaitedTooLong) as caught:
        await limit.acquire("b")
    assert 0.04 <= caught.value.waited_s < 1.0
    assert (limit.refused_timeout, limit.waiting, limit.in_flight) == (1, 0, 1)
    later = waiter(limit, "c")
    await turns()
    held.release()
    # the place goes to the waiter still there, not to the one that left
    assert (limit.held("b"), limit.held("c")) == (0, 1)
    (await later).release()
    assert (limit.in_flight, limit.waiting, limit.refused_timeout) == (0, 0, 1)


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    limit = InFlightLimit(1, 4, LONG_S)
    held = await limit.acquire("a")
    gone = waiter(limit, "b")
    await turns()
    gone.cancel()
    await turns()
    assert gone.cancelled()
    assert (limit.in_flight, limit.waiting) == (1, 0)
    held.release()
    assert (limit.in_flight, limit.waiting) == (0, 0)


async def test_a_place_handed_to_a_waiter_cancelled_at_that_moment_goes_to_the_next() -> None:
    limit = InFlightLimit(1, 4, LONG_S)
    held = await limit.acquire("a")
    gone = waiter(limit, "b")
    await turns()
    next_one = waiter(limit, "c")
    await turns()
    held.release()  # the place is handed to "b" ...
    gone.cancel()  # ... whose task is cancelled before it runs again
    await turns()
    assert gone.cancelled()
    assert next_one.done()
    assert (limit.in_flight, limit.waiting, limit.held("b"), limit.held("c")) == (1, 0, 0, 1)
    (await next_one).release()
    assert limit.in_flight == 0


async def test_a_cancelled_waiter_first_in_line_is_passed_over_at_once() -> None:
    limit = InFlightLimit(1, 4, LONG_S)
    held = await limit.acquire("a")
    gone = waiter(limit, "b")
    await turns()
    next_one = waiter(limit, "b")
    await turns()
    gone.cancel()  # its task has not run since: it is still first in line
    held.release()
    await turns()
    assert gone.cancelled() and next_one.done()
    (await next_one).release()
    assert (limit.in_flight, limit.waiting) == (0, 0)


# -- any interleaving


@dataclass(frozen=True)
class Call:
    holder: str
    start_after: int  # turns of the event loop before it asks
    hold: int  # turns it holds its place
    sleep_s: float  # and seconds
    cancel_after: int | None  # turns after its start when it is cancelled, waiting or not


CALLS = st.builds(
    Call,
    st.sampled_from("abcd"),
    st.integers(0, 6),
    st.integers(0, 6),
    st.sampled_from([0.0, 0.0, 0.0, 0.002]),
    st.none() | st.integers(0, 8),
)


async def run_calls(
    places: int, max_waiting: int, max_wait_s: float, per_holder: int | None, calls: list[Call]
) -> None:
    limit = InFlightLimit(places, max_waiting, max_wait_s, per_holder)

    def check() -> None:
        assert 0 <= limit.in_flight <= places
        assert 0 <= limit.waiting <= max_waiting
        if per_holder is not None:
            assert all(limit.held(h) <= per_holder for h in "abcd")
        assert sum(limit.held(h) for h in "abcd") == limit.in_flight

    async def call(c: Call) -> None:
        await turns(c.start_after)
        check()
        try:
            ticket = await limit.acquire(c.holder)
        except (QueueFull, WaitedTooLong):
            check()
            return
        with ticket:
            check()
            await turns(c.hold)
            if c.sleep_s:
                await asyncio.sleep(c.sleep_s)
            check()
        check()

    async def cancel(task: asyncio.Task[None], after: int) -> None:
        await turns(after)
        task.cancel()
        check()

    tasks = [asyncio.create_task(call(c)) for c in calls]
    cancellers = [
        asyncio.create_task(cancel(task, c.start_after + c.cancel_after))
        for task, c in zip(tasks, calls, strict=True)
        if c.cancel_after is not None
    ]
    # a waiter left behind would wait out max_wait_s: the scenario would not end in time
    async with asyncio.timeout(2.0):
        ended = await asyncio.gather(*tasks, *cancellers, return_exceptions=True)
    failed = [e for e in ended if e is not None and not isinstance(e, asyncio.CancelledError)]
    assert not failed, failed  # a check that failed inside a call
    check()
    assert (limit.in_flight, limit.waiting) == (0, 0)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(0, 6),
    st.sampled_from([0.001, 0.01, LONG_S]),
    st.none() | st.integers(1, 2),
    st.lists(CALLS, min_size=1, max_size=25),
)
def test_no_interleaving_of_calls_cancels_and_timeouts_leaks_a_place_or_a_waiter(
    places: int, max_waiting: int, max_wait_s: float, per_holder: int | None, calls: list[Call]
) -> None:
    asyncio.run(run_calls(places, max_waiting, max_wait_s, per_holder, calls))
