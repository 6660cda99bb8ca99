"""Where the budget book's spending is read back from at start-up.

A small interface, so that another store can stand behind it; ``LedgerSpendStore``
reads the SQL ledger, SQLite or PostgreSQL (one a group of gateways may share).
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Protocol

from boundedcode_gateway.budgets.spent import Holder, HolderSpent, Spent
from boundedcode_gateway.locations import LedgerLocation
from boundedcode_gateway.metering.ledgers import ledger_at


class SpendStore(Protocol):
    def spent(self, day: str) -> dict[Holder, HolderSpent]:
        """Each caller's and task's spending on ``day`` (UTC, ``YYYY-MM-DD``) and in all.

        Blocking: run it off the event loop.
        """
        ...


class LedgerSpendStore:
    """The spending the SQL ledger's rows add up to (its migrations applied first, unless
    ``read_only``)."""

    def __init__(self, location: LedgerLocation, read_only: bool = False) -> None:
        self.location = location
        self.read_only = read_only

    def spent(self, day: str) -> dict[Holder, HolderSpent]:
        next_day = (date.fromisoformat(day) + timedelta(days=1)).isoformat()
        ledger = ledger_at(self.location)
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
