"""Sliding-window counters (``limits/windows.py``): the estimate, admission and its
``Retry-After``, the windows rolling, a reservation settled, and the bounds the module's
docstring proves, over any sequence of calls."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boundedcode_gateway.limits.windows import (
    Admission,
    WindowCount,
    WindowLimit,
    admit,
    rolled,
    settle,
    used,
)

TEN_A_MINUTE = WindowLimit(10, 60.0)
TICK = 1e-6


# -- the limit


@pytest.mark.parametrize(
    ("limit", "window_s"),
    [(0, 60.0), (-1, 60.0), (10, 0.0), (10, -1.0), (10, math.inf), (10, math.nan)],
)
def test_a_limit_is_one_or_more_in_a_window_of_some_length(limit: int, window_s: float) -> None:
    with pytest.raises(ValueError):
        WindowLimit(limit, window_s)


# -- the estimate and the windows rolling


def test_the_previous_window_weighs_what_the_sliding_window_still_overlaps() -> None:
    state = WindowCount(start=60.0, current=2, previous=10)
    assert used(state, TEN_A_MINUTE, 60.0) == 12.0
    assert used(state, TEN_A_MINUTE, 75.0) == 7.5 + 2
    assert used(state, TEN_A_MINUTE, 105.0) == 2.5 + 2


def test_one_window_on_the_current_count_becomes_the_previous() -> None:
    state = WindowCount(start=60.0, current=4, previous=9)
    assert rolled(state, TEN_A_MINUTE, 130.0) == WindowCount(120.0, 0, 4)
    assert used(state, TEN_A_MINUTE, 135.0) == 4 * 0.75


def test_two_windows_on_nothing_is_left() -> None:
    state = WindowCount(start=60.0, current=4, previous=9)
    assert rolled(state, TEN_A_MINUTE, 180.0) == WindowCount(180.0, 0, 0)
    assert used(state, TEN_A_MINUTE, 1e6) == 0.0


def test_a_clock_stepped_back_counts_in_the_current_window_and_loses_nothing() -> None:
    state = WindowCount(start=60.0, current=5, previous=4)
    assert rolled(state, TEN_A_MINUTE, 10.0) is state
    # as if no time had passed since the window began: the previous window at full weight
    assert used(state, TEN_A_MINUTE, 10.0) == 9.0
    after = admit(state, TEN_A_MINUTE, 10.0, 1)
    assert after.allowed
    assert after.state == WindowCount(60.0, 6, 4)
    assert not admit(after.state, TEN_A_MINUTE, 10.0, 1).allowed


def test_a_window_of_a_fraction_of_a_second() -> None:
    limit = WindowLimit(3, 0.1)
    state = admit(WindowCount(), limit, 0.31, 3).state
    assert state.start == pytest.approx(0.3)
    assert state.current == 3
    assert not admit(state, limit, 0.35, 1).allowed
    # the next window, 60% in: 3 * 0.4 = 1.2 used
    assert admit(state, limit, 0.46, 1).allowed


# -- admission and Retry-After


def test_an_amount_that_fits_is_counted_in_the_current_window() -> None:
    verdict = admit(WindowCount(start=60.0, previous=10), TEN_A_MINUTE, 75.0, 2)
    assert verdict == Admission(True, WindowCount(60.0, 2, 10), None)
    assert verdict.retry_after_header is None


def test_a_refused_amount_waits_for_the_previous_window_to_weigh_less() -> None:
    state = WindowCount(start=60.0, previous=10)
    verdict = admit(state, TEN_A_MINUTE, 75.0, 3)  # 7.5 used, 3 more is 10.5
    assert not verdict.allowed
    assert verdict.state is state
    # at 78 s the previous window weighs 0.7: 7 + 3 fits
    assert verdict.retry_after_s == pytest.approx(3.0)
    assert verdict.retry_after_header == "3"
    assert admit(state, TEN_A_MINUTE, 78.0, 3).allowed


def test_a_full_window_waits_into_the_next_one() -> None:
    state = admit(WindowCount(), TEN_A_MINUTE, 30.0, 10).state
    verdict = admit(state, TEN_A_MINUTE, 45.0, 1)
    # nothing frees in this window; in the next one its 10 weigh 9 at 66 s
    assert verdict.retry_after_s == pytest.approx(21.0)
    assert verdict.retry_after_header == "21"


def test_an_amount_over_the_limit_by_itself_never_fits() -> None:
    verdict = admit(WindowCount(), TEN_A_MINUTE, 0.0, 11)
    assert (verdict.allowed, verdict.retry_after_s, verdict.retry_after_header) == (
        False,
        None,
        None,
    )


def test_nothing_more_fits_a_window_already_over_its_limit() -> None:
    state = WindowCount(start=0.0, current=12)  # a reservation settled above its estimate
    verdict = admit(state, TEN_A_MINUTE, 30.0, 0)
    assert not verdict.allowed
    # the next window: 12 * (1 - f) <= 10 from f = 1/6, at 70 s
    assert verdict.retry_after_s == pytest.approx(40.0)


def test_a_previous_count_of_any_weight_above_zero_takes_room() -> None:
    limit = WindowLimit(10, 1.0)
    state = WindowCount(start=1.0, current=9, previous=1)
    last_moment = math.nextafter(2.0, 0.0)  # the previous window weighs 2**-53 here
    # 9 + 2**-53 + 1 rounds to 10: only the room left, counted in whole units, refuses
    assert 1 * (2.0 - last_moment) + 9 + 1 == 10.0
    assert not admit(state, limit, last_moment, 1).allowed
    assert admit(state, limit, 2.0, 1).allowed


@pytest.mark.parametrize(("wait", "header"), [(0.25, "1"), (1.0, "1"), (21.0, "21"), (21.01, "22")])
def test_retry_after_is_whole_seconds_rounded_up(wait: float, header: str) -> None:
    assert Admission(False, WindowCount(), wait).retry_after_header == header


def test_an_amount_is_zero_or_more() -> None:
    with pytest.raises(ValueError):
        admit(WindowCount(), TEN_A_MINUTE, 0.0, -1)


# -- a reservation settled


def test_a_reservation_settled_in_its_window_corrects_the_current_count() -> None:
    reserved = admit(WindowCount(), TEN_A_MINUTE, 5.0, 8)
    state = settle(reserved.state, TEN_A_MINUTE, 20.0, 8, 3, counted_in=reserved.state.start)
    assert state == WindowCount(0.0, 3, 0)
    more = settle(state, TEN_A_MINUTE, 21.0, 3, 9, counted_in=0.0)
    assert more == WindowCount(0.0, 9, 0)


def test_a_reservation_settled_a_window_later_corrects_the_previous_count() -> None:
    state = WindowCount(start=0.0, current=8)
    assert settle(state, TEN_A_MINUTE, 70.0, 8, 3, counted_in=0.0) == WindowCount(60.0, 0, 3)


def test_a_reservation_settled_two_windows_later_is_left_as_it_was() -> None:
    state = WindowCount(start=0.0, current=8)
    assert settle(state, TEN_A_MINUTE, 130.0, 8, 3, counted_in=0.0) == WindowCount(120.0, 0, 0)
    state = WindowCount(start=120.0, current=2, previous=5)
    assert settle(state, TEN_A_MINUTE, 130.0, 8, 3, counted_in=0.0) == state


def test_a_settled_count_never_goes_below_zero() -> None:
    state = WindowCount(start=60.0, current=2, previous=1)
    assert settle(state, TEN_A_MINUTE, 61.0, 8, 0, counted_in=60.0).current == 0
    assert settle(state, TEN_A_MINUTE, 61.0, 8, 0, counted_in=0.0).previous == 0


# -- the bounds, over any sequence of calls

WINDOWS = st.sampled_from([0.1, 1.0, 2.5, 60.0, 3600.0]) | st.floats(0.01, 1000.0)


@st.composite
def calls(draw: st.DrawFn) -> tuple[WindowLimit, list[tuple[float, int]]]:
    """A limit and calls at non-decreasing times: (time, amount)."""
    limit = WindowLimit(draw(st.integers(1, 40)), draw(WINDOWS))
    now = draw(st.floats(0.0, 1e5))
    gaps = draw(
        st.lists(
            st.tuples(st.floats(0.0, 1.5), st.integers(0, limit.limit + 2)),
            min_size=1,
            max_size=60,
        )
    )
    timed = []
    for fraction, amount in gaps:
        now += fraction * limit.window_s
        timed.append((now, amount))
    return limit, timed


@settings(max_examples=300, deadline=None)
@given(calls())
def test_what_is_admitted_stays_within_the_bounds(
    case: tuple[WindowLimit, list[tuple[float, int]]],
) -> None:
    limit, timed = case
    state = WindowCount()
    admitted: list[tuple[float, int, float]] = []  # (time, amount, start of its window)
    for now, amount in timed:
        verdict = admit(state, limit, now, amount)
        state = verdict.state
        if verdict.allowed:
            admitted.append((now, amount, state.start))
    by_window: dict[float, int] = {}
    for _, amount, start in admitted:
        by_window[start] = by_window.get(start, 0) + amount
    assert all(total <= limit.limit for total in by_window.values())
    # any interval [x, x + window_s]: the largest begin at an admission
    for x, _, start in admitted:
        inside = [(t, a, s) for t, a, s in admitted if x <= t <= x + limit.window_s]
        total = sum(a for _, a, _ in inside)
        rest_of_first = sum(a for _, a, s in inside if s == start)
        into = x / limit.window_s - round(start / limit.window_s)
        assert total <= limit.limit + into * rest_of_first + 1e-6
        assert total <= 2 * limit.limit - 1


@st.composite
def moments(draw: st.DrawFn) -> tuple[WindowLimit, WindowCount, float]:
    """A limit, any state of it (counts over the limit too: reservations settled above
    their estimates) and a time before, inside or after its window."""
    limit = WindowLimit(draw(st.integers(1, 1000)), draw(WINDOWS))
    start = math.floor(draw(st.floats(0.0, 1e5)) / limit.window_s) * limit.window_s
    state = WindowCount(
        start,
        draw(st.integers(0, 2 * limit.limit)),
        draw(st.integers(0, 2 * limit.limit)),
    )
    return limit, state, start + draw(st.floats(-1.5, 2.5)) * limit.window_s


@settings(max_examples=500, deadline=None)
@given(moments(), st.data())
def test_a_refused_amount_fits_exactly_after_its_retry_after(
    moment: tuple[WindowLimit, WindowCount, float], data: st.DataObject
) -> None:
    limit, state, now = moment
    amount = data.draw(st.integers(0, limit.limit))
    verdict = admit(state, limit, now, amount)
    if verdict.allowed:
        return
    wait = verdict.retry_after_s
    assert wait is not None and wait > 0
    assert verdict.retry_after_header == str(max(1, math.ceil(wait)))
    assert admit(verdict.state, limit, now + wait, amount).allowed
    if wait > TICK:
        assert not admit(verdict.state, limit, now + wait - TICK, amount).allowed


@settings(max_examples=300, deadline=None)
@given(moments(), st.floats(-1.5, 2.5), st.floats(-1.5, 2.5))
def test_rolling_never_adds_to_the_estimate(
    moment: tuple[WindowLimit, WindowCount, float], first: float, second: float
) -> None:
    limit, state, now = moment
    rolled_at = state.start + first * limit.window_s
    read_at = state.start + second * limit.window_s
    moved = rolled(state, limit, rolled_at)
    assert used(moved, limit, read_at) <= used(state, limit, read_at)
    if read_at >= rolled_at:
        assert used(moved, limit, read_at) == used(state, limit, read_at)
    # nor does time passing, with nothing counted
    earlier, later = sorted((now, read_at))
    assert used(state, limit, later) <= used(state, limit, earlier)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 40),
    WINDOWS,
    st.lists(st.tuples(st.floats(0.0, 1e4), st.integers(0, 42)), min_size=1, max_size=60),
)
def test_a_clock_that_steps_back_never_lets_a_window_take_more_than_its_limit(
    most: int, window_s: float, timed: list[tuple[float, int]]
) -> None:
    limit = WindowLimit(most, window_s)
    state = WindowCount()
    by_window: dict[float, int] = {}
    for now, amount in timed:
        verdict = admit(state, limit, now, amount)
        if verdict.allowed:
            new = verdict.state
            assert new.start >= state.start
            if new.start == state.start:
                assert new.current == state.current + amount  # nothing counted is lost
            by_window[new.start] = by_window.get(new.start, 0) + amount
            state = new
        assert state.current <= limit.limit
    assert all(total <= limit.limit for total in by_window.values())
