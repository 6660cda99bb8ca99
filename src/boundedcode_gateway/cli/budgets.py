"""The ``budgets`` subcommand: what each budget of the configuration has spent and has left.

Reads the ledger (read-only) as a restarted gateway would; it must not write to it.
Token budgets live in the tokens' claims, not the configuration, so they are not listed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from datetime import UTC, datetime

from boundedcode_gateway.budgets.shared import reserved_in
from boundedcode_gateway.budgets.spent import Holder, HolderSpent, Spent
from boundedcode_gateway.budgets.store import LedgerSpendStore
from boundedcode_gateway.budgets.view import budget_lines, budgets_of
from boundedcode_gateway.config import GatewayConfig
from boundedcode_gateway.locations import PostgresLocation, describe, explain
from boundedcode_gateway.metering.ledgers import LEDGER_ERRORS, ledger_exists

HEADER = ("holder", "name", "per", "limit", "spent", "held", "allowed", "left")
NO_BUDGETS = "(no budgets configured)"
COLUMN_GAP = "  "

Row = tuple[str, str, str, str, str, str, str, str]


def _amount(limit: str, value: float) -> str:
    return f"${value:,.4f}" if limit == "max_cost_usd" else f"{int(value):,}"


def budget_rows(
    config: GatewayConfig,
    spent: Mapping[Holder, HolderSpent],
    day: str,
    held: Mapping[Holder, Spent] | None = None,
) -> list[Row]:
    """One row per limit of each budget: every key's, and the task budget for each task
    the ledger knows; ``held``: what the calls in flight hold, where gateways share their
    budgets (a gateway alone holds them in its memory)."""
    tasks = [name for kind, name in spent if kind == "task"]
    return [
        (
            line.holder[0],
            line.holder[1],
            line.per,
            line.limit,
            _amount(line.limit, line.spent),
            _amount(line.limit, line.held),
            _amount(line.limit, line.allowed),
            _amount(line.limit, line.left),
        )
        for line in budget_lines(budgets_of(config, tasks), spent, day, held)
    ]


def format_table(rows: list[Row]) -> str:
    if not rows:
        return NO_BUDGETS
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    return "\n".join(
        COLUMN_GAP.join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [HEADER, *rows]
    )


def run_budgets(config: GatewayConfig) -> int:
    """Print each budget's spending today (UTC) or in all, from the ledger."""
    day = datetime.now(UTC).date().isoformat()
    spent: dict[Holder, HolderSpent] = {}
    held: dict[Holder, Spent] = {}
    ledger = config.ledger_location
    if ledger_exists(ledger):
        try:
            spent = LedgerSpendStore(ledger, read_only=True).spent(day)
            if isinstance(ledger, PostgresLocation):
                held = asyncio.run(reserved_in(ledger))
        except LEDGER_ERRORS as exc:
            message = f"cannot read the ledger {describe(ledger)}: {explain(ledger, exc)}"
            print(message, file=sys.stderr)
            return 1
    print(format_table(budget_rows(config, spent, day, held)))
    return 0
