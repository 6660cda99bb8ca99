"""What a budget counts: cost, tokens and evaluated tokens, per holder, today and in all.

Values only; the book (``book.py``) keeps them up to date, the store
(``store.py``) reads them back from the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from boundedcode_gateway.metering.records import CallRecord

HolderKind = Literal["caller", "task"]
# whose budget: a caller's name (key or token) or a task id; a kind each, so a task may
# share a name with a caller
Holder = tuple[HolderKind, str]


@dataclass(slots=True)
class Spent:
    """What calls spent: their cost in USD, tokens (prompt plus completion), tokens the
    servers evaluated."""

    cost_usd: float = 0.0
    tokens: int = 0
    evaluated_tokens: int = 0

    def add(self, other: Spent) -> None:
        self.cost_usd += other.cost_usd
        self.tokens += other.tokens
        self.evaluated_tokens += other.evaluated_tokens

    def take(self, other: Spent) -> None:
        """Take ``other`` away (what a call held, once it ended); never below nothing."""
        self.cost_usd = max(self.cost_usd - other.cost_usd, 0.0)
        self.tokens = max(self.tokens - other.tokens, 0)
        self.evaluated_tokens = max(self.evaluated_tokens - other.evaluated_tokens, 0)


def spent_by(record: CallRecord) -> Spent:
    """What one call spent; what its upstream did not report counts as nothing."""
    return Spent(
        record.cost_usd or 0.0,
        (record.prompt_tokens or 0) + (record.completion_tokens or 0),
        record.evaluated_tokens or 0,
    )


def day_of(started_at: str) -> str:
    """The UTC day (``YYYY-MM-DD``) of a record's ``started_at``: its first ten characters."""
    return started_at[:10]


@dataclass(slots=True)
class HolderSpent:
    """One holder's spending: on ``day`` (UTC) and over its lifetime."""

    day: str
    today: Spent = field(default_factory=Spent)
    lifetime: Spent = field(default_factory=Spent)

    def add(self, day: str, spent: Spent) -> None:
        """Count a call of ``day``; a new day starts the day's count afresh, a call of an
        earlier day counts in the lifetime only."""
        self.lifetime.add(spent)
        if day == self.day:
            self.today.add(spent)
        elif day > self.day:
            self.day = day
            self.today = Spent()
            self.today.add(spent)

    def on(self, day: str) -> Spent:
        """What was spent on ``day``."""
        return self.today if day == self.day else Spent()
