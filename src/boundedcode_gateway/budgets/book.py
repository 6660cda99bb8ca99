"""The budget book: what each caller and each task has spent, in memory, and the check of
a call against its budgets before it is sent.

Lives on the event loop: ``check`` runs when a call starts, ``count`` when a call's
record is handed to the meter writer (one of its observers, ``MeterWriter.observe``).
Neither does I/O; what was spent before a restart is read from the store once, at
start-up (``restore``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Protocol

from boundedcode_gateway.budgets.limits import Overrun, fitting, refusal
from boundedcode_gateway.budgets.reservation import Reservation
from boundedcode_gateway.budgets.spent import Holder, HolderSpent, Spent, day_of, spent_by
from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.config import BudgetPeriod, BudgetSettings, GatewayConfig
from boundedcode_gateway.metering.records import CallRecord

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def call_budgets(
    ctx: CallContext, task_budget: BudgetSettings | None
) -> list[tuple[Holder, BudgetSettings]]:
    """The budgets a call is held to: its caller's, its task's."""
    found: list[tuple[Holder, BudgetSettings]] = []
    caller = ctx.caller
    if caller is not None and caller.budget is not None:
        found.append((("caller", caller.name), caller.budget))
    if task_budget is not None:
        found.append((("task", ctx.task), task_budget))
    return found


class Budgets(Protocol):
    """The budgets the service holds calls to: one gateway's book, or those several
    gateways share (``shared.py``)."""

    task_budget: BudgetSettings | None
    # whether a call's admission waits on a database (so it is worth overlapping)
    remote: bool

    async def admit(self, ctx: CallContext, reservation: Reservation | None) -> None:
        """Hold ``reservation`` of the call's budgets until its record is counted (None: a
        count of tokens, which needs only something left), or refuse the call."""
        ...

    def count(self, record: CallRecord) -> None:
        """A call's record was published: what it spent counts, what it held is let go."""
        ...

    async def snapshot(self, day: str) -> tuple[dict[Holder, HolderSpent], dict[Holder, Spent]]:
        """What each holder spent, and what the calls in flight hold."""
        ...


def budgets_configured(config: GatewayConfig) -> bool:
    """Whether any call can have a budget: a task budget, a key's, or task tokens (whose
    claims carry one)."""
    if config.budgets.task is not None:
        return True
    auth = config.auth
    return auth is not None and (auth.takes_tokens or any(k.budget is not None for k in auth.keys))


class BudgetBook:
    remote = False

    """Spending per caller and per task (UTC day and lifetime), what the calls in flight
    hold of it, and the budgets' verdict.

    A call reserves what it may spend when it starts (``reserve``) and settles to what it
    spent when its record is published (``count``): a call whose reservation is a hard
    bound is admitted only where all of it fits, so the calls admitted never spend past
    a limit; any other holds what is left at most, and the spending may pass a limit by
    what such calls spend beyond what they hold (``limits.fitting``). None is cut short.
    """

    def __init__(self, task_budget: BudgetSettings | None, clock: Clock = utc_now) -> None:
        self.task_budget = task_budget
        # an aware UTC datetime; tests move it across a day boundary
        self.clock = clock
        self._spent: dict[Holder, HolderSpent] = {}
        # what the calls in flight hold, per holder, and per call (by call id)
        self._reserved: dict[Holder, Spent] = {}
        self._held: dict[str, list[tuple[Holder, Spent]]] = {}

    def today(self) -> str:
        """The UTC day (``YYYY-MM-DD``) by the book's clock."""
        return self.clock().date().isoformat()

    def restore(self, spent: Mapping[Holder, HolderSpent]) -> None:
        """Start from what was spent before this process (read once, before any call)."""
        for holder, held in spent.items():
            if holder[0] == "task" and self.task_budget is None:
                continue
            self._spent[holder] = held

    def spent(self, holder: Holder, per: BudgetPeriod, day: str) -> Spent:
        """What ``holder`` spent on ``day`` (per ``day``) or in all (per ``lifetime``)."""
        held = self._spent.get(holder)
        if held is None:
            return Spent()
        return held.lifetime if per == "lifetime" else held.on(day)

    async def snapshot(self, day: str) -> tuple[dict[Holder, HolderSpent], dict[Holder, Spent]]:
        """What each holder spent and what the calls in flight hold (the page's view)."""
        return dict(self._spent), {h: s for h, s in self._reserved.items() if s != Spent()}

    def reserved(self, holder: Holder) -> Spent:
        """What the calls in flight hold of ``holder``'s budget."""
        return self._reserved.get(holder) or Spent()

    async def admit(self, ctx: CallContext, reservation: Reservation | None) -> None:
        """``reserve``, or ``check`` for a call that spends nothing (``Budgets``)."""
        if reservation is None:
            self.check(ctx)
        else:
            self.reserve(ctx, reservation)

    def check(self, ctx: CallContext) -> None:
        """Refuse (``BudgetExceeded``) a call whose caller or task has a budget with nothing
        left of one of its limits, what the calls in flight hold counted as spent."""
        self.reserve(ctx, Reservation(Spent(), hard=False))
        self._held.pop(ctx.call_id, None)

    def reserve(self, ctx: CallContext, reservation: Reservation) -> None:
        """Hold what the call may spend of each of its budgets until its record is counted,
        or refuse it (``BudgetExceeded``), holding nothing."""
        budgets = call_budgets(ctx, self.task_budget)
        if not budgets:
            return
        now = self.clock()
        day = now.date().isoformat()
        found: list[Overrun] = []
        held: list[tuple[Holder, Spent]] = []
        for holder, budget in budgets:
            fits = fitting(
                holder,
                budget,
                self.spent(holder, budget.per, day),
                self.reserved(holder),
                reservation.amount,
                hard=reservation.hard,
            )
            if isinstance(fits, list):
                found += fits
            else:
                held.append((holder, fits))
        if found:
            raise refusal(found, now)
        for holder, amount in held:
            self._reserved.setdefault(holder, Spent()).add(amount)
        self._held[ctx.call_id] = held

    def count(self, record: CallRecord) -> None:
        """Add what one finished call spent to its caller's and its task's spending.

        The gateway's own work (a cache repair) is recorded without a caller: it counts
        toward its task's budget only.
        """
        for holder, amount in self._held.pop(record.call_id, ()):
            reserved = self._reserved.get(holder)
            if reserved is not None:
                reserved.take(amount)
        track_task = self.task_budget is not None
        if record.caller is None and not track_task:
            return
        day = day_of(record.started_at)
        spent = spent_by(record)
        if record.caller is not None:
            self._add(("caller", record.caller), day, spent)
        if track_task:
            self._add(("task", record.task), day, spent)

    def _add(self, holder: Holder, day: str, spent: Spent) -> None:
        held = self._spent.get(holder)
        if held is None:
            held = self._spent[holder] = HolderSpent(day)
        held.add(day, spent)
