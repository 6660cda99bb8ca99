"""Rate-limit windows several gateways share, in a PostgreSQL database (``database:``, or
the ledger's): the same rule as one gateway's (``windows.py``), applied to rows that every
gateway's calls count in.

A call's windows are read and written in one transaction, their rows locked in one
order (so two calls never wait on each other), the time the database's own, so the
gateways' clocks need not agree. A call is admitted in all of its windows or in none.
What a call spent is settled in the window it started in once it ends, off the call's
path. When the database does not answer, ``rate_limits.when_store_down`` decides:
``fail_open`` (the default) admits the call uncounted, ``fail_closed`` refuses it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

import asyncpg

from boundedcode_gateway.database.migrations import Migration, load_migrations
from boundedcode_gateway.database.pool import PostgresPool, Store
from boundedcode_gateway.database.postgres import MigrationSet
from boundedcode_gateway.limits.windows import (
    Admission,
    WindowCount,
    WindowLimit,
    admit,
    settle,
)

log = logging.getLogger(__name__)

# (holder kind, holder name, metric)
WindowKey = tuple[str, str, str]
# what each operation is counted as (metric labels)
OPERATIONS = ("rate_admit", "rate_settle")
# rows no call has touched for this long are deleted (the longest window is a day)
STALE_AFTER_S = 2 * 86_400


def load_rate_migrations() -> list[Migration]:
    return load_migrations("migrations/postgresql", "boundedcode_gateway.limits")


RATE_WINDOWS = Store(
    "rate limits",
    MigrationSet(load_rate_migrations, "rate_window_migrations", "boundedcode_gateway.limits"),
    OPERATIONS,
    "rate limits act as rate_limits.when_store_down says",
)

ENSURE_SQL = """
INSERT INTO rate_windows (kind, name, metric, start, current, previous)
SELECT kind, name, metric, 0, 0, 0
FROM unnest($1::text[], $2::text[], $3::text[]) AS k(kind, name, metric)
ON CONFLICT (kind, name, metric) DO NOTHING
"""
LOCK_SQL = """
SELECT w.start, w.current, w.previous, extract(epoch FROM now())::float8
FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS k(kind, name, metric, n)
JOIN rate_windows w USING (kind, name, metric)
ORDER BY k.n
FOR UPDATE OF w
"""
WRITE_SQL = """
UPDATE rate_windows AS w
SET start = s.start, current = s.current, previous = s.previous, touched_at = now()
FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[], $5::bigint[], $6::bigint[])
    AS s(kind, name, metric, start, current, previous)
WHERE w.kind = s.kind AND w.name = s.name AND w.metric = s.metric
"""
SWEEP_SQL = "DELETE FROM rate_windows WHERE touched_at < now() - make_interval(secs => $1)"


def _columns(keys: Sequence[WindowKey]) -> tuple[list[str], list[str], list[str]]:
    return [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]


async def _admit(
    asks: Sequence[tuple[WindowKey, WindowLimit, int]], conn: asyncpg.Connection
) -> list[Admission]:
    # locked in one order whatever the call's: sorted keys
    order = sorted(range(len(asks)), key=lambda i: asks[i][0])
    keys = [asks[i][0] for i in order]
    async with conn.transaction():
        await conn.execute(ENSURE_SQL, *_columns(keys))
        rows = await conn.fetch(LOCK_SQL, *_columns(keys))
        verdicts: list[Admission | None] = [None] * len(asks)
        for i, row in zip(order, rows, strict=True):
            _, limit, amount = asks[i]
            state = WindowCount(float(row[0]), int(row[1]), int(row[2]))
            verdicts[i] = admit(state, limit, float(row[3]), amount)
        found = [v for v in verdicts if v is not None]
        if all(v.allowed for v in found):
            states = [found[i].state for i in order]
            await conn.execute(
                WRITE_SQL,
                *_columns(keys),
                [s.start for s in states],
                [s.current for s in states],
                [s.previous for s in states],
            )
    return found


async def _settle(
    key: WindowKey, limit: WindowLimit, actual: int, counted_in: float, conn: asyncpg.Connection
) -> None:
    async with conn.transaction():
        rows = await conn.fetch(LOCK_SQL, *_columns([key]))
        if not rows:
            return
        row = rows[0]
        state = WindowCount(float(row[0]), int(row[1]), int(row[2]))
        after = settle(state, limit, float(row[3]), 0, actual, counted_in=counted_in)
        await conn.execute(
            WRITE_SQL, *_columns([key]), [after.start], [after.current], [after.previous]
        )


async def _sweep(conn: asyncpg.Connection) -> None:
    await conn.execute(SWEEP_SQL, STALE_AFTER_S)


class SharedWindows:
    """The windows of the gateways that share one database."""

    def __init__(self, pool: PostgresPool) -> None:
        pool.serve(RATE_WINDOWS)
        self.database = pool

    async def admit(self, asks: Sequence[tuple[WindowKey, WindowLimit, int]]) -> list[Admission]:
        """Each ask's verdict; counted in every window only where all were allowed. Raises
        ``DatabaseUnavailable`` when the database did not answer."""
        return await self.database.run("rate_admit", partial(_admit, asks))

    async def settle(
        self, key: WindowKey, limit: WindowLimit, actual: int, counted_in: float
    ) -> None:
        await self.database.run("rate_settle", partial(_settle, key, limit, actual, counted_in))

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
