"""Budgets: what each caller and task spent (``budgets/spent.py``), the verdict and its
refusal (``limits.py``), the book that checks calls and counts records (``book.py``), and
the spending read back from the ledger after a restart (``store.py``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.budgets.book import BudgetBook, budgets_configured
from boundedcode_gateway.budgets.limits import NO_RETRY_HEADER, next_midnight
from boundedcode_gateway.budgets.spent import HolderSpent, Spent
from boundedcode_gateway.budgets.store import LedgerSpendStore
from boundedcode_gateway.call_context import CallContext, Caller
from boundedcode_gateway.config import BudgetSettings, parse_config
from boundedcode_gateway.errors import BudgetExceeded
from boundedcode_gateway.metering.ledger import Ledger
from boundedcode_gateway.metering.records import CallRecord
from tests.unit.scripted_http import RecordingWriter

NOON = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
TOKENS_A_DAY = BudgetSettings(max_tokens=1000, per="day")
DOLLARS_FOR_LIFE = BudgetSettings(max_cost_usd=2.0, per="lifetime")
EVALUATED_A_DAY = BudgetSettings(max_evaluated_tokens=500)


def stamp(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record(
    n: int = 0,
    caller: str | None = "ci",
    task: str = "t1",
    at: datetime = NOON,
    **usage: Any,
) -> CallRecord:
    fields: dict[str, Any] = {
        "prompt_tokens": 100,
        "cached_tokens": 0,
        "completion_tokens": 20,
        "evaluated_tokens": 100,
        "cost_usd": 0.5,
        **usage,
    }
    r = CallRecord(f"call-{n:05d}", stamp(at), task, "agent_turn", "gpt", caller=caller)
    return replace(r, status="ok", http_status=200, **fields)


def caller(name: str = "ci", budget: BudgetSettings | None = TOKENS_A_DAY) -> Caller:
    return Caller(name, "key", frozenset({"*"}), budget=budget)


def ctx(who: Caller | None = None, task: str = "t1") -> CallContext:
    return CallContext.new(task, "agent_turn", caller=who)


class Clock:
    def __init__(self, now: datetime = NOON) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def refusal(book: BudgetBook, context: CallContext) -> BudgetExceeded:
    with pytest.raises(BudgetExceeded) as caught:
        book.check(context)
    return caught.value


# -- what a call spent, and a day's count


def test_a_records_spending_is_its_cost_its_tokens_and_what_was_evaluated() -> None:
    book = BudgetBook(None, Clock())
    book.count(record(prompt_tokens=300, completion_tokens=45, evaluated_tokens=120))
    book.count(record(prompt_tokens=None, completion_tokens=None, evaluated_tokens=None,
                      cost_usd=None))  # fmt: skip
    assert book.spent(("caller", "ci"), "day", "2026-03-01") == Spent(0.5, 345, 120)


def test_a_new_day_starts_its_count_afresh_and_an_old_day_counts_in_the_lifetime_only() -> None:
    held = HolderSpent("2026-03-01")
    held.add("2026-03-01", Spent(1.0, 10, 5))
    held.add("2026-03-02", Spent(2.0, 20, 6))
    assert held.on("2026-03-02") == Spent(2.0, 20, 6)
    assert held.on("2026-03-01") == Spent()
    held.add("2026-03-01", Spent(4.0, 40, 7))  # a call that began before midnight
    assert held.on("2026-03-02") == Spent(2.0, 20, 6)
    assert held.lifetime == Spent(7.0, 70, 18)


# -- each limit, each period


@pytest.mark.parametrize(
    ("budget", "usage", "limit"),
    [
        (TOKENS_A_DAY, {"prompt_tokens": 900, "completion_tokens": 100}, "max_tokens"),
        (DOLLARS_FOR_LIFE, {"cost_usd": 2.0}, "max_cost_usd"),
        (EVALUATED_A_DAY, {"evaluated_tokens": 500}, "max_evaluated_tokens"),
    ],
)
def test_each_limit_refuses_once_nothing_is_left_and_not_before(
    budget: BudgetSettings, usage: dict[str, Any], limit: str
) -> None:
    book = BudgetBook(None, Clock())
    who = caller(budget=budget)
    # one unit short of the limit: something is left, the call starts
    short = {k: v - (0.01 if isinstance(v, float) else 1) for k, v in usage.items()}
    quiet = {"prompt_tokens": 0, "completion_tokens": 0, "evaluated_tokens": 0, "cost_usd": 0.0}
    book.count(record(0, **{**quiet, **short}))
    book.check(ctx(who))
    book.count(record(1, **{**quiet, **{k: v - short[k] for k, v in usage.items()}}))
    exc = refusal(book, ctx(who))
    assert exc.http_status == 429 and exc.code == "budget_exceeded"
    assert exc.type == "insufficient_quota"
    assert "caller 'ci' has spent" in exc.message and limit in exc.message
    # other callers are not held to ci's budget
    book.check(ctx(caller("other", budget)))


def test_a_daily_budget_renews_at_utc_midnight_and_says_when() -> None:
    clock = Clock(datetime(2026, 3, 1, 23, 59, 30, tzinfo=UTC))
    book = BudgetBook(None, clock)
    book.count(record(0, at=clock.now, prompt_tokens=990, completion_tokens=10))
    exc = refusal(book, ctx(caller()))
    assert exc.message == (
        "Budget exceeded: caller 'ci' has spent 1,000 tokens of its max_tokens budget of "
        "1,000 tokens per UTC day; 0 tokens left. The call was not sent. "
        "The daily budget renews at 2026-03-02T00:00:00Z."
    )
    assert exc.headers == {"Retry-After": "30", NO_RETRY_HEADER: "false"}
    clock.now += timedelta(seconds=30)  # the next UTC day
    book.check(ctx(caller()))


def test_a_lifetime_budget_does_not_renew_and_sends_no_retry_after() -> None:
    clock = Clock()
    book = BudgetBook(None, clock)
    book.count(record(0, cost_usd=2.5))
    who = caller(budget=DOLLARS_FOR_LIFE)
    exc = refusal(book, ctx(who))
    assert exc.message == (
        "Budget exceeded: caller 'ci' has spent $2.5000 of its max_cost_usd budget of "
        "$2.0000 for its lifetime; $0.0000 left. The call was not sent. "
        "A lifetime budget does not renew."
    )
    assert exc.headers == {NO_RETRY_HEADER: "false"}
    clock.now += timedelta(days=400)
    assert refusal(book, ctx(who)).headers == {NO_RETRY_HEADER: "false"}


def test_next_midnight_is_the_start_of_the_next_utc_day() -> None:
    assert next_midnight(datetime(2026, 12, 31, 0, 0, 0, tzinfo=UTC)) == datetime(
        2027, 1, 1, tzinfo=UTC
    )


# -- the task budget


def test_a_task_budget_holds_each_task_on_its_own_across_callers() -> None:
    book = BudgetBook(BudgetSettings(max_tokens=300), Clock())
    alice, bob = caller("alice", None), caller("bob", None)
    book.check(ctx(alice, "t1"))
    book.count(record(0, caller="alice", task="t1", prompt_tokens=150, completion_tokens=0))
    book.check(ctx(bob, "t1"))
    book.count(record(1, caller="bob", task="t1", prompt_tokens=150, completion_tokens=0))
    exc = refusal(book, ctx(alice, "t1"))
    assert "task 't1' has spent 300 tokens" in exc.message
    refusal(book, ctx(bob, "t1"))
    refusal(book, ctx(None, "t1"))  # without a caller as well
    book.check(ctx(alice, "t2"))  # another task has all of its own


def test_the_gateways_own_work_counts_toward_its_task_not_a_caller() -> None:
    book = BudgetBook(BudgetSettings(max_tokens=1000), Clock())
    who = caller(budget=BudgetSettings(max_tokens=1000))
    book.count(record(0, caller="ci", prompt_tokens=400, completion_tokens=0))
    repair = replace(record(1, caller=None, prompt_tokens=700, completion_tokens=0),
                     purpose="cache_repair")  # fmt: skip
    book.count(repair)
    assert book.spent(("caller", "ci"), "day", "2026-03-01").tokens == 400
    exc = refusal(book, ctx(who))
    assert "task 't1' has spent 1,100 tokens" in exc.message
    assert "caller" not in exc.message


def test_both_budgets_spent_are_both_named_and_a_lifetime_one_means_no_retry_after() -> None:
    book = BudgetBook(BudgetSettings(max_tokens=100, per="day"), Clock())
    who = caller(budget=BudgetSettings(max_tokens=100, per="lifetime"))
    book.count(record(0))
    exc = refusal(book, ctx(who))
    assert "caller 'ci' has spent 120 tokens" in exc.message
    assert "task 't1' has spent 120 tokens" in exc.message
    assert "Retry-After" not in exc.headers


def test_calls_without_any_budget_are_never_refused() -> None:
    book = BudgetBook(None, Clock())
    book.count(record(0, prompt_tokens=10**9))
    book.check(ctx(caller(budget=None)))
    book.check(ctx(None))


# -- calls in flight


def test_calls_in_flight_are_not_cut_and_bound_the_overspend() -> None:
    """N calls that start with 1 token left are all admitted; once they end, the next is
    refused, and the spending exceeds the limit by at most what those N spent."""
    book = BudgetBook(None, Clock())
    who = caller(budget=BudgetSettings(max_tokens=1000))
    book.count(record(0, prompt_tokens=999, completion_tokens=0))
    in_flight = []
    for n in range(1, 6):
        book.check(ctx(who))  # nothing finished since: each is admitted
        in_flight.append(record(n, prompt_tokens=30, completion_tokens=10))
    for r in in_flight:
        book.count(r)
    refusal(book, ctx(who))
    spent = book.spent(("caller", "ci"), "day", "2026-03-01").tokens
    assert spent == 999 + 5 * 40
    assert spent <= 1000 + sum(40 for _ in in_flight)


@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(min_value=0, max_value=400)),
        min_size=1,
        max_size=60,
    ),
    st.integers(min_value=1, max_value=2000),
)
def test_spending_never_exceeds_the_limit_plus_what_was_in_flight_when_it_was_reached(
    steps: list[tuple[bool, int]], limit: int
) -> None:
    """Any interleaving of calls starting (True) and the oldest running call ending (False)
    with the tokens it spent."""
    book = BudgetBook(None, Clock())
    who = caller(budget=BudgetSettings(max_tokens=limit))
    running: list[int] = []  # what each admitted, unfinished call will spend
    spent = 0
    in_flight_at_limit: int | None = None
    for n, (start, tokens) in enumerate(steps):
        if start:
            try:
                book.check(ctx(who))
            except BudgetExceeded:
                assert spent >= limit
                continue
            assert spent < limit  # admitted only with something left
            running.append(tokens)
        elif running:
            ending = running.pop(0)
            if spent < limit <= spent + ending:
                in_flight_at_limit = ending + sum(running)
            spent += ending
            book.count(record(n, prompt_tokens=ending, completion_tokens=0))
    assert book.spent(("caller", "ci"), "day", "2026-03-01").tokens == spent
    if in_flight_at_limit is None:
        assert spent < limit
    else:
        assert spent < limit + in_flight_at_limit


# -- counting what the writer is handed


def counting(book: BudgetBook) -> RecordingWriter:
    writer = RecordingWriter()
    writer.count("budgets", book.count)
    return writer


def test_the_book_counts_every_record_the_writer_is_handed() -> None:
    book = BudgetBook(None, Clock())
    sink = writer = counting(book)
    sink.publish(record(0))
    sink.publish(replace(record(1), started_at="not a time"))  # counted on some day
    assert [r.call_id for r in writer.records] == ["call-00000", "call-00001"]
    assert book.spent(("caller", "ci"), "lifetime", "").tokens == 240


def test_a_record_that_cannot_be_counted_is_still_written(caplog: pytest.LogCaptureFixture) -> None:
    book = BudgetBook(None, Clock())
    writer = counting(book)
    broken = replace(record(0), prompt_tokens="many")  # type: ignore[arg-type]
    writer.publish(broken)
    assert [r.call_id for r in writer.records] == ["call-00000"]
    assert "failed on call-00000" in caplog.text


# -- which configurations need a book


@pytest.mark.parametrize(
    ("extra", "needed"),
    [
        ({}, False),
        ({"budgets": {"task": {"max_tokens": 10}}}, True),
        ({"auth": {"keys": [{"name": "k", "sha256": "0" * 64, "models": ["*"]}]}}, False),
        (
            {
                "auth": {
                    "keys": [
                        {"name": "k", "sha256": "0" * 64, "models": ["*"],
                         "budget": {"max_cost_usd": 1.0}},
                    ]
                }
            },
            True,
        ),
        ({"auth": {"token_secret_env": "TOKEN_SECRET"}}, True),
    ],
)  # fmt: skip
def test_budgets_are_configured_by_a_task_budget_a_keys_budget_or_tokens(
    extra: dict[str, Any], needed: bool
) -> None:
    text = yaml.safe_dump(
        {"models": {"m": {"provider": "local", "external_url": "http://127.0.0.1:1"}}, **extra}
    )
    assert budgets_configured(parse_config(text)) is needed


# -- read back from the ledger


def write_ledger(path: Path, records: list[CallRecord]) -> None:
    ledger = Ledger(path)
    ledger.open()
    try:
        ledger.insert(records)
    finally:
        ledger.close()


def test_the_ledger_adds_up_each_callers_and_tasks_spending_today_and_in_all(
    tmp_path: Path,
) -> None:
    yesterday = NOON - timedelta(days=1)
    tomorrow = NOON + timedelta(days=1)
    write_ledger(
        tmp_path / "ledger.db",
        [
            record(0, "ci", "t1", yesterday, cost_usd=1.0),
            record(1, "ci", "t1", NOON.replace(hour=0), cost_usd=0.25),
            record(2, "ci", "t2", NOON.replace(hour=23, minute=59), cost_usd=None,
                   completion_tokens=None, evaluated_tokens=None),
            record(3, "ops", "t2", tomorrow),
            record(4, None, "t1", NOON, prompt_tokens=7, completion_tokens=0, cost_usd=0.0,
                   evaluated_tokens=7),
        ],
    )  # fmt: skip
    spent = LedgerSpendStore(tmp_path / "ledger.db").spent("2026-03-01")
    assert spent == {
        # record 2 reported no evaluated tokens: nothing counted for them
        ("caller", "ci"): HolderSpent("2026-03-01", Spent(0.25, 220, 100), Spent(1.25, 340, 200)),
        ("caller", "ops"): HolderSpent("2026-03-01", Spent(), Spent(0.5, 120, 100)),
        ("task", "t1"): HolderSpent("2026-03-01", Spent(0.25, 127, 107), Spent(1.25, 247, 207)),
        ("task", "t2"): HolderSpent("2026-03-01", Spent(0.0, 100, 0), Spent(0.5, 220, 100)),
    }


def test_a_restored_book_refuses_what_was_spent_before_the_restart(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    before = BudgetBook(BudgetSettings(max_cost_usd=1.0, per="lifetime"), Clock())
    sink = writer = counting(before)
    for n in range(3):
        sink.publish(record(n, prompt_tokens=400, completion_tokens=0, cost_usd=0.4))
    write_ledger(path, writer.records)

    after = BudgetBook(BudgetSettings(max_cost_usd=1.0, per="lifetime"), Clock())
    after.restore(LedgerSpendStore(path).spent(after.today()))
    who = caller(budget=TOKENS_A_DAY)
    exc = refusal(after, ctx(who))
    assert "caller 'ci' has spent 1,200 tokens" in exc.message
    assert "task 't1' has spent $1.2000" in exc.message
    assert after.spent(("task", "t1"), "lifetime", "") == before.spent(
        ("task", "t1"), "lifetime", ""
    )


def test_a_book_without_a_task_budget_keeps_no_tasks(tmp_path: Path) -> None:
    write_ledger(tmp_path / "ledger.db", [record(0)])
    book = BudgetBook(None, Clock())
    book.restore(LedgerSpendStore(tmp_path / "ledger.db").spent(book.today()))
    book.count(record(1))
    assert book.spent(("task", "t1"), "lifetime", "") == Spent()
    assert book.spent(("caller", "ci"), "lifetime", "") == Spent(1.0, 240, 200)
