"""Reservations (``budgets/reservation.py``, ``limits.fitting``, the book's ``reserve``):
what a call may spend at most, worked out from its body; a hard reservation admitted
only where all of it fits, so the calls admitted never spend past a limit; any other
holding what is left at most, so the spending passes a limit by no more than what such
calls spent beyond what they held."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.budgets.book import BudgetBook
from boundedcode_gateway.budgets.reservation import (
    MEDIA_PART_TOKENS,
    TEMPLATE_TOKENS,
    Reservation,
    prompt_token_bound,
    reservation_for,
)
from boundedcode_gateway.budgets.spent import Spent
from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.config import BudgetSettings, PriceSettings
from boundedcode_gateway.errors import BudgetExceeded
from boundedcode_gateway.metering.records import CallRecord
from tests.unit.test_budgets import Clock, caller, ctx, record

PRICE = PriceSettings(input_per_mtok=2.0, output_per_mtok=8.0)
TEXT = [{"role": "user", "content": "Read the file and fix the failing test."}]


def test_a_reservation_is_the_prompts_bytes_the_template_and_the_answers_cap_at_the_price() -> None:
    body = {"messages": TEXT, "max_tokens": 300, "n": 2}
    found = reservation_for(body, PRICE, profile_cap=None, output_estimate=4096, call_s_estimate=60)
    prompt = TEMPLATE_TOKENS + len(
        b'[{"role":"user","content":"Read the file and fix the failing test."}]'
    )
    assert found.amount.tokens == prompt + 600 and found.amount.evaluated_tokens == prompt
    assert found.amount.cost_usd == (prompt * 2.0 + 600 * 8.0) / 1_000_000
    assert found.hard


def test_without_a_cap_the_answer_is_an_estimate_and_the_reservation_no_hard_bound() -> None:
    found = reservation_for(
        {"messages": TEXT}, None, profile_cap=None, output_estimate=4096, call_s_estimate=60
    )
    assert found.amount.tokens == prompt_token_bound({"messages": TEXT}) + 4096
    assert not found.hard
    # the profile's own cap is one the upstream keeps
    capped = reservation_for(
        {"messages": TEXT}, None, profile_cap=1000, output_estimate=4096, call_s_estimate=60
    )
    assert capped.hard and capped.amount.tokens == prompt_token_bound({"messages": TEXT}) + 1000
    # a price per second of a server's work is bounded by no token count
    timed = PriceSettings(input_per_mtok=0, output_per_mtok=0, gpu_second=0.001)
    by_time = reservation_for(
        {"messages": TEXT, "max_tokens": 10},
        timed,
        profile_cap=None,
        output_estimate=4096,
        call_s_estimate=60,
    )
    assert not by_time.hard and by_time.amount.cost_usd == 0.001 * 60


def test_a_media_part_counts_the_same_whatever_its_size() -> None:
    small = "data:image/png;base64," + "A" * 100
    large = "data:image/png;base64," + "A" * 2_000_000

    def body(url: str) -> dict[str, object]:
        part = {"type": "image_url", "image_url": {"url": url}}
        return {"messages": [{"role": "user", "content": [part]}]}

    assert prompt_token_bound(body(small)) == prompt_token_bound(body(large))
    assert prompt_token_bound(body(large)) >= MEDIA_PART_TOKENS


@given(st.lists(st.text(max_size=200), min_size=1, max_size=8))
def test_the_prompt_bound_is_at_least_every_byte_of_text_and_the_template(
    texts: list[str],
) -> None:
    messages = [{"role": "user", "content": t} for t in texts]
    text_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    # every token of text is at least one byte; the template's own tokens come on top
    assert prompt_token_bound({"messages": messages}) >= text_bytes + TEMPLATE_TOKENS


def ended(context: CallContext, tokens: int) -> CallRecord:
    """The record of the call of ``context``, which spent ``tokens``."""
    return replace(record(prompt_tokens=tokens, completion_tokens=0), call_id=context.call_id)


# each step: a call starts asking `ask` tokens and will spend `spent` (hard: at most
# ask), or the oldest running call ends
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(0, 600), st.integers(0, 900)),
        st.tuples(st.just("end"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@given(STEPS, st.integers(1, 3000), st.integers(0, 2999))
def test_hard_reservations_never_let_the_spending_pass_the_limit(
    steps: list[tuple[str, int, int]], limit: int, before: int
) -> None:
    book = BudgetBook(None, Clock())
    who = caller(budget=BudgetSettings(max_tokens=limit))
    book.count(record(0, prompt_tokens=min(before, limit), completion_tokens=0))
    running: list[tuple[CallContext, int]] = []
    for action, ask, spend in steps:
        if action == "start":
            context = ctx(who)
            left = limit - book.spent(("caller", "ci"), "day", "2026-03-01").tokens
            left -= book.reserved(("caller", "ci")).tokens
            try:
                book.reserve(context, Reservation(Spent(0, ask, 0), hard=True))
            except BudgetExceeded:
                assert ask > left or left <= 0  # refused only where it does not fit
                continue
            assert ask <= left
            running.append((context, min(spend, ask)))
        elif running:
            context, spent = running.pop(0)
            book.count(ended(context, spent))
        assert book.spent(("caller", "ci"), "day", "2026-03-01").tokens <= limit
    for context, spent in running:
        book.count(ended(context, spent))
    assert book.spent(("caller", "ci"), "day", "2026-03-01").tokens <= limit
    assert book.reserved(("caller", "ci")).tokens == 0


@given(STEPS, st.integers(1, 3000))
def test_other_reservations_pass_the_limit_by_no_more_than_what_calls_spent_beyond_them(
    steps: list[tuple[str, int, int]], limit: int
) -> None:
    book = BudgetBook(None, Clock())
    who = caller(budget=BudgetSettings(max_tokens=limit))
    running: list[tuple[CallContext, int, int]] = []
    beyond = 0  # what admitted calls spent past what they held
    for action, ask, spend in steps:
        if action == "start":
            context = ctx(who)
            held_before = book.reserved(("caller", "ci")).tokens
            try:
                book.reserve(context, Reservation(Spent(0, ask, 0), hard=False))
            except BudgetExceeded:
                continue
            held = book.reserved(("caller", "ci")).tokens - held_before
            assert held <= ask
            running.append((context, spend, held))
        elif running:
            context, spent, held = running.pop(0)
            beyond += max(spent - held, 0)
            book.count(ended(context, spent))
        assert book.spent(("caller", "ci"), "day", "2026-03-01").tokens <= limit + beyond
