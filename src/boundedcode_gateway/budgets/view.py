"""Each budget's limits as an operator reads them: spent in its period, held by the calls
in flight, allowed, left. Pure: the ``budgets`` command prints it, the page's
``/ui/api/limits`` sends it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from boundedcode_gateway.budgets.spent import Holder, HolderSpent, Spent
from boundedcode_gateway.config import BudgetPeriod, BudgetSettings, GatewayConfig


@dataclass(frozen=True, slots=True)
class BudgetLine:
    """One limit of one holder's budget."""

    holder: Holder
    per: BudgetPeriod
    limit: str  # max_cost_usd, max_tokens or max_evaluated_tokens
    spent: float
    held: float
    allowed: float

    @property
    def left(self) -> float:
        return max(0.0, self.allowed - self.spent - self.held)

    def to_dict(self) -> dict[str, object]:
        kind, name = self.holder
        return {
            "holder": kind,
            "name": name,
            "per": self.per,
            "limit": self.limit,
            "spent": self.spent,
            "held": self.held,
            "allowed": self.allowed,
            "left": self.left,
        }


def budgets_of(config: GatewayConfig, tasks: Sequence[str]) -> list[tuple[Holder, BudgetSettings]]:
    """Every key's budget, and the task budget of each of ``tasks``."""
    found: list[tuple[Holder, BudgetSettings]] = []
    if config.auth is not None:
        found += [(("caller", k.name), k.budget) for k in config.auth.keys if k.budget]
    if config.budgets.task is not None:
        found += [(("task", name), config.budgets.task) for name in sorted(tasks)]
    return found


def budget_lines(
    budgets: Sequence[tuple[Holder, BudgetSettings]],
    spent: Mapping[Holder, HolderSpent],
    day: str,
    held: Mapping[Holder, Spent] | None = None,
) -> list[BudgetLine]:
    """One line per limit of each budget; ``held``: what the calls in flight hold."""
    held = held or {}
    lines: list[BudgetLine] = []
    for holder, budget in budgets:
        found = spent.get(holder)
        used = (
            Spent()
            if found is None
            else (found.lifetime if budget.per == "lifetime" else found.on(day))
        )
        holding = held.get(holder) or Spent()
        for limit, allowed, value, reserved in (
            ("max_cost_usd", budget.max_cost_usd, used.cost_usd, holding.cost_usd),
            ("max_tokens", budget.max_tokens, used.tokens, holding.tokens),
            (
                "max_evaluated_tokens",
                budget.max_evaluated_tokens,
                used.evaluated_tokens,
                holding.evaluated_tokens,
            ),
        ):
            if allowed is not None:
                lines.append(BudgetLine(holder, budget.per, limit, value, reserved, allowed))
    return lines
