"""A small asyncpg pool on the gateway's event loop, shared by the stores that keep their
tables in one PostgreSQL database, and what a database that fails while serving means.

Each store that uses the pool names its migrations, its operations and what the calls
go without during an outage (a ``Store``); ``open`` applies every store's pending
migrations. An operation that fails goes on without the database (``DatabaseUnavailable``),
counted per operation and logged once per outage. For ``RETRY_AFTER_S`` after a failure
operations do not try it, so a database that stopped answering costs one call its
timeout, not every call. It must not know the tables.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import asyncpg

from boundedcode_gateway.database.postgres import (
    APPLICATION_NAME,
    CLOSE_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    ROW_ERRORS,
    MigrationSet,
    apply_set,
)
from boundedcode_gateway.locations import PostgresLocation, explain
from boundedcode_gateway.lru import Clock

T = TypeVar("T")

log = logging.getLogger(__name__)

# a call holds one connection for one statement at a time: a few serve many calls
POOL_MIN_SIZE = 1
POOL_MAX_SIZE = 4
# the longest one operation of a call may take, waiting for a connection included
STATEMENT_TIMEOUT_S = 2.0
# applying the migrations, waiting for another gateway's to be applied included
MIGRATION_TIMEOUT_S = 60.0
# how long a connection given back after a statement that timed out may take to be reset
RELEASE_TIMEOUT_S = 1.0
# after a failure, operations go without the database this long before it is tried again
RETRY_AFTER_S = 1.0


async def _keep_session(conn: asyncpg.Connection) -> None:
    """A connection given back is reset no further than asyncpg always does (an open
    transaction rolled back): the stores leave no session state behind (no ``SET``,
    ``LISTEN``, cursor or session-level advisory lock), so the reset query would cost
    every operation a second round trip for nothing."""


class DatabaseUnavailable(Exception):
    """The operation went without the database: it failed, or it was not tried this soon
    after a failure."""


@dataclass(frozen=True, slots=True)
class Store:
    """What keeps its tables in the database: its migrations, the operations it counts,
    and what calls go without while the database is away (for the outage's log line)."""

    name: str
    migrations: MigrationSet
    operations: tuple[str, ...]
    without: str


class PostgresPool:
    """The pool and the health of one database; used on the gateway's event loop."""

    def __init__(self, location: PostgresLocation, clock: Clock = time.monotonic) -> None:
        self.location = location
        self._clock = clock
        self._pool: asyncpg.Pool | None = None
        self._stores: list[Store] = []
        # operations that went without the database, by operation
        self.unavailable: dict[str, int] = {}
        # the outage under way: when it began, when the database may be tried again, and
        # how many operations went without it
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._missed = 0

    def serve(self, store: Store) -> None:
        """``store`` keeps its tables here: its migrations are applied at ``open``."""
        if store not in self._stores:
            self._stores.append(store)
            for operation in store.operations:
                self.unavailable.setdefault(operation, 0)

    @property
    def up(self) -> bool:
        """Open, and its last operation did not fail for the database's sake."""
        return self._pool is not None and self._down_since is None

    async def open(self) -> None:
        """Connect and apply each store's pending migrations, or raise (the start-up's
        check). Opening an open pool does nothing."""
        if self._pool is not None:
            return
        pool = await asyncpg.create_pool(
            self.location.url,
            min_size=POOL_MIN_SIZE,
            max_size=POOL_MAX_SIZE,
            timeout=CONNECT_TIMEOUT_S,
            reset=_keep_session,
            server_settings={"application_name": APPLICATION_NAME},
        )
        try:
            async with asyncio.timeout(MIGRATION_TIMEOUT_S):
                async with pool.acquire() as conn:
                    for store in self._stores:
                        await apply_set(conn, store.migrations)
        except BaseException:
            pool.terminate()
            raise
        self._pool = pool

    async def run(
        self,
        operation: str,
        work: Callable[[asyncpg.Connection], Awaitable[T]],
        timeout_s: float = STATEMENT_TIMEOUT_S,
    ) -> T:
        """``work`` on a connection of the pool, within ``timeout_s`` all told; what went
        wrong is ``DatabaseUnavailable`` (counted, and logged once per outage)."""
        pool = self._pool
        if pool is None or (self._down_since is not None and self._clock() < self._retry_at):
            self._missed_one(operation)
            raise DatabaseUnavailable(operation)
        try:
            async with asyncio.timeout(timeout_s):
                conn = await pool.acquire()
                try:
                    result = await work(conn)
                finally:
                    # shielded by asyncpg: bounded here, else a reset may wait on a silent server
                    await pool.release(conn, timeout=RELEASE_TIMEOUT_S)
        except ROW_ERRORS as exc:
            # the values' own fault (a NUL in a key): not an outage
            self._missed_one(operation)
            log.warning("database %s: %s failed: %s", self.display, operation, self._explain(exc))
            raise DatabaseUnavailable(operation) from None
        except Exception as exc:  # gone, silent, refusing (postgres.DATABASE_ERRORS), or else
            self._failed(operation, exc)
            raise DatabaseUnavailable(operation) from None
        self._worked()
        return result

    @property
    def display(self) -> str:
        return self.location.display

    def _missed_one(self, operation: str) -> None:
        self.unavailable[operation] = self.unavailable.get(operation, 0) + 1
        if self._down_since is not None:
            self._missed += 1

    def _failed(self, operation: str, exc: BaseException) -> None:
        now = self._clock()
        self._retry_at = now + RETRY_AFTER_S
        if self._down_since is None:
            self._down_since = now
            self._missed = 0
            without = "; ".join(s.without for s in self._stores) or "calls go on without it"
            log.error(
                "database %s unavailable (%s): %s, until it is back",
                self.display,
                self._explain(exc),
                without,
            )
        self._missed_one(operation)

    def _worked(self) -> None:
        if self._down_since is None:
            return
        log.warning(
            "database %s is back after %.1f s; %d operations went without it",
            self.display,
            self._clock() - self._down_since,
            self._missed,
        )
        self._down_since = None

    def _explain(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError):
            return "TimeoutError: no answer in time"
        return explain(self.location, exc)

    async def close(self) -> None:
        """Close the pool; connections that do not say goodbye in time are dropped."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), CLOSE_TIMEOUT_S)
        except Exception:
            pool.terminate()
