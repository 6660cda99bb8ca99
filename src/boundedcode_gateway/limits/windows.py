"""Sliding-window counters: how much of a rate limit the last window used, whether an
amount more fits, and how long until it would. Pure functions of a small state and a time.

The sliding window counter keeps two fixed windows of ``window_s`` seconds, aligned on
multiples of it: what was counted in the current one and in the one before. A fraction
``f`` into the current window, the last ``window_s`` seconds are estimated to hold
``previous * (1 - f) + current``: the previous window's count taken as spread evenly
over it, for the part of it the sliding window still overlaps. An amount is admitted
while the estimate and the amount together stay within the limit. No clock is read
here: ``now`` is the caller's, in seconds, monotonic or wall, so that a shared store
applies the same rule to the same state.

What it lets through, for a limit ``L``, admissions at non-decreasing times and no
``settle`` (``tests/unit/test_limit_windows.py`` checks both):

- within one aligned window, at most ``L``: every admission needs
  ``current + amount <= L`` at least;
- within any interval ``[x, x + window_s]``, at most ``L + φ·A₁``, so at most ``2L - 1``:
  ``φ`` is how far into its window ``x`` lies, ``A₁`` what was admitted from ``x`` to the
  end of that window, ``A₂`` what the interval holds of the next window. The last
  admission counted in ``A₂`` came at a fraction ``f <= φ`` of its window and saw that
  window's ``previous >= A₁`` at the weight ``1 - f``, so ``A₂ <= L - A₁·(1 - φ)`` and
  ``A₁ + A₂ <= L + φ·A₁ < 2L``. With ``A₁ >= 1`` the weight ``1 - f`` is above 0, so
  ``A₂ <= L - 1``; with ``A₁ = 0`` the sum is ``A₂ <= L``. The comparison is made with
  the integer room left (``L - current - amount``), so rounding never turns a weight
  above 0 into room.

``settle`` corrects a reservation afterwards; an actual amount above the reservation
may take ``current`` past ``L``, and the admissions after it wait the longer.

A ``now`` before the state's window (a wall clock stepped back) counts in the current
window, as if no time had passed since it began: nothing counted is lost, and that
window still takes at most ``L``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# (holder kind, its name, the metric): one window
WindowKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class WindowLimit:
    """At most ``limit`` (calls, tokens) in any ``window_s`` seconds, as the sliding window
    counter estimates it."""

    limit: int
    window_s: float

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"a window's limit is 1 or more, not {self.limit}")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"a window lasts more than 0 seconds, not {self.window_s}")


@dataclass(slots=True)
class WindowCount:
    """One limit's counts: the fixed window that begins at ``start`` (a multiple of the
    window) counted ``current``, the one before it ``previous``. The functions below never
    change the value they are given: they return another (or the same, when nothing
    changed)."""

    start: float = 0.0
    current: int = 0
    previous: int = 0


# what a call spent in one window, and the start of the window it was admitted in
Settlement = tuple[WindowKey, WindowLimit, int, float]


@dataclass(frozen=True, slots=True)
class Admission:
    """The verdict on an amount: ``allowed``, and the state to keep (the amount counted
    when allowed; the state as given when not). A refused amount fits again after
    ``retry_after_s`` if nothing else is counted meanwhile; None when it was allowed, or
    when it is over the limit by itself and never fits."""

    allowed: bool
    state: WindowCount
    retry_after_s: float | None = None

    @property
    def retry_after_header(self) -> str | None:
        """``retry_after_s`` for an HTTP ``Retry-After``: whole seconds, rounded up, at
        least 1 (a client that waited less would be refused again)."""
        if self.retry_after_s is None:
            return None
        return str(max(1, math.ceil(self.retry_after_s)))


def _index(start: float, limit: WindowLimit) -> int:
    """The number of the fixed window that begins at ``start``."""
    return round(start / limit.window_s)


def _previous_weight(state: WindowCount, limit: WindowLimit, now: float) -> float:
    """How much of the previous window the sliding window ending at ``now`` still overlaps,
    for a state already rolled to ``now``: from 1 at the current window's start to above 0
    at its end. ``now / window_s - index`` is exact within a window, so the weight falls
    monotonically with ``now`` and reaches 0 only in the next window."""
    elapsed = now / limit.window_s - _index(state.start, limit)
    return 1.0 - min(max(elapsed, 0.0), 1.0)


def rolled(state: WindowCount, limit: WindowLimit, now: float) -> WindowCount:
    """``state`` moved to the fixed window holding ``now``: one window on, the current count
    becomes the previous one; two or more, both are gone. A ``now`` before the state's
    window (the clock stepped back) leaves it as it is, so nothing counted is lost."""
    window = math.floor(now / limit.window_s)
    steps = window - _index(state.start, limit)
    if steps <= 0:
        return state
    return WindowCount(window * limit.window_s, 0, state.current if steps == 1 else 0)


def used(state: WindowCount, limit: WindowLimit, now: float) -> float:
    """The sliding estimate of what the last ``window_s`` seconds before ``now`` counted."""
    current = rolled(state, limit, now)
    return current.previous * _previous_weight(current, limit, now) + current.current


def _fits(state: WindowCount, limit: WindowLimit, now: float, amount: int) -> bool:
    """``used + amount <= limit``, for a state already rolled to ``now``; compared with the
    integer room left, so that a previous count of any weight above 0 takes room."""
    room = limit.limit - state.current - amount
    return room >= 0 and state.previous * _previous_weight(state, limit, now) <= room


def admit(state: WindowCount, limit: WindowLimit, now: float, amount: int) -> Admission:
    """Whether ``amount`` more fits at ``now``; if so, the state that counts it."""
    if amount < 0:
        raise ValueError(f"an amount is 0 or more, not {amount}")
    current = rolled(state, limit, now)
    if _fits(current, limit, now, amount):
        counted = WindowCount(current.start, current.current + amount, current.previous)
        return Admission(True, counted)
    if amount > limit.limit:
        return Admission(False, state)
    return Admission(False, state, _wait(current, limit, now, amount))


def _wait(state: WindowCount, limit: WindowLimit, now: float, amount: int) -> float:
    """The shortest wait after ``now`` at which ``amount`` (at most the limit) fits, nothing
    else counted meanwhile, for a state rolled to ``now`` that has no room for it.

    With nothing added, the estimate only falls, and continuously (a roll moves the
    current count to the previous window at full weight): within this window as the
    previous count's weight falls, in the next one as this window's count's does, and it
    is 0 two windows on. So the first time it fits solves the formula in one of the two
    windows. The time found is then checked with the same arithmetic ``admit`` uses and
    moved on by a few units of rounding where that arithmetic disagrees.
    """
    index = _index(state.start, limit)
    room = limit.limit - state.current - amount
    if room >= 0:
        # this window: previous * (1 - f) <= room; previous > 0, or it would have fitted
        at = index + 1 - room / state.previous
    else:
        # the next window: current * (1 - f) <= limit - amount; current > limit - amount
        at = index + 2 - (limit.limit - amount) / state.current
    wait = max(at * limit.window_s - now, 0.0)
    step = math.ulp(max(abs(now), limit.window_s))
    while not _fits(rolled(state, limit, now + wait), limit, now + wait, amount):
        wait += step
        step *= 2  # it fits two windows on whatever the rounding: the loop ends
    return wait


def settle(
    state: WindowCount,
    limit: WindowLimit,
    now: float,
    reserved: int,
    actual: int,
    *,
    counted_in: float,
) -> WindowCount:
    """A reservation of ``reserved`` admitted in the window that began at ``counted_in``
    (its admission's ``state.start``) corrected to the ``actual`` amount: a token-rate
    limit admits a call on its estimate and learns what it used at its end.

    The difference goes to the window the reservation was counted in, so the estimate
    reads as if the actual amount had been admitted then: the current window, or the
    previous one when the window has rolled once since. Two or more windows later that
    window is in no estimate any more, and the difference is dropped: counting it in a
    later window would charge tokens to a period they were not used in or, for a
    reservation that was too large, free room there that it never took, letting that
    window admit more than its limit. No count goes below 0.
    """
    current = rolled(state, limit, now)
    behind = _index(current.start, limit) - _index(counted_in, limit)
    difference = actual - reserved
    if behind == 0:
        return WindowCount(current.start, max(current.current + difference, 0), current.previous)
    if behind == 1:
        return WindowCount(current.start, current.current, max(current.previous + difference, 0))
    # two or more windows on; or a window this state never reached, which no estimate
    # of it holds either
    return current
