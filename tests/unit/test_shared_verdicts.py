"""What the gateway makes of the verdict of the database's one statement
(``budgets/shared.py``, ``limits/shared.py``): the refusal worded by the pure functions
on the state the database judged, and, should the two verdicts ever differ, the
database's kept (it decided what was written) and the difference logged once."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from boundedcode_gateway.budgets import shared as shared_budgets
from boundedcode_gateway.budgets.reservation import Reservation
from boundedcode_gateway.budgets.shared import _reserve
from boundedcode_gateway.budgets.spent import Holder, Spent
from boundedcode_gateway.config import BudgetSettings
from boundedcode_gateway.limits import shared as shared_windows
from boundedcode_gateway.limits.shared import _admit
from boundedcode_gateway.limits.windows import WindowCount, WindowKey, WindowLimit, admit

BUDGET = BudgetSettings(max_tokens=100)
TASK: Holder = ("task", "t1")
ASK = Reservation(Spent(0.0, 30, 10), hard=True)
REQUESTS: WindowKey = ("caller", "ci", "requests")
TEN = WindowLimit(10, 60.0)
NOW = 6000.0  # the start of a window of 60 s


class Answers:
    """A connection whose one statement answers ``rows``; what it was sent is kept."""

    def __init__(self, rows: list[dict[Any, Any]]) -> None:
        self.rows = rows
        self.sent: list[tuple[Any, ...]] = []

    async def fetch(self, *args: Any) -> list[dict[Any, Any]]:
        self.sent.append(args)
        return self.rows


def holder_row(spent: int, over: list[str], held: int | None, reserved: bool) -> dict[Any, Any]:
    """``budget_reserve``'s row for a holder that spent ``spent`` tokens today (read by
    position and by name, as a record is)."""
    return {
        **dict(enumerate([0.0, spent, 0, 0.0, 0, 0, 0.0, 0, 0])),
        "over": over,
        "held_cost": None if held is None else 0.0,
        "held_tokens": held,
        "held_evaluated": None if held is None else 10,
        "reserved": reserved,
    }


def window_row(current: int, allowed: bool, admitted: bool) -> dict[str, Any]:
    return {
        "seen_start": NOW,
        "seen_current": current,
        "seen_previous": 0,
        "allowed": allowed,
        "now_s": NOW,
        "admitted": admitted,
    }


async def reserve(rows: list[dict[Any, Any]]) -> Any:
    conn = Answers(rows)
    found = await _reserve([(TASK, BUDGET)], ASK, "call-1", "gw", "2026-03-14", conn)
    assert len(conn.sent) == 1
    return found


@pytest.fixture(autouse=True)
def not_warned_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_budgets, "_warned", False)
    monkeypatch.setattr(shared_windows, "_warned", False)


async def test_a_refusal_is_worded_by_fitting_on_the_state_the_database_judged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    found = await reserve([holder_row(80, ["max_tokens"], None, False)])
    assert found is not None
    [over] = found
    assert (over.holder, over.limit, over.spent, over.asked) == (TASK, "max_tokens", 80.0, 30.0)
    assert await reserve([holder_row(10, [], 30, True)]) is None
    assert not caplog.records


async def test_where_the_budget_verdicts_differ_the_databases_stands_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=shared_budgets.__name__):
        # it reserved what fitting would refuse: the call goes
        assert await reserve([holder_row(80, [], 30, True)]) is None
        # it refused what fitting would admit: refused on the limits it named
        found = await reserve([holder_row(70, ["max_tokens"], None, False)])
        assert found is not None
        [over] = found
        assert (over.limit, over.spent, over.asked) == ("max_tokens", 70.0, 30.0)
        # the same verdict, a different amount held
        assert await reserve([holder_row(10, [], 29, True)]) is None
    assert len(caplog.records) == 1
    assert "differs" in caplog.records[0].getMessage()


async def admit_one(row: dict[str, Any]) -> Any:
    conn = Answers([row])
    [verdict] = await _admit([(REQUESTS, TEN, 1)], conn)
    assert len(conn.sent) == 1
    return verdict


async def test_a_window_verdict_is_admits_on_the_state_and_time_the_database_judged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    allowed = await admit_one(window_row(3, True, True))
    assert allowed.allowed and allowed.state == WindowCount(NOW, 4, 0)
    refused = await admit_one(window_row(10, False, False))
    expected = admit(WindowCount(NOW, 10, 0), TEN, NOW, 1)
    assert not refused.allowed and refused.retry_after_s == expected.retry_after_s
    # nine tenths into the next window, where the ten counted weigh 9 of the 10
    assert refused.retry_after_s == pytest.approx(66.0)
    assert not caplog.records


async def test_where_the_window_verdicts_differ_the_databases_stands_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=shared_windows.__name__):
        # it counted what admit would refuse: the state it counted in
        allowed = await admit_one(window_row(10, True, True))
        assert allowed.allowed and allowed.state == WindowCount(NOW, 11, 0)
        # it refused what admit would let through: a refusal that fits again at once
        refused = await admit_one(window_row(3, False, False))
        assert not refused.allowed and refused.retry_after_header == "1"
    assert len(caplog.records) == 1
    assert "differs" in caplog.records[0].getMessage()
