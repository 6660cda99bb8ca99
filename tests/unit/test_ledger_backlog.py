"""The records a ledger that went away has not taken yet: bounded, oldest dropped first, and
tried again 0.5 s after the first failure, doubling up to 30 s."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.metering.backlog import LedgerBacklog, Pending, retry_delay
from tests.unit.test_metering import make_record


def pending(*numbers: int) -> list[Pending]:
    return [Pending(make_record(i), counted=True) for i in numbers]


def ids(items: list[Pending]) -> list[str]:
    return [p.record.call_id for p in items]


@pytest.mark.parametrize(
    ("failures", "delay"),
    [
        (1, 0.5),
        (2, 1.0),
        (3, 2.0),
        (4, 4.0),
        (5, 8.0),
        (6, 16.0),
        (7, 30.0),
        (8, 30.0),
        (10**6, 30.0),
    ],
)
def test_retry_delays_double_up_to_thirty_seconds(failures: int, delay: float) -> None:
    assert retry_delay(failures) == delay


def test_the_oldest_are_dropped_past_the_bound() -> None:
    backlog = LedgerBacklog(3)
    assert backlog.keep(pending(1, 2)) == []
    assert ids(backlog.keep(pending(3, 4, 5))) == ["call-00001", "call-00002"]
    assert (len(backlog), backlog.dropped) == (3, 2)
    assert ids(backlog.head(2)) == ["call-00003", "call-00004"]
    backlog.release(2)
    assert ids(backlog.head(10)) == ["call-00005"]
    assert backlog.give_up() == 1
    assert (len(backlog), backlog.dropped) == (0, 3)


def test_tries_are_scheduled_from_each_failure() -> None:
    backlog = LedgerBacklog(10)
    assert backlog.wait(100.0) is None and not backlog.due(100.0) and not backlog.failing
    backlog.failed(100.0)
    assert backlog.failing
    assert backlog.wait(100.2) == pytest.approx(0.3)
    assert not backlog.due(100.4) and backlog.due(100.5)
    backlog.failed(100.5)
    assert backlog.wait(100.5) == 1.0
    assert backlog.wait(200.0) == 0.0  # overdue: at once
    backlog.succeeded()
    assert backlog.wait(200.0) is None and backlog.failures == 0


def test_a_buffer_holds_at_least_one_record() -> None:
    with pytest.raises(ValueError, match="at least one"):
        LedgerBacklog(0)


@given(bound=st.integers(1, 20), sizes=st.lists(st.integers(0, 30), max_size=12))
def test_what_is_kept_is_the_newest_in_order_and_the_rest_is_counted(
    bound: int, sizes: list[int]
) -> None:
    backlog = LedgerBacklog(bound)
    numbers = iter(range(10**6))
    submitted: list[int] = []
    for size in sizes:
        batch = [next(numbers) for _ in range(size)]
        submitted += batch
        backlog.keep(pending(*batch))
    assert ids(backlog.head(bound)) == [f"call-{i:05d}" for i in submitted[-bound:]] or (
        not submitted
    )
    assert len(backlog) + backlog.dropped == len(submitted)
    assert len(backlog) <= bound
