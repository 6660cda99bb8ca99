"""Connecting to PostgreSQL and applying a store's migrations, the same way for every
store the gateway keeps there (the ledger, the task state, the limits).

A store names its migrations (a ``MigrationSet``: its files, the table they are recorded
in, the advisory lock they are applied under); ``apply_migrations`` applies the pending
ones of one set in one transaction, so gateways starting together apply them once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import asyncpg

from boundedcode_gateway.clock import utc_now_iso
from boundedcode_gateway.database.migrations import Migration
from boundedcode_gateway.locations import PostgresLocation

APPLICATION_NAME = "boundedcode-gateway"
# A database that does not answer holds a caller at most this long per connection
# attempt and per statement (a pool's operations have their own, shorter bound).
CONNECT_TIMEOUT_S = 5.0
COMMAND_TIMEOUT_S = 10.0
# how long closing a connection may take before it is dropped without a goodbye
CLOSE_TIMEOUT_S = 2.0

# A FROM item that makes the statement's transaction commit without waiting for its
# write-ahead log to reach the disk (PostgreSQL's synchronous_commit, for this one
# transaction): for the writes of a call's path that are leases and counters (rate
# windows, budget reservations), where that wait is most of the statement's time. Such
# a commit is still atomic and consistent and written within 3 x wal_writer_delay (0.6 s
# by default); only a crash of the database server in that time forgets it
# (docs/budgets.md, "Several gateways"). Where in the statement it runs does not matter:
# the setting is read at the commit.
ASYNC_COMMIT = "set_config('synchronous_commit', 'off', true)"

LOCK_MIGRATIONS_SQL = "SELECT pg_advisory_xact_lock($1)"
# the table a set of migrations is recorded in: {table}, a name of the code's own
CREATE_MIGRATIONS_SQL = (
    "CREATE TABLE IF NOT EXISTS {table} ("
    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
)
SELECT_MIGRATIONS_SQL = "SELECT version FROM {table}"
INSERT_MIGRATION_SQL = "INSERT INTO {table} (version, name, applied_at) VALUES ($1, $2, $3)"

# What one row's values or constraints raise: a number out of BIGINT's range or a string
# PostgreSQL cannot hold (a NUL, a lone surrogate), a key already there, a value too
# large for an index. asyncpg encodes a COPY's values itself (OverflowError,
# UnicodeEncodeError, TypeError) and a statement's as query arguments (DataError). Any
# other failure is the database's own (gone, full, shutting down).
ROW_ERRORS: tuple[type[Exception], ...] = (
    OverflowError,
    ValueError,
    TypeError,
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.ProgramLimitExceededError,
)
# What a database that cannot be reached, or goes away, raises.
DATABASE_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    OSError,
    TimeoutError,
)


def advisory_lock_key(name: str) -> int:
    """The advisory lock key of ``name``: the same in every gateway."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@dataclass(frozen=True, slots=True)
class MigrationSet:
    """One store's migrations: where they are read from, the table that records which
    were applied, and the advisory lock they are applied under (``lock_name``'s key)."""

    load: Callable[[], list[Migration]]
    table: str
    lock_name: str

    @property
    def lock_key(self) -> int:
        return advisory_lock_key(self.lock_name)


async def connect(location: PostgresLocation, read_only: bool = False) -> asyncpg.Connection:
    """One connection; ``read_only`` makes every transaction of the session read-only."""
    settings = {"application_name": APPLICATION_NAME}
    if read_only:
        settings["default_transaction_read_only"] = "on"
    return await asyncpg.connect(
        location.url,
        timeout=CONNECT_TIMEOUT_S,
        command_timeout=COMMAND_TIMEOUT_S,
        server_settings=settings,
    )


async def apply_migrations(
    conn: asyncpg.Connection, migrations: Sequence[Migration], table: str, lock_key: int
) -> None:
    """Apply the migrations not yet recorded in ``table``, in order, in one transaction,
    under the advisory lock ``lock_key``: a second gateway starting at once waits for it,
    then finds them applied."""
    async with conn.transaction():
        await conn.execute(LOCK_MIGRATIONS_SQL, lock_key)
        await conn.execute(CREATE_MIGRATIONS_SQL.format(table=table))
        applied = {row[0] for row in await conn.fetch(SELECT_MIGRATIONS_SQL.format(table=table))}
        insert = INSERT_MIGRATION_SQL.format(table=table)
        for migration in migrations:
            if migration.version in applied:
                continue
            await conn.execute(migration.sql)
            await conn.execute(insert, migration.version, migration.name, utc_now_iso())


async def apply_set(conn: asyncpg.Connection, migrations: MigrationSet) -> None:
    """``apply_migrations`` for one store's set."""
    await apply_migrations(conn, migrations.load(), migrations.table, migrations.lock_key)


async def close_connection(conn: asyncpg.Connection) -> None:
    """Close politely; a connection that is gone or does not answer is dropped."""
    try:
        await conn.close(timeout=CLOSE_TIMEOUT_S)
    except Exception:
        conn.terminate()
