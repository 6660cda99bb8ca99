"""Budgets several gateways share, in the PostgreSQL database of their ledger.

A call reserves what it may spend (``reservation.py``) in ``budget_reservations``, under
an advisory lock per holder, against what the holder spent (``budget_spent``) and what
the calls in flight of every gateway hold; the same verdict as one gateway's book
(``limits.fitting``). One statement does it all, one round trip on the call's path: the
database function ``budget_reserve`` (``migrations/postgresql/0002_budget_reserve.sql``)
locks, reads, judges with ``fitting``'s arithmetic to the bit, and writes the
reservations only where every holder has room. It returns the state it judged, on
which ``fitting`` words the refusal; should the two verdicts ever differ, the
database's stands (it decided what was written), and that is logged once.

A call settles when its row reaches the ledger: a trigger there adds the row to its
holders' sums and deletes its reservation in the insert's transaction
(``migrations/postgresql/0001_live_budgets.sql``), so a call is counted exactly once,
and only what the ledger holds is spent. A gateway renews its reservations while it
lives; those of a gateway that died expire (``RESERVATION_TTL_S``) and stop counting.

When the database does not answer, ``budgets.when_store_down`` decides: ``fail_closed``
(the default) refuses the call with a 503, ``fail_open`` sends it unreserved (counted
in ``unreserved``), and its spending counts once its row is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial

import asyncpg

from boundedcode_gateway.budgets.book import Clock, call_budgets, utc_now
from boundedcode_gateway.budgets.limits import Overrun, fitting, overrun, refusal
from boundedcode_gateway.budgets.reservation import Reservation
from boundedcode_gateway.budgets.spent import Holder, HolderSpent, Spent
from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.config import BudgetPeriod, BudgetSettings
from boundedcode_gateway.database.migrations import Migration, load_migrations
from boundedcode_gateway.database.pool import DatabaseUnavailable, PostgresPool, Store
from boundedcode_gateway.database.postgres import (
    ASYNC_COMMIT,
    MigrationSet,
    advisory_lock_key,
    close_connection,
    connect,
)
from boundedcode_gateway.errors import BudgetStoreUnavailable
from boundedcode_gateway.locations import PostgresLocation
from boundedcode_gateway.metering.records import CallRecord

log = logging.getLogger(__name__)

# a reservation of a gateway that stopped renewing it counts no more after this long
RESERVATION_TTL_S = 120.0
RENEW_EVERY_S = RESERVATION_TTL_S / 4
# what each operation is counted as (metric labels)
OPERATIONS = ("reserve", "renew")
# whether a verdict of the database that fitting disagrees with was logged (once)
_warned = False


def load_budget_migrations() -> list[Migration]:
    return load_migrations("migrations/postgresql", "boundedcode_gateway.budgets")


LIVE_BUDGETS = Store(
    "budgets",
    MigrationSet(load_budget_migrations, "budget_migrations", "boundedcode_gateway.budgets"),
    OPERATIONS,
    "budgets fail as budgets.when_store_down says",
)

# Each holder's sums for the day and for all time, and what the live reservations of
# every gateway hold of it, in the order of $1/$2.
SELECT_HOLDERS_SQL = """
SELECT COALESCE(d.cost_usd, 0), COALESCE(d.tokens, 0), COALESCE(d.evaluated_tokens, 0),
       COALESCE(l.cost_usd, 0), COALESCE(l.tokens, 0), COALESCE(l.evaluated_tokens, 0),
       COALESCE(r.cost_usd, 0), COALESCE(r.tokens, 0), COALESCE(r.evaluated_tokens, 0)
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS h(kind, name, n)
LEFT JOIN budget_spent d ON d.kind = h.kind AND d.name = h.name AND d.day = $3
LEFT JOIN budget_spent l ON l.kind = h.kind AND l.name = h.name AND l.day = ''
LEFT JOIN LATERAL (
    SELECT SUM(cost_usd) AS cost_usd, SUM(tokens) AS tokens,
           SUM(evaluated_tokens) AS evaluated_tokens
    FROM budget_reservations
    WHERE kind = h.kind AND name = h.name AND expires_at > now()
) r ON true
ORDER BY h.n
"""
# one call's reservation, judged and written by the database (0002_budget_reserve.sql)
RESERVE_SQL = (
    "SELECT r.* FROM budget_reserve("
    "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15"
    f") AS r, {ASYNC_COMMIT}"
)
RENEW_SQL = (
    "UPDATE budget_reservations SET expires_at = now() + make_interval(secs => $2) "
    "WHERE gateway = $1"
)
# what expired long ago: no longer counted, and not worth keeping
SWEEP_EXPIRED_SQL = (
    "DELETE FROM budget_reservations WHERE expires_at < now() - make_interval(secs => $1)"
)
RELEASE_GATEWAY_SQL = "DELETE FROM budget_reservations WHERE gateway = $1"


@dataclass(frozen=True, slots=True)
class HolderState:
    """What one holder spent (on the day, in all) and what the calls in flight hold."""

    day: Spent
    lifetime: Spent
    reserved: Spent

    def spent(self, per: BudgetPeriod) -> Spent:
        return self.lifetime if per == "lifetime" else self.day


def _state(row: Sequence[float]) -> HolderState:
    return HolderState(
        Spent(float(row[0]), int(row[1]), int(row[2])),
        Spent(float(row[3]), int(row[4]), int(row[5])),
        Spent(float(row[6]), int(row[7]), int(row[8])),
    )


async def read_holders(
    conn: asyncpg.Connection, holders: Sequence[Holder], day: str
) -> list[HolderState]:
    """Each holder's state, as the reservations see it."""
    kinds = [h[0] for h in holders]
    names = [h[1] for h in holders]
    return [_state(row) for row in await conn.fetch(SELECT_HOLDERS_SQL, kinds, names, day)]


async def _reserve(
    budgets: Sequence[tuple[Holder, BudgetSettings]],
    reservation: Reservation,
    call_id: str,
    gateway: str,
    day: str,
    conn: asyncpg.Connection,
) -> list[Overrun] | None:
    """One statement (``budget_reserve``): each holder locked (in one order, so two calls
    never wait on each other), read, judged; the reservations written only where every
    holder has room. The refusal is ``fitting``'s, on the state the database judged."""
    holders = [holder for holder, _ in budgets]
    ask = reservation.amount
    rows = await conn.fetch(
        RESERVE_SQL,
        call_id,
        gateway,
        RESERVATION_TTL_S,
        day,
        [advisory_lock_key(f"budget:{kind}:{name}") for kind, name in holders],
        [kind for kind, _ in holders],
        [name for _, name in holders],
        [budget.per == "lifetime" for _, budget in budgets],
        [budget.max_cost_usd for _, budget in budgets],
        [budget.max_tokens for _, budget in budgets],
        [budget.max_evaluated_tokens for _, budget in budgets],
        ask.cost_usd,
        ask.tokens,
        ask.evaluated_tokens,
        reservation.hard,
    )
    states = [_state(row) for row in rows]
    found: list[Overrun] = []
    agreed = True
    for (holder, budget), state, row in zip(budgets, states, rows, strict=True):
        fits = fitting(
            holder, budget, state.spent(budget.per), state.reserved, ask, hard=reservation.hard
        )
        if isinstance(fits, list):
            found += fits
            agreed = agreed and [over.limit for over in fits] == row["over"]
        elif row["over"]:
            agreed = False
        elif row["reserved"]:
            held = Spent(row["held_cost"], row["held_tokens"], row["held_evaluated"])
            agreed = agreed and held == fits
    reserved: bool = rows[0]["reserved"]
    if agreed and reserved != bool(found):
        return found or None
    _disagreed(holders, reservation)
    if reserved:
        return None
    # refused on the database's word alone: the limits it found no room in
    return found or [
        overrun(holder, budget, limit, state.spent(budget.per), state.reserved, ask)
        for (holder, budget), state, row in zip(budgets, states, rows, strict=True)
        for limit in row["over"]
    ]


def _disagreed(holders: Sequence[Holder], reservation: Reservation) -> None:
    """The database's verdict and ``fitting``'s on the state it returned differ: the two
    are the same arithmetic, so this is a bug; said once per process, and the database's
    verdict, which decided what was written, stands."""
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "budgets: the database's verdict on a reservation of %s for %s differs from "
            "the gateway's on the same state; the database's stands (said once)",
            reservation,
            holders,
        )


class SharedBudgets:
    """The budgets of the gateways that share one PostgreSQL ledger."""

    remote = True

    def __init__(
        self,
        pool: PostgresPool,
        task_budget: BudgetSettings | None,
        *,
        fail_open: bool = False,
        clock: Clock = utc_now,
    ) -> None:
        pool.serve(LIVE_BUDGETS)
        # its health and what went without it, for the metrics
        self.database = pool
        self._pool = pool
        self.task_budget = task_budget
        self.fail_open = fail_open
        self.clock = clock
        # this process's reservations are renewed under this name while it lives
        self.gateway = f"{uuid.uuid4().hex[:12]}-{int(time.time())}"
        # calls sent without a reservation because the database did not answer
        self.unreserved = 0
        self._renewing: asyncio.Task[None] | None = None

    def today(self) -> str:
        return self.clock().date().isoformat()

    async def admit(self, ctx: CallContext, reservation: Reservation | None) -> None:
        """Hold ``reservation`` of the call's budgets in the database (None: a count of
        tokens, which holds nothing and needs only something left), or refuse the call."""
        budgets = call_budgets(ctx, self.task_budget)
        if not budgets:
            return
        now: datetime = self.clock()
        asked = reservation or Reservation(Spent(), hard=False)
        work = partial(_reserve, budgets, asked, ctx.call_id, self.gateway, now.date().isoformat())
        try:
            found = await self._pool.run("reserve", work)
        except DatabaseUnavailable:
            if self.fail_open:
                self.unreserved += 1
                return
            error = BudgetStoreUnavailable(
                "The budgets' database is not answering, and budgets do not let calls "
                "through unchecked (budgets.when_store_down: fail_closed). The call was "
                "not sent; try again shortly."
            )
            error.headers["Retry-After"] = "1"
            raise error from None
        if found:
            raise refusal(found, now)

    def count(self, record: CallRecord) -> None:
        """Nothing to add here: the ledger's trigger counts the call once its row is in."""

    async def state(self, holder: Holder) -> HolderState:
        """What ``holder`` spent today and in all, and what the calls in flight hold."""
        work = partial(_read_one, holder, self.today())
        return await self._pool.run("reserve", work)

    async def snapshot(self, day: str) -> tuple[dict[Holder, HolderSpent], dict[Holder, Spent]]:
        """What each holder spent (on ``day``, in all) and what the calls in flight of every
        gateway hold (the page's view)."""
        return await self._pool.run("reserve", partial(_snapshot, day))

    async def start(self) -> None:
        """Open the database (its migrations applied) and keep this process's reservations
        alive."""
        await self._pool.open()
        self._renewing = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(RENEW_EVERY_S)
            with contextlib.suppress(DatabaseUnavailable):
                await self._pool.run("renew", partial(_renew, self.gateway))

    async def close(self) -> None:
        """Stop renewing and let go of what this process still holds (its calls ended, their
        rows written or never to be): called once the ledger's writer has closed."""
        renewing, self._renewing = self._renewing, None
        if renewing is not None:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
        with contextlib.suppress(DatabaseUnavailable):
            await self._pool.run("renew", partial(_release, self.gateway))


async def _read_one(holder: Holder, day: str, conn: asyncpg.Connection) -> HolderState:
    return (await read_holders(conn, [holder], day))[0]


async def _renew(gateway: str, conn: asyncpg.Connection) -> None:
    await conn.execute(RENEW_SQL, gateway, RESERVATION_TTL_S)
    await conn.execute(SWEEP_EXPIRED_SQL, RESERVATION_TTL_S)


async def _release(gateway: str, conn: asyncpg.Connection) -> None:
    await conn.execute(RELEASE_GATEWAY_SQL, gateway)


SELECT_RESERVED_SQL = """
SELECT kind, name, SUM(cost_usd), SUM(tokens), SUM(evaluated_tokens)
FROM budget_reservations WHERE expires_at > now() GROUP BY kind, name
"""


async def reserved_in(location: PostgresLocation) -> dict[Holder, Spent]:
    """What the calls in flight of every gateway hold, per holder (read-only; nothing where
    no gateway has shared its budgets there yet)."""
    conn = await connect(location, read_only=True)
    try:
        rows = await conn.fetch(SELECT_RESERVED_SQL)
    except asyncpg.UndefinedTableError:
        return {}
    finally:
        await close_connection(conn)
    found: dict[Holder, Spent] = {}
    for kind, name, cost, tokens, evaluated in rows:
        holder: Holder = ("caller", name) if kind == "caller" else ("task", name)
        found[holder] = Spent(float(cost), int(tokens), int(evaluated))
    return found


SELECT_SPENT_SQL = (
    "SELECT kind, name, day, cost_usd, tokens, evaluated_tokens FROM budget_spent "
    "WHERE day IN ('', $1)"
)


async def _snapshot(
    day: str, conn: asyncpg.Connection
) -> tuple[dict[Holder, HolderSpent], dict[Holder, Spent]]:
    spent: dict[Holder, HolderSpent] = {}
    for kind, name, on, cost, tokens, evaluated in await conn.fetch(SELECT_SPENT_SQL, day):
        holder: Holder = ("caller", name) if kind == "caller" else ("task", name)
        found = spent.setdefault(holder, HolderSpent(day))
        amount = Spent(float(cost), int(tokens), int(evaluated))
        if on == "":
            found.lifetime = amount
        else:
            found.today = amount
    held: dict[Holder, Spent] = {}
    for kind, name, cost, tokens, evaluated in await conn.fetch(SELECT_RESERVED_SQL):
        holder = ("caller", name) if kind == "caller" else ("task", name)
        held[holder] = Spent(float(cost), int(tokens), int(evaluated))
    return spent, held
