"""The database's verdicts on shared budgets and shared rate windows (``budget_reserve``,
``rate_admit``, ``rate_window_admit``) against the gateway's pure functions, which are
the reference (``limits.fitting``, ``windows.admit``): for any state, the same verdict,
the same limits over, the same amounts held and the same windows written, to the bit.

The states are drawn near the edges where float8 arithmetic could part from Python's: a
limit just spent (0.1 + 0.2 of 0.3), an estimate equal to the room left, counts past
2^53, times a unit of rounding either side of a window's start."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any, TypeVar

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boundedcode_gateway.budgets.limits import fitting
from boundedcode_gateway.budgets.shared import LIVE_BUDGETS, RESERVE_SQL
from boundedcode_gateway.budgets.spent import Holder, Spent
from boundedcode_gateway.config import BudgetPeriod, BudgetSettings
from boundedcode_gateway.database.postgres import advisory_lock_key, apply_set
from boundedcode_gateway.limits.shared import ADMIT_SQL, RATE_WINDOWS, SETTLE_SQL
from boundedcode_gateway.limits.windows import (
    WindowCount,
    WindowKey,
    WindowLimit,
    admit,
    rolled,
    settle,
    used,
)
from boundedcode_gateway.metering.pg_ledger import LEDGER_MIGRATIONS
from tests.postgres_db import PgDatabase, run_async

T = TypeVar("T")

PROPERTY = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TODAY = "2026-03-14"
HOLDERS: list[Holder] = [("caller", "ci"), ("task", "ci")]
KEYS: list[WindowKey] = [
    ("caller", "ci", "requests"),
    ("task", "t1", "tokens"),
    ("profile", "local", "evaluated_tokens"),
]
CALLS = count()
# the databases whose migrations are applied (one per test; its examples share it)
MIGRATED: set[str] = set()


async def _on(pg: PgDatabase, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    conn = await asyncpg.connect(pg.url, timeout=5)
    try:
        if pg.name not in MIGRATED:
            # the budgets' trigger is on the ledger's table
            for migrations in (LEDGER_MIGRATIONS, LIVE_BUDGETS.migrations, RATE_WINDOWS.migrations):
                await apply_set(conn, migrations)
            MIGRATED.add(pg.name)
        return await work(conn)
    finally:
        await conn.close()


# tenths: sums that float8 does not hold exactly (0.1 + 0.2 is not 0.3)
TENTHS = st.integers(0, 12).map(lambda i: i / 10)
COSTS = st.one_of(TENTHS, st.floats(0, 5, allow_nan=False, allow_infinity=False))
# small, so that a limit is often spent exactly; or past 2^53, where float8 rounds
COUNTS = st.one_of(st.integers(0, 12), st.integers(2**53 - 8, 2**53 + 8), st.integers(0, 2**60))


def _spent() -> st.SearchStrategy[Spent]:
    return st.builds(Spent, COSTS, COUNTS, COUNTS)


def _added(*amounts: Spent) -> Spent:
    found = Spent()
    for amount in amounts:
        found.add(amount)
    return found


@dataclass
class HolderCase:
    """One holder's budget and rows: its sums, the live reservations of calls in flight,
    and those of gateways gone (expired: they count no more)."""

    budget: BudgetSettings
    day: Spent
    lifetime: Spent
    live: list[Spent] = field(default_factory=list)
    expired: list[Spent] = field(default_factory=list)

    def used(self) -> Spent:
        """What the budget's period spent and the calls in flight hold, added in Python."""
        return _added(self.lifetime if self.budget.per == "lifetime" else self.day, *self.live)


# where a limit lies about what is used: just spent, a token either side, or two left
NEAR = st.sampled_from([0, 0, -1, 1, 2])


def _near(used: int) -> st.SearchStrategy[int]:
    return NEAR.map(lambda d: max(1, min(used + d, 2**63 - 1))) | st.integers(1, 30)


@st.composite
def _holder_cases(draw: st.DrawFn) -> HolderCase:
    day, lifetime = draw(_spent()), draw(_spent())
    live = draw(st.lists(_spent(), max_size=3))
    expired = draw(st.lists(_spent(), max_size=2))
    per: BudgetPeriod = "lifetime" if draw(st.booleans()) else "day"
    used = _added(lifetime if per == "lifetime" else day, *live)
    limited = draw(st.sets(st.sampled_from(["cost", "tokens", "evaluated"]), min_size=1))
    cost = draw(
        st.sampled_from([used.cost_usd, used.cost_usd + 0.1]).filter(lambda c: c > 0)
        | st.integers(1, 12).map(lambda i: i / 10)
        | st.floats(1e-6, 5)
    )
    budget = BudgetSettings(
        max_cost_usd=cost if "cost" in limited else None,
        max_tokens=draw(_near(used.tokens)) if "tokens" in limited else None,
        max_evaluated_tokens=(
            draw(_near(used.evaluated_tokens)) if "evaluated" in limited else None
        ),
        per=per,
    )
    return HolderCase(budget, day, lifetime, live, expired)


@st.composite
def _budget_asks(draw: st.DrawFn, cases: list[HolderCase]) -> Spent:
    """What a call asks: about what is left of one holder's budget, or anything."""
    case = draw(st.sampled_from(cases))
    used = case.used()
    budget = case.budget
    near = Spent(
        max((budget.max_cost_usd or 0) - used.cost_usd, 0.0),
        max((budget.max_tokens or 0) - used.tokens + draw(NEAR), 0),
        max((budget.max_evaluated_tokens or 0) - used.evaluated_tokens + draw(NEAR), 0),
    )
    return draw(st.just(near) | _spent())


INSERT_SPENT_SQL = (
    "INSERT INTO budget_spent (kind, name, day, cost_usd, tokens, evaluated_tokens) "
    "VALUES ($1, $2, $3, $4, $5, $6)"
)
INSERT_RESERVATION_SQL = """
INSERT INTO budget_reservations
    (call_id, kind, name, cost_usd, tokens, evaluated_tokens, gateway, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, 'other', now() + make_interval(secs => $7))
"""


async def _given_holders(conn: asyncpg.Connection, cases: list[HolderCase]) -> None:
    await conn.execute("TRUNCATE budget_spent, budget_reservations")
    for (kind, name), case in zip(HOLDERS, cases, strict=False):
        for day, spent in ((TODAY, case.day), ("", case.lifetime), ("2026-03-13", case.day)):
            values = (spent.cost_usd, spent.tokens, spent.evaluated_tokens)
            await conn.execute(INSERT_SPENT_SQL, kind, name, day, *values)
        for i, (held, ttl) in enumerate(
            [(h, 60.0) for h in case.live] + [(h, -1.0) for h in case.expired]
        ):
            values = (held.cost_usd, held.tokens, held.evaluated_tokens)
            await conn.execute(INSERT_RESERVATION_SQL, f"in-flight-{i}", kind, name, *values, ttl)


def _reserve_args(call: str, cases: list[HolderCase], ask: Spent, hard: bool) -> tuple[Any, ...]:
    holders = HOLDERS[: len(cases)]
    return (
        call,
        "this",
        120.0,
        TODAY,
        [advisory_lock_key(f"budget:{kind}:{name}") for kind, name in holders],
        [kind for kind, _ in holders],
        [name for _, name in holders],
        [case.budget.per == "lifetime" for case in cases],
        [case.budget.max_cost_usd for case in cases],
        [case.budget.max_tokens for case in cases],
        [case.budget.max_evaluated_tokens for case in cases],
        ask.cost_usd,
        ask.tokens,
        ask.evaluated_tokens,
        hard,
    )


@PROPERTY
@given(data=st.data(), hard=st.booleans())
def test_budget_reserve_judges_holds_and_writes_as_fitting_does(
    pg: PgDatabase, data: st.DataObject, hard: bool
) -> None:
    cases = data.draw(st.lists(_holder_cases(), min_size=1, max_size=len(HOLDERS)))
    ask = data.draw(_budget_asks(cases))
    call = f"call-{next(CALLS)}"

    async def reserve(conn: asyncpg.Connection) -> tuple[list[Any], list[Any]]:
        await _given_holders(conn, cases)
        rows = await conn.fetch(RESERVE_SQL, *_reserve_args(call, cases, ask, hard))
        written = await conn.fetch(
            "SELECT kind, name, cost_usd, tokens, evaluated_tokens, gateway "
            "FROM budget_reservations WHERE call_id = $1",
            call,
        )
        return rows, written

    rows, written = run_async(lambda: _on(pg, reserve))
    holders = HOLDERS[: len(cases)]
    assert len(rows) == len(holders)
    verdicts: list[Spent | list[Any]] = []
    for holder, case, row in zip(holders, cases, rows, strict=True):
        # what it judged: today's sums and the lifetime's, the live reservations' alone
        day, lifetime, reserved = (Spent(row[i], row[i + 1], row[i + 2]) for i in (0, 3, 6))
        assert (day, lifetime) == (case.day, case.lifetime)
        assert (reserved.tokens, reserved.evaluated_tokens) == (
            sum(h.tokens for h in case.live),
            sum(h.evaluated_tokens for h in case.live),
        )
        assert reserved.cost_usd == pytest.approx(sum(h.cost_usd for h in case.live))
        spent = lifetime if case.budget.per == "lifetime" else day
        verdict = fitting(holder, case.budget, spent, reserved, ask, hard=hard)
        verdicts.append(verdict)
        over = [o.limit for o in verdict] if isinstance(verdict, list) else []
        assert row["over"] == over
    admitted = not any(isinstance(v, list) for v in verdicts)
    assert [row["reserved"] for row in rows] == [admitted] * len(rows)
    if not admitted:
        assert written == []
        assert all(row["held_tokens"] is None for row in rows)
        return
    held = [Spent(row["held_cost"], row["held_tokens"], row["held_evaluated"]) for row in rows]
    assert held == verdicts
    assert sorted(tuple(r) for r in written) == sorted(
        (kind, name, h.cost_usd, h.tokens, h.evaluated_tokens, "this")
        for (kind, name), h in zip(holders, held, strict=True)
    )


# windows of any length a configuration may give (at most a day), some of them not
# held exactly by float8
WINDOWS_S = st.one_of(
    st.sampled_from([1.0, 0.1, 0.3, 7.0, 60.0, 3600.0, 86_400.0]), st.floats(1e-3, 86_400)
)
# small, or past 2^53 (where float8 holds even numbers only)
WINDOW_COUNTS = st.one_of(st.integers(0, 12), st.integers(2**53, 2**60))
# how far into its window a time lies: its start, its middle, anywhere
FRACTIONS = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.75]), st.floats(0, 1, exclude_max=True))


@dataclass
class WindowCase:
    """One window's state, its limit, the time it is judged at and the amount asked."""

    state: WindowCount
    limit: WindowLimit
    now: float
    amount: int


@st.composite
def _window_cases(draw: st.DrawFn, now: float | None = None) -> WindowCase:
    """A window's state, limit and ask at ``now`` (drawn where None): the state's window
    the current one, one to three behind, one ahead (a clock stepped back), or anywhere;
    the room left near the previous window's weighted count."""
    window_s = draw(WINDOWS_S)
    if now is None:
        fraction = draw(FRACTIONS)
        now = (draw(st.integers(1, int(2e9 / window_s))) + fraction) * window_s
        # a unit of rounding either side of it
        now = draw(st.sampled_from([now, math.nextafter(now, 0), math.nextafter(now, math.inf)]))
    index = math.floor(now / window_s)
    # never subnormal: a start is 0 or a window's number times its length, and PostgreSQL
    # refuses a division that underflows to 0 where Python gives 0
    start = draw(
        st.one_of(
            st.sampled_from([0, -1, 0, -1, -2, -3, 1]).map(lambda d: (index + d) * window_s),
            st.just(0.0),
            st.floats(0, 2.2e9, allow_subnormal=False),
        )
    )
    current, previous, amount = draw(WINDOW_COUNTS), draw(WINDOW_COUNTS), draw(st.integers(0, 12))
    # the room left about the previous window's weighted count, or anything small
    any_limit = WindowLimit(1, window_s)
    at = rolled(WindowCount(start, current, previous), any_limit, now)
    estimate = used(WindowCount(at.start, 0, at.previous), any_limit, now)
    room = draw(st.sampled_from([math.ceil(estimate), 0]) | st.integers(0, 30))
    # one less than a count past 2^53 is a room that float8 rounds up to it
    limit = max(1, min(at.current + amount + room + draw(st.sampled_from([-1, 0, 1, -2])), 2**62))
    return WindowCase(
        WindowCount(start, current, previous), WindowLimit(limit, window_s), now, amount
    )


WINDOW_RULE_SQL = """
SELECT f.allowed, f.counted_start, f.counted_current, f.counted_previous
FROM unnest($1::float8[], $2::bigint[], $3::bigint[], $4::bigint[], $5::float8[],
            $6::float8[], $7::bigint[])
    WITH ORDINALITY AS x(start, current, previous, lim, window_s, now_s, amount, n)
CROSS JOIN LATERAL rate_window_admit(
    x.start, x.current, x.previous, x.lim, x.window_s, x.now_s, x.amount) f
ORDER BY x.n
"""


@PROPERTY
@given(cases=st.lists(_window_cases(), min_size=10, max_size=30))
def test_the_databases_window_rule_gives_admits_verdict_to_the_bit(
    pg: PgDatabase, cases: list[WindowCase]
) -> None:
    async def judge(conn: asyncpg.Connection) -> list[Any]:
        return list(
            await conn.fetch(
                WINDOW_RULE_SQL,
                [c.state.start for c in cases],
                [c.state.current for c in cases],
                [c.state.previous for c in cases],
                [c.limit.limit for c in cases],
                [c.limit.window_s for c in cases],
                [c.now for c in cases],
                [c.amount for c in cases],
            )
        )

    rows = run_async(lambda: _on(pg, judge))
    assert len(rows) == len(cases)
    for case, row in zip(cases, rows, strict=True):
        verdict = admit(case.state, case.limit, case.now, case.amount)
        counted = WindowCount(row[1], row[2], row[3])
        assert row[0] == verdict.allowed, case
        # what it keeps where allowed; where refused, the state rolled to now, unwritten
        kept = verdict.state if verdict.allowed else rolled(case.state, case.limit, case.now)
        assert counted == kept, case


SETTLE_RULE_SQL = """
SELECT f.settled_start, f.settled_current, f.settled_previous
FROM unnest($1::float8[], $2::bigint[], $3::bigint[], $4::float8[], $5::float8[],
            $6::bigint[], $7::float8[])
    WITH ORDINALITY AS x(start, current, previous, window_s, now_s, difference, counted_in, n)
CROSS JOIN LATERAL rate_window_settle(
    x.start, x.current, x.previous, x.window_s, x.now_s, x.difference, x.counted_in) f
ORDER BY x.n
"""


@dataclass
class SettleCase:
    """One window's state at ``now``, a call admitted in the window that began at
    ``counted_in`` on ``reserved``, that spent ``actual``."""

    window: WindowCase
    counted_in: float
    reserved: int
    actual: int


@st.composite
def _settle_cases(draw: st.DrawFn) -> SettleCase:
    window = draw(_window_cases())
    window_s = window.limit.window_s
    index = math.floor(window.now / window_s)
    counted_in = draw(
        st.one_of(
            st.sampled_from([0, -1, -2, -3, 1]).map(lambda d: (index + d) * window_s),
            st.just(window.state.start),
            st.floats(0, 2.2e9, allow_subnormal=False),
        )
    )
    reserved, actual = draw(WINDOW_COUNTS), draw(WINDOW_COUNTS)
    return SettleCase(window, counted_in, reserved, actual)


@PROPERTY
@given(cases=st.lists(_settle_cases(), min_size=10, max_size=30))
def test_the_databases_settlement_gives_settles_state_to_the_bit(
    pg: PgDatabase, cases: list[SettleCase]
) -> None:
    # differences past BIGINT cannot be asked of either
    cases = [c for c in cases if abs(c.actual - c.reserved) < 2**62]

    async def judge(conn: asyncpg.Connection) -> list[Any]:
        return list(
            await conn.fetch(
                SETTLE_RULE_SQL,
                [c.window.state.start for c in cases],
                [c.window.state.current for c in cases],
                [c.window.state.previous for c in cases],
                [c.window.limit.window_s for c in cases],
                [c.window.now for c in cases],
                [c.actual - c.reserved for c in cases],
                [c.counted_in for c in cases],
            )
        )

    rows = run_async(lambda: _on(pg, judge))
    assert len(rows) == len(cases)
    for case, row in zip(cases, rows, strict=True):
        w = case.window
        expected = settle(
            w.state, w.limit, w.now, case.reserved, case.actual, counted_in=case.counted_in
        )
        assert WindowCount(row[0], row[1], row[2]) == expected, case


def test_rate_settle_writes_the_rows_there_are_and_makes_none(pg: PgDatabase) -> None:
    # a window long enough not to roll while the test runs
    limit = WindowLimit(1000, 1e9)
    start = math.floor(_database_now(pg) / limit.window_s) * limit.window_s
    state = WindowCount(start, 10, 4)

    async def scenario(conn: asyncpg.Connection) -> list[Any]:
        await conn.execute("TRUNCATE rate_windows")
        await conn.execute(INSERT_WINDOW_SQL, "task", "t1", "tokens", start, 10, 4)
        await conn.execute(
            SETTLE_SQL,
            ["task", "caller"],
            ["t1", "gone"],
            ["tokens", "tokens"],
            [limit.window_s, limit.window_s],
            [25, 25],
            [start, start],
        )
        return list(
            await conn.fetch("SELECT kind, name, start, current, previous FROM rate_windows")
        )

    rows = run_async(lambda: _on(pg, scenario))
    expected = settle(state, limit, start + 1.0, 0, 25, counted_in=start)
    assert expected == WindowCount(start, 35, 4)
    assert [tuple(r) for r in rows] == [("task", "t1", start, 35, 4)]


@dataclass
class AskCase:
    """One ask of a call: its window's row (None: none yet), its limit and amount."""

    key: WindowKey
    row: WindowCase | None
    limit: WindowLimit
    amount: int


@st.composite
def _window_asks(draw: st.DrawFn, now: float) -> list[AskCase]:
    keys = draw(
        st.permutations(KEYS).flatmap(lambda ks: st.sampled_from([ks[:n] for n in (1, 2, 3)]))
    )
    found = []
    for key in keys:
        case = draw(_window_cases(now))
        exists = draw(st.booleans())
        found.append(AskCase(key, case if exists else None, case.limit, case.amount))
    return found


STATE_SQL = (
    "SELECT start, current, previous FROM rate_windows WHERE (kind, name, metric) = ($1, $2, $3)"
)
INSERT_WINDOW_SQL = (
    "INSERT INTO rate_windows (kind, name, metric, start, current, previous) "
    "VALUES ($1, $2, $3, $4, $5, $6)"
)


def _database_now(pg: PgDatabase) -> float:
    async def now(conn: asyncpg.Connection) -> float:
        return float(await conn.fetchval("SELECT extract(epoch FROM now())::float8"))

    return run_async(lambda: _on(pg, now))


@PROPERTY
@given(data=st.data())
def test_rate_admit_admits_in_all_windows_or_none_as_admit_does(
    pg: PgDatabase, data: st.DataObject
) -> None:
    # the rows drawn about the database's time: the call's own is a moment later
    asks = data.draw(_window_asks(_database_now(pg)))

    async def call(conn: asyncpg.Connection) -> tuple[list[Any], list[WindowCount]]:
        await conn.execute("TRUNCATE rate_windows")
        for ask in asks:
            if ask.row is not None:
                state = ask.row.state
                await conn.execute(
                    INSERT_WINDOW_SQL, *ask.key, state.start, state.current, state.previous
                )
        rows = await conn.fetch(
            ADMIT_SQL,
            [a.key[0] for a in asks],
            [a.key[1] for a in asks],
            [a.key[2] for a in asks],
            [a.limit.limit for a in asks],
            [a.limit.window_s for a in asks],
            [a.amount for a in asks],
        )
        after = [WindowCount(*(await conn.fetchrow(STATE_SQL, *a.key))) for a in asks]
        return list(rows), after

    rows, after = run_async(lambda: _on(pg, call))
    assert len(rows) == len(asks)
    verdicts = []
    for ask, row in zip(asks, rows, strict=True):
        seen = WindowCount(row["seen_start"], row["seen_current"], row["seen_previous"])
        assert seen == (ask.row.state if ask.row is not None else WindowCount(0.0, 0, 0))
        verdict = admit(seen, ask.limit, row["now_s"], ask.amount)
        assert row["allowed"] == verdict.allowed
        verdicts.append(verdict)
    admitted = all(v.allowed for v in verdicts)
    assert [row["admitted"] for row in rows] == [admitted] * len(rows)
    assert len({row["now_s"] for row in rows}) == 1
    if admitted:
        assert after == [v.state for v in verdicts]
    else:
        # nothing written: each row as it was, or as it was made
        assert after == [a.row.state if a.row is not None else WindowCount(0.0, 0, 0) for a in asks]
