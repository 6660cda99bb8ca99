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
    """One limit of one holder's budget with nothing left."""

    holder: Holder
    budget: BudgetSettings
    # the BudgetSettings field: max_cost_usd, max_tokens or max_evaluated_tokens
    limit: str
    allowed: float
    spent: float


def overruns(holder: Holder, budget: BudgetSettings, spent: Spent) -> list[Overrun]:
    """Each limit of ``budget`` that ``spent`` has reached: nothing left of it (left ≤ 0)."""
    found = []
    for limit, allowed, used in (
        ("max_cost_usd", budget.max_cost_usd, spent.cost_usd),
        ("max_tokens", budget.max_tokens, spent.tokens),
        ("max_evaluated_tokens", budget.max_evaluated_tokens, spent.evaluated_tokens),
    ):
        if allowed is not None and allowed - used <= 0:
            found.append(Overrun(holder, budget, limit, allowed, used))
    return found


def _amount(limit: str, value: float) -> str:
    if limit == "max_cost_usd":
        return f"${value:,.4f}"
    unit = "tokens" if limit == "max_tokens" else "evaluated tokens"
    return f"{int(value):,} {unit}"


def describe(over: Overrun) -> str:
    """One overrun in words: which holder, which limit and period, spent and left."""
    kind, name = over.holder
    period = "per UTC day" if over.budget.per == "day" else "for its lifetime"
    allowed = _amount(over.limit, over.allowed)
    spent = _amount(over.limit, over.spent)
    left = _amount(over.limit, max(0.0, over.allowed - over.spent))
    return (
        f"{kind} '{name}' has spent {spent} of its {over.limit} budget of {allowed} "
        f"{period}; {left} left"
    )


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
