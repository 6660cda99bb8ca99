"""Where the budget book's spending is read back from at start-up.

A small interface, so that another ledger (one a group of gateways shares) can
stand behind it; ``LedgerSpendStore`` reads the SQLite ledger.
"""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path
from typing import Protocol

from boundedcode_gateway.budgets.spent import Holder, HolderSpent, Spent
from boundedcode_gateway.metering.ledger import Ledger


class SpendStore(Protocol):
    def spent(self, day: str) -> dict[Holder, HolderSpent]:
        """Each caller's and task's spending on ``day`` (UTC, ``YYYY-MM-DD``) and in all.

        Blocking: run it off the event loop.
        """
        ...


class LedgerSpendStore:
    """The spending the SQL ledger's rows add up to (its migrations applied first, unless
    ``read_only``)."""

    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only

    def spent(self, day: str) -> dict[Holder, HolderSpent]:
        next_day = (date.fromisoformat(day) + timedelta(days=1)).isoformat()
        ledger = Ledger(self.path)
        ledger.open(read_only=self.read_only)
        try:
            rows = ledger.spending(day, next_day)
        finally:
            ledger.close()
        return {
            _holder(row.kind, row.name): HolderSpent(
                day,
                Spent(row.day_cost_usd, row.day_tokens, row.day_evaluated_tokens),
                Spent(row.cost_usd, row.tokens, row.evaluated_tokens),
            )
            for row in rows
        }


def _holder(kind: str, name: str) -> Holder:
    return ("caller", name) if kind == "caller" else ("task", name)
