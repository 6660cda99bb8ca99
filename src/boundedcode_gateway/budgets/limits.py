"""A budget's verdict on what was spent, and the refusal the caller reads: pure functions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, time, timedelta

from boundedcode_gateway.budgets.spent import Holder, Spent
from boundedcode_gateway.config import BudgetSettings
from boundedcode_gateway.errors import BudgetExceeded

# what tells the openai SDK (and clients built on it) not to send the request again:
# a budget spent stays spent, whatever a retry's backoff
NO_RETRY_HEADER = "x-should-retry"


@dataclass(frozen=True, slots=True)
class Overrun:
    """One limit of one holder's budget that a call does not fit in: nothing left of it,
    or, for a call whose reservation is a hard bound, less left than it may spend."""

    holder: Holder
    budget: BudgetSettings
    # the BudgetSettings field: max_cost_usd, max_tokens or max_evaluated_tokens
    limit: str
    allowed: float
    spent: float
    # held by the calls in flight
    reserved: float = 0.0
    # what the call may spend, where that is more than is left (None: nothing is left)
    asked: float | None = None


def _limits(budget: BudgetSettings) -> tuple[tuple[str, float | None], ...]:
    return (
        ("max_cost_usd", budget.max_cost_usd),
        ("max_tokens", budget.max_tokens),
        ("max_evaluated_tokens", budget.max_evaluated_tokens),
    )


def _of(amount: Spent, limit: str) -> float:
    if limit == "max_cost_usd":
        return amount.cost_usd
    return float(amount.tokens if limit == "max_tokens" else amount.evaluated_tokens)


def overruns(holder: Holder, budget: BudgetSettings, spent: Spent) -> list[Overrun]:
    """Each limit of ``budget`` that ``spent`` has reached: nothing left of it (left ≤ 0)."""
    found = fitting(holder, budget, spent, Spent(), Spent(), hard=False)
    return found if isinstance(found, list) else []


def fitting(
    holder: Holder, budget: BudgetSettings, spent: Spent, reserved: Spent, ask: Spent, *, hard: bool
) -> Spent | list[Overrun]:
    """What a call asking ``ask`` holds of ``holder``'s budget while it runs, or the limits
    it does not fit in. ``reserved``: what the calls in flight hold already.

    A hard ask (its answer's length capped) must fit whole: then the spending of the
    calls admitted never passes a limit. Any other call is admitted while something is
    left, and holds no more than is left; it may pass the limit by what it spends
    beyond what it holds, which is the bound docs/budgets.md states.
    """
    found: list[Overrun] = []
    held = Spent(ask.cost_usd, ask.tokens, ask.evaluated_tokens)
    for limit, allowed in _limits(budget):
        if allowed is None:
            continue
        left = allowed - _of(spent, limit) - _of(reserved, limit)
        wanted = _of(ask, limit)
        if left <= 0 or (hard and wanted > left):
            found.append(overrun(holder, budget, limit, spent, reserved, ask))
        elif wanted > left:
            _hold_at_most(held, limit, left)
    return found or held


def overrun(
    holder: Holder, budget: BudgetSettings, limit: str, spent: Spent, reserved: Spent, ask: Spent
) -> Overrun:
    """The overrun of ``limit`` (a BudgetSettings field that ``budget`` sets) as ``fitting``
    reports it."""
    allowed = dict(_limits(budget))[limit]
    if allowed is None:
        raise ValueError(f"the budget sets no {limit}")
    used, holding, wanted = _of(spent, limit), _of(reserved, limit), _of(ask, limit)
    left = allowed - used - holding
    return Overrun(holder, budget, limit, allowed, used, holding, wanted if left > 0 else None)


def _hold_at_most(held: Spent, limit: str, left: float) -> None:
    if limit == "max_cost_usd":
        held.cost_usd = left
    elif limit == "max_tokens":
        held.tokens = int(left)
    else:
        held.evaluated_tokens = int(left)


def _amount(limit: str, value: float) -> str:
    if limit == "max_cost_usd":
        return f"${value:,.4f}"
    unit = "tokens" if limit == "max_tokens" else "evaluated tokens"
    return f"{int(value):,} {unit}"


def describe(over: Overrun) -> str:
    """One overrun in words: which holder, which limit and period, spent, held by calls
    in flight and left, and what the call may spend where that is more."""
    kind, name = over.holder
    period = "per UTC day" if over.budget.per == "day" else "for its lifetime"
    allowed = _amount(over.limit, over.allowed)
    spent = _amount(over.limit, over.spent)
    left = _amount(over.limit, max(0.0, over.allowed - over.spent - over.reserved))
    words = f"{kind} '{name}' has spent {spent} of its {over.limit} budget of {allowed} {period}"
    if over.reserved > 0:
        words += f", {_amount(over.limit, over.reserved)} held by calls in flight"
    words += f"; {left} left"
    if over.asked is not None:
        words += (
            f", and this call may spend up to {_amount(over.limit, over.asked)} (its prompt "
            "and its max_tokens): lower max_tokens, or wait for the calls in flight"
        )
    return words


def next_midnight(now: datetime) -> datetime:
    """The start of the UTC day after ``now`` (an aware datetime in UTC)."""
    return datetime.combine(now.date() + timedelta(days=1), time(), tzinfo=now.tzinfo)


def refusal(found: list[Overrun], now: datetime) -> BudgetExceeded:
    """The 429 for a call refused on the overruns ``found`` (at least one).

    ``Retry-After`` counts the seconds to the next UTC midnight when every overrun is of
    a daily budget; a lifetime budget does not renew, so then there is none.
    """
    daily = all(over.budget.per == "day" for over in found)
    when = (
        f"The daily budget renews at {next_midnight(now).strftime('%Y-%m-%dT%H:%M:%SZ')}."
        if daily
        else "A lifetime budget does not renew."
    )
    message = (
        f"Budget exceeded: {'; '.join(describe(o) for o in found)}. The call was not sent. {when}"
    )
    exc = BudgetExceeded(message)
    exc.headers[NO_RETRY_HEADER] = "false"
    if daily:
        wait = next_midnight(now) - now
        exc.headers["Retry-After"] = str(max(1, math.ceil(wait.total_seconds())))
    return exc
