"""Rate-limit windows several gateways share, in a PostgreSQL database (``database:``, or
the ledger's): the same rule as one gateway's (``windows.py``), applied to rows that every
gateway's calls count in.

A call's windows are admitted in one statement, one round trip on the call's path: the
database function ``rate_admit`` (``migrations/postgresql/0002_rate_admit.sql``) makes
their rows exist, locks them in one order (so two calls never wait on each other),
judges each with ``windows.admit``'s arithmetic to the bit by the database's own
clock, so the gateways' clocks need not agree, and writes them only where all are
allowed: a call is admitted in all of its windows or in none. It returns the states it
judged and its time, on which ``admit`` works out each refusal's wait; should the two
verdicts ever differ, the database's stands (it decided what was written), and that is
logged once. What a call spent is settled in the windows it started in once it ends,
off the call's path, in one statement too (``rate_settle``, ``0004_rate_settle.sql``).
Both commit without waiting for the disk (``postgres.ASYNC_COMMIT``). When the database
does not answer, ``rate_limits.when_store_down`` decides: ``fail_open`` (the default)
admits the call uncounted, ``fail_closed`` refuses it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

import asyncpg

from boundedcode_gateway.database.migrations import Migration, load_migrations
from boundedcode_gateway.database.pool import PostgresPool, Store
from boundedcode_gateway.database.postgres import ASYNC_COMMIT, MigrationSet
from boundedcode_gateway.limits.windows import (
    Admission,
    Settlement,
    WindowCount,
    WindowKey,
    WindowLimit,
    admit,
    rolled,
)

log = logging.getLogger(__name__)

# what each operation is counted as (metric labels)
OPERATIONS = ("rate_admit", "rate_settle")
# rows no call has touched for this long are deleted (the longest window is a day)
STALE_AFTER_S = 2 * 86_400
# whether a verdict of the database that admit disagrees with was logged (once)
_warned = False


def load_rate_migrations() -> list[Migration]:
    return load_migrations("migrations/postgresql", "boundedcode_gateway.limits")


RATE_WINDOWS = Store(
    "rate limits",
    MigrationSet(load_rate_migrations, "rate_window_migrations", "boundedcode_gateway.limits"),
    OPERATIONS,
    "rate limits act as rate_limits.when_store_down says",
)

# one call's windows, judged and written by the database (0002_rate_admit.sql)
ADMIT_SQL = f"SELECT a.* FROM rate_admit($1, $2, $3, $4, $5, $6) AS a, {ASYNC_COMMIT}"
# one call's settlements (0004_rate_settle.sql)
SETTLE_SQL = f"SELECT rate_settle($1, $2, $3, $4, $5, $6) FROM {ASYNC_COMMIT}"
SWEEP_SQL = "DELETE FROM rate_windows WHERE touched_at < now() - make_interval(secs => $1)"


def _columns(keys: Sequence[WindowKey]) -> tuple[list[str], list[str], list[str]]:
    return [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]


async def _admit(
    asks: Sequence[tuple[WindowKey, WindowLimit, int]], conn: asyncpg.Connection
) -> list[Admission]:
    """One statement (``rate_admit``): the rows made to exist, locked in one order (so two
    calls never wait on each other), judged, written only where all are allowed. Each
    verdict is ``admit``'s on the state the database judged, at its time."""
    keys = [key for key, _, _ in asks]
    rows = await conn.fetch(
        ADMIT_SQL,
        *_columns(keys),
        [limit.limit for _, limit, _ in asks],
        [limit.window_s for _, limit, _ in asks],
        [amount for _, _, amount in asks],
    )
    verdicts: list[Admission] = []
    agreed = True
    for (_, limit, amount), row in zip(asks, rows, strict=True):
        seen = WindowCount(row["seen_start"], row["seen_current"], row["seen_previous"])
        verdict = admit(seen, limit, row["now_s"], amount)
        if verdict.allowed != row["allowed"]:
            agreed = False
            verdict = _as_decided(seen, limit, row["now_s"], amount, row["allowed"])
        verdicts.append(verdict)
    if not agreed or rows[0]["admitted"] != all(v.allowed for v in verdicts):
        _disagreed(keys)
    return verdicts


def _as_decided(
    seen: WindowCount, limit: WindowLimit, now: float, amount: int, allowed: bool
) -> Admission:
    """The database's verdict on one window where ``admit`` differs: the state it counted
    in; or a refusal that fits again at once (the two differ only at the edge of room)."""
    if allowed:
        counted = rolled(seen, limit, now)
        return Admission(
            True, WindowCount(counted.start, counted.current + amount, counted.previous)
        )
    return Admission(False, seen, None if amount > limit.limit else 0.0)


def _disagreed(keys: Sequence[WindowKey]) -> None:
    """The database's verdict and ``admit``'s on the state it returned differ: the two are
    the same arithmetic, so this is a bug; said once per process, and the database's
    verdict, which decided what was written, stands."""
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "rate limits: the database's verdict on the windows %s differs from the "
            "gateway's on the same state; the database's stands (said once)",
            keys,
        )


async def _settle(spent: Sequence[Settlement], conn: asyncpg.Connection) -> None:
    """One statement (``rate_settle``): each window's row locked in ``rate_admit``'s order
    and written by ``settle``'s arithmetic."""
    await conn.execute(
        SETTLE_SQL,
        *_columns([key for key, _, _, _ in spent]),
        [limit.window_s for _, limit, _, _ in spent],
        [actual for _, _, actual, _ in spent],
        [counted_in for _, _, _, counted_in in spent],
    )


async def _sweep(conn: asyncpg.Connection) -> None:
    await conn.execute(SWEEP_SQL, STALE_AFTER_S)


class SharedWindows:
    """The windows of the gateways that share one database."""

    remote = True

    def __init__(self, pool: PostgresPool) -> None:
        pool.serve(RATE_WINDOWS)
        self.database = pool

    async def admit(self, asks: Sequence[tuple[WindowKey, WindowLimit, int]]) -> list[Admission]:
        """Each ask's verdict; counted in every window only where all were allowed. Raises
        ``DatabaseUnavailable`` when the database did not answer."""
        return await self.database.run("rate_admit", partial(_admit, asks))

    async def settle(self, spent: Sequence[Settlement]) -> None:
        await self.database.run("rate_settle", partial(_settle, spent))

    async def counts(self) -> tuple[list[tuple[WindowKey, WindowCount]], float]:
        """The windows touched lately (at most ``VIEW_ROWS``), and the database's time."""
        return await self.database.run("rate_admit", _counts)

    async def sweep(self) -> None:
        await self.database.run("rate_settle", _sweep)


# the most windows the page is shown
VIEW_ROWS = 1000
COUNTS_SQL = (
    "SELECT kind, name, metric, start, current, previous, extract(epoch FROM now())::float8 "
    "FROM rate_windows ORDER BY touched_at DESC LIMIT $1"
)


async def _counts(conn: asyncpg.Connection) -> tuple[list[tuple[WindowKey, WindowCount]], float]:
    rows = await conn.fetch(COUNTS_SQL, VIEW_ROWS)
    now = float(rows[0][6]) if rows else 0.0
    found = [((r[0], r[1], r[2]), WindowCount(float(r[3]), int(r[4]), int(r[5]))) for r in rows]
    return found, now
