"""A fresh PostgreSQL database per test, on the server at 127.0.0.1:5432 (user ``postgres``).

A pytest plugin (tests/conftest.py loads it): the ``pg`` fixture creates a database with a
random name, yields it, then ends whatever connections are left on it and drops it. When
the server cannot be reached the test FAILS, saying so: the PostgreSQL ledger is part of
the product, and its tests must not pass by not running.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import pytest

from tests.fakes.tcp_proxy import TcpProxy

T = TypeVar("T")

SERVER_HOST = "127.0.0.1"
SERVER_PORT = 5432
USER = "postgres"
ADMIN_URL = f"postgresql://{USER}@{SERVER_HOST}:{SERVER_PORT}/postgres"
CONNECT_TIMEOUT_S = 5.0


def run_async(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end on a fresh event loop in a thread of its own, so that it
    never meets the loop (running or not) of the test calling it."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(work()))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="postgres-admin")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


@dataclass(frozen=True)
class PgDatabase:
    """One test's database: its name, its URL, and queries run on a connection of their own."""

    name: str

    @property
    def url(self) -> str:
        return self.url_at(SERVER_PORT)

    def url_at(self, port: int, password: str | None = None) -> str:
        """The URL through another port (a proxy in front of the server), with a password
        if given (trust authentication ignores it)."""
        user = USER if password is None else f"{USER}:{password}"
        return f"postgresql://{user}@{SERVER_HOST}:{port}/{self.name}"

    def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        async def query() -> list[dict[str, Any]]:
            conn = await asyncpg.connect(self.url, timeout=CONNECT_TIMEOUT_S)
            try:
                return [dict(row) for row in await conn.fetch(sql, *args)]
            finally:
                await conn.close()

        return run_async(query)

    def execute(self, sql: str, *args: Any) -> None:
        async def statement() -> None:
            conn = await asyncpg.connect(self.url, timeout=CONNECT_TIMEOUT_S)
            try:
                await conn.execute(sql, *args)
            finally:
                await conn.close()

        run_async(statement)


async def _admin(sql: str, *args: Any) -> None:
    conn = await asyncpg.connect(ADMIN_URL, timeout=CONNECT_TIMEOUT_S)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


def _create(name: str) -> None:
    run_async(lambda: _admin(f'CREATE DATABASE "{name}"'))


def _drop(name: str) -> None:
    async def drop() -> None:
        # a connection the test left open (a gateway killed mid-write) would block the DROP
        await _admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
        # FORCE: a backend told to end above may not have ended yet (PostgreSQL 13+)
        await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    run_async(drop)


@pytest.fixture
def pg() -> Iterator[PgDatabase]:
    """A new, empty database for this test; dropped after it."""
    name = f"bcg_test_{secrets.token_hex(6)}"
    try:
        _create(name)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {SERVER_HOST}:{SERVER_PORT} as user {USER!r} "
            f"({type(exc).__name__}: {exc}); the PostgreSQL ledger tests need that server "
            "running (trust authentication)",
            pytrace=False,
        )
    try:
        yield PgDatabase(name)
    finally:
        _drop(name)


@pytest.fixture
def pg_proxy() -> Iterator[TcpProxy]:
    """A TCP proxy in front of the server, which a test cuts (the database is gone:
    connections reset, new ones refused) and restores; the server itself is never
    stopped."""
    running = TcpProxy(target_port=SERVER_PORT).start()
    yield running
    running.stop()
