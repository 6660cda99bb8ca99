"""What a shared limit check costs in each store: the check a call makes before it is
sent, measured on its own, without a gateway around it.

- PostgreSQL, rate windows: the gateway's ``SharedWindows.admit`` (one ``rate_admit``
  statement) for a call's two windows (its caller's requests, its task's tokens);
- PostgreSQL, budget: the gateway's ``SharedBudgets.admit`` (one ``budget_reserve``
  statement) on one task's budget, its reservation deleted afterwards as the ledger's
  trigger does when the call's row is written (not timed);
- PostgreSQL, both: the two at once, on two connections, as a call held to both asks
  them;
- Redis, rate windows: the same two windows by the same rule in one Lua script
  (``redis_windows.py``), on the Redis at 127.0.0.1:6379.

Each runs for ``--seconds`` (on uvloop, as the gateway does) as one gateway checking
one call at a time, one gateway
with 16 calls at once, and three gateways (processes) with 16 each, all on one hot key,
as one caller's burst is. Prints one table: checks per second (all gateways together),
p50 and p99 of one check. A fresh PostgreSQL database (127.0.0.1:5432, user
``postgres``) is made for the run and dropped after; the Redis keys are the run's own
and deleted after.

Run: ``python -m bench.limit_store [--seconds S]`` (``make bench-limit-store``).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial

import asyncpg
import redis.asyncio as redis
import uvloop

from bench.limit_store.redis_windows import RedisWindows
from bench.overhead.results import percentile
from boundedcode_gateway.budgets.reservation import Reservation
from boundedcode_gateway.budgets.shared import SharedBudgets
from boundedcode_gateway.budgets.spent import Spent
from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.config import BudgetSettings
from boundedcode_gateway.database.pool import PostgresPool
from boundedcode_gateway.limits.shared import SharedWindows
from boundedcode_gateway.limits.windows import WindowLimit
from boundedcode_gateway.locations import parse_postgres_url
from boundedcode_gateway.metering.pg_ledger import migrate

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
MODES = (
    "PostgreSQL, rate windows",
    "PostgreSQL, budget",
    "PostgreSQL, both",
    "Redis, rate windows",
)
# (gateways, calls at once in each)
SHAPES = ((1, 1), (1, 16), (3, 16))
# limits no check reaches: what is measured is the checking
WINDOWS = (WindowLimit(10**12, 60.0), WindowLimit(10**15, 60.0))
BUDGET = BudgetSettings(max_tokens=10**15, per="lifetime")
RESERVATION = Reservation(Spent(0.0, 5_000, 5_000), hard=False)


@dataclass
class Sample:
    checks_per_s: float
    p50_ms: float
    p99_ms: float


Check = Callable[[], Awaitable[None]]


@dataclass
class Checker:
    """One gateway's check (timed), what follows it untimed, and what closes the store."""

    check: Check
    after: Check
    close: Check


async def _nothing() -> None:
    return None


async def _checker(mode: str, url: str, run_id: str) -> Checker:
    if mode.startswith("Redis"):
        client = redis.Redis.from_url(REDIS_URL)
        windows = RedisWindows(client)
        asks = [
            (f"{run_id}:caller:bench:requests", WINDOWS[0].limit, WINDOWS[0].window_s, 1),
            (f"{run_id}:task:t1:tokens", WINDOWS[1].limit, WINDOWS[1].window_s, 100),
        ]

        async def redis_check() -> None:
            await windows.admit(asks)

        return Checker(redis_check, _nothing, client.aclose)
    pool = PostgresPool(parse_postgres_url(url))
    shared_windows = SharedWindows(pool)
    budgets = SharedBudgets(pool, BUDGET)
    await pool.open()
    pg_asks = [
        (("caller", "bench", "requests"), WINDOWS[0], 1),
        (("task", "t1", "tokens"), WINDOWS[1], 100),
    ]
    # the calls whose reservations the ledger's trigger would delete next
    reserved: list[str] = []

    async def rate() -> None:
        await shared_windows.admit(pg_asks)

    async def budget() -> None:
        ctx = CallContext.new("t1", "main")
        if mode.endswith("both"):
            # at once, on two connections, as the gateway asks them
            await asyncio.gather(rate(), budgets.admit(ctx, RESERVATION))
        else:
            await budgets.admit(ctx, RESERVATION)
        reserved.append(ctx.call_id)

    async def delete(call_id: str, conn: asyncpg.Connection) -> None:
        await conn.execute("DELETE FROM budget_reservations WHERE call_id = $1", call_id)

    async def settle() -> None:
        while reserved:
            await pool.run("renew", partial(delete, reserved.pop()))

    if mode.endswith("rate windows"):
        return Checker(rate, _nothing, pool.close)
    return Checker(budget, settle, pool.close)


async def _worker(checker: Checker, until: float, latencies: list[float]) -> None:
    while time.perf_counter() < until:
        start = time.perf_counter()
        await checker.check()
        latencies.append(time.perf_counter() - start)
        await checker.after()


async def _gateway(
    mode: str, url: str, run_id: str, concurrency: int, seconds: float, start_at: float
) -> list[float]:
    checker = await _checker(mode, url, run_id)
    try:
        warm: list[float] = []
        await _worker(checker, time.perf_counter() + 0.5, warm)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        latencies: list[float] = []
        until = time.perf_counter() + seconds
        await asyncio.gather(*(_worker(checker, until, latencies) for _ in range(concurrency)))
        return latencies
    finally:
        await checker.close()


def _gateway_process(args: tuple[str, str, str, int, float, float]) -> list[float]:
    # the event loop the gateway runs on
    return uvloop.run(_gateway(*args))


def _measure(
    mode: str, url: str, run_id: str, gateways: int, concurrency: int, seconds: float
) -> Sample:
    start_at = time.time() + 2.0
    args = (mode, url, run_id, concurrency, seconds, start_at)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(gateways, mp_context=spawn) as workers:
        found = list(workers.map(_gateway_process, [args] * gateways))
    latencies = sorted(t for one in found for t in one)
    return Sample(
        len(latencies) / seconds,
        statistics.median(latencies) * 1000,
        percentile(latencies, 99) * 1000,
    )


async def _admin(statement: str) -> None:
    conn = await asyncpg.connect(ADMIN_URL, timeout=10)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def _prepare(url: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    pool = PostgresPool(parse_postgres_url(url))
    SharedWindows(pool)
    SharedBudgets(pool, BUDGET)
    await pool.open()
    await pool.close()


async def _forget_redis(run_id: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = [key async for key in client.scan_iter(f"{run_id}:*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per mode and shape")
    args = parser.parse_args()
    run_id = f"bench_limit_store_{secrets.token_hex(4)}"
    database = run_id
    url = f"{ADMIN_URL.rsplit('/', 1)[0]}/{database}"
    asyncio.run(_admin(f'CREATE DATABASE "{database}"'))
    rows: list[tuple[str, str, Sample]] = []
    try:
        asyncio.run(_prepare(url))
        for mode in MODES:
            for gateways, concurrency in SHAPES:
                sample = _measure(mode, url, run_id, gateways, concurrency, args.seconds)
                rows.append((mode, f"{gateways} x {concurrency}", sample))
                print(f"  {mode} {gateways} x {concurrency}: {sample}", flush=True)
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        asyncio.run(_forget_redis(run_id))
    print()
    print("| store, check | gateways x calls at once | checks/s | p50 ms | p99 ms |")
    print("|---|---|---:|---:|---:|")
    for mode, shape, s in rows:
        print(f"| {mode} | {shape} | {s.checks_per_s:,.0f} | {s.p50_ms:.3f} | {s.p99_ms:.3f} |")
