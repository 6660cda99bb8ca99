"""The pool the stores share: a connection given back is reset no further than asyncpg
always does (an open transaction rolled back), so nothing an operation sets may outlive
its transaction; the limits' asynchronous commits are their own transaction's alone."""

from __future__ import annotations

import logging

import asyncpg
import pytest

from boundedcode_gateway.budgets.reservation import Reservation
from boundedcode_gateway.budgets.shared import SharedBudgets
from boundedcode_gateway.budgets.spent import Spent
from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.config import BudgetSettings
from boundedcode_gateway.database.pool import POOL_MAX_SIZE, PostgresPool
from boundedcode_gateway.database.postgres import ASYNC_COMMIT
from boundedcode_gateway.limits.shared import SharedWindows
from boundedcode_gateway.limits.windows import WindowLimit
from boundedcode_gateway.locations import parse_postgres_url
from boundedcode_gateway.metering.pg_ledger import migrate
from tests.postgres_db import PgDatabase, run_async


async def _every_connection(pool: PostgresPool, sql: str) -> list[str]:
    """``sql``'s value on each of the pool's connections, all held at once."""
    raw = pool._pool
    assert raw is not None
    held = [await raw.acquire() for _ in range(POOL_MAX_SIZE)]
    try:
        return [await conn.fetchval(sql) for conn in held]
    finally:
        for conn in held:
            await raw.release(conn)


def test_the_limits_commit_asynchronously_and_leave_the_sessions_as_they_were(
    pg: PgDatabase,
) -> None:
    async def scenario() -> tuple[str, str, list[str]]:
        conn = await asyncpg.connect(pg.url)
        try:
            await migrate(conn)
            async with conn.transaction():
                await conn.fetchval(f"SELECT 1 FROM {ASYNC_COMMIT}")
                inside = await conn.fetchval("SHOW synchronous_commit")
            after = await conn.fetchval("SHOW synchronous_commit")
        finally:
            await conn.close()
        pool = PostgresPool(parse_postgres_url(pg.url))
        windows = SharedWindows(pool)
        budgets = SharedBudgets(pool, BudgetSettings(max_tokens=10**9, per="lifetime"))
        await pool.open()
        try:
            ask = [(("caller", "ci", "requests"), WindowLimit(100, 60.0), 1)]
            for _ in range(3 * POOL_MAX_SIZE):
                await windows.admit(ask)
                await budgets.admit(CallContext.new("t1", "main"), Reservation(Spent(), False))
            return inside, after, await _every_connection(pool, "SHOW synchronous_commit")
        finally:
            await pool.close()

    inside, after, sessions = run_async(scenario)
    assert (inside, after) == ("off", "on")
    assert sessions == ["on"] * POOL_MAX_SIZE


def test_a_connection_given_back_inside_a_transaction_is_taken_again_outside_it(
    pg: PgDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> list[bool]:
        pool = PostgresPool(parse_postgres_url(pg.url))
        await pool.open()
        try:

            async def left_open(conn: asyncpg.Connection) -> None:
                await conn.execute("BEGIN; CREATE TABLE half_made (x int)")

            for _ in range(POOL_MAX_SIZE):
                await pool.run("reserve", left_open)
            raw = pool._pool
            assert raw is not None
            held = [await raw.acquire() for _ in range(POOL_MAX_SIZE)]
            try:
                return [conn.is_in_transaction() for conn in held] + [
                    await held[0].fetchval("SELECT to_regclass('half_made') IS NOT NULL")
                ]
            finally:
                for conn in held:
                    await raw.release(conn)
        finally:
            await pool.close()

    with caplog.at_level(logging.ERROR):
        found = run_async(scenario)
    # none in a transaction, and what the transaction made was rolled back with it
    assert found == [False] * (POOL_MAX_SIZE + 1)
