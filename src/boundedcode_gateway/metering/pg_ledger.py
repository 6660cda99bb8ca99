"""The SQL ledger in PostgreSQL: the ``model_calls`` table through asyncpg, and its migrations.

Owns the connection, the PostgreSQL migrations (``migrations/postgresql/``, applied as
every store's are: ``database/postgres.py``) and this dialect's SQL text (the ``$n``
parameters stay in this file).
``PostgresLedger`` has the SQLite ``Ledger``'s blocking methods: each drives asyncpg on an
event loop of the ledger's own, in the one thread that uses it (the meter writer's, or a
command's); it must not be called from a thread whose event loop is running. ``prepare``
is its connect-and-migrate as a coroutine, for the gateway's start-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from operator import attrgetter
from typing import Any, ClassVar, TypeVar

import asyncpg

from boundedcode_gateway.database.migrations import Migration
from boundedcode_gateway.database.postgres import (
    COMMAND_TIMEOUT_S,
    ROW_ERRORS,
    MigrationSet,
    apply_migrations,
    close_connection,
    connect,
)
from boundedcode_gateway.locations import PostgresLocation
from boundedcode_gateway.metering.ledger import (
    MIGRATIONS_DIR,
    SPENDING_DAY_PARAMS,
    HolderTotals,
    holder_totals,
    load_ledger_migrations,
)
from boundedcode_gateway.metering.ledger import (
    SELECT_SPENDING_SQL as SQLITE_SPENDING_SQL,
)
from boundedcode_gateway.metering.ledger_queries import (
    CallFilter,
    calls_page,
    calls_query,
    numbered,
    tasks_from,
)
from boundedcode_gateway.metering.records import LEDGER_FIELDS, CallRecord, Rejected

T = TypeVar("T")

PG_MIGRATIONS_DIR = f"{MIGRATIONS_DIR}/postgresql"
# The ledger's migrations: recorded in schema_migrations, applied under a lock of their own.
MIGRATIONS_TABLE = "schema_migrations"
LEDGER_MIGRATIONS = MigrationSet(
    lambda: load_ledger_migrations(PG_MIGRATIONS_DIR),
    MIGRATIONS_TABLE,
    "boundedcode_gateway.model_calls",
)
MIGRATION_LOCK_KEY = LEDGER_MIGRATIONS.lock_key

TABLE = "model_calls"
_COLUMNS = ", ".join(LEDGER_FIELDS)
_ROW = attrgetter(*LEDGER_FIELDS)  # a record's ledger values, in column order
_PLACEHOLDERS = ", ".join(f"${i}" for i in range(1, len(LEDGER_FIELDS) + 1))

INSERT_CALL_SQL = f"INSERT INTO {TABLE} ({_COLUMNS}) VALUES ({_PLACEHOLDERS})"
SELECT_CALL_SQL = f"SELECT {_COLUMNS} FROM {TABLE} WHERE call_id = $1"
# seq breaks ties between calls started in the same millisecond: insertion order.
SELECT_RECENT_SQL = f"SELECT {_COLUMNS} FROM {TABLE} ORDER BY started_at DESC, seq DESC LIMIT $1"
SELECT_RECENT_FOR_TASK_SQL = (
    f"SELECT {_COLUMNS} FROM {TABLE} WHERE task = $1 ORDER BY started_at DESC, seq DESC LIMIT $2"
)

# the SQLite ledger's aggregate (ledger.py), its placeholders numbered: the day's bounds
# are given once for each of them
SELECT_SPENDING_SQL = numbered(SQLITE_SPENDING_SQL)


def load_pg_migrations() -> list[Migration]:
    """PostgreSQL's migrations, in numeric order: SQLite's numbers and names."""
    return LEDGER_MIGRATIONS.load()


async def migrate(conn: asyncpg.Connection, migrations: Sequence[Migration] | None = None) -> None:
    """Apply the ledger's migrations not yet recorded in ``schema_migrations``."""
    pending = load_pg_migrations() if migrations is None else migrations
    await apply_migrations(conn, pending, MIGRATIONS_TABLE, MIGRATION_LOCK_KEY)


async def prepare(location: PostgresLocation) -> None:
    """Connect and apply pending migrations, then close: the start-up's check that the
    ledger can be written. Raises what connecting or migrating raised."""
    conn = await connect(location)
    try:
        await migrate(conn)
    finally:
        await close_connection(conn)


async def insert_records(conn: asyncpg.Connection, records: Sequence[CallRecord]) -> list[Rejected]:
    """The records in one COPY; should a row fail, row by row in one transaction, each
    behind a savepoint, and only the rows that fail are left out (returned).

    A row whose call id is there already with the very same values is not a failure:
    it is this record, written by an earlier attempt whose answer the connection lost.
    A failure of the database itself (gone, timed out) raises, and nothing is written.
    """
    if not records:
        return []
    rows = [_ROW(r) for r in records]
    try:
        async with conn.transaction():
            await conn.copy_records_to_table(
                TABLE, records=rows, columns=LEDGER_FIELDS, timeout=COMMAND_TIMEOUT_S
            )
    except ROW_ERRORS:
        pass
    else:
        return []
    rejected: list[Rejected] = []
    async with conn.transaction():
        for record, row in zip(records, rows, strict=True):
            try:
                async with conn.transaction():
                    await conn.execute(INSERT_CALL_SQL, *row)
            except asyncpg.UniqueViolationError as exc:
                if not await _holds(conn, row):
                    rejected.append((record, exc))
            except ROW_ERRORS as exc:
                rejected.append((record, exc))
    return rejected


async def _holds(conn: asyncpg.Connection, row: tuple[Any, ...]) -> bool:
    existing = await conn.fetchrow(SELECT_CALL_SQL, row[0])
    return existing is not None and tuple(existing) == row


class PostgresLedger:
    """The ``model_calls`` table in one PostgreSQL database; blocking, for one thread."""

    # a database that went away may come back: the writer keeps what it could not write,
    # reconnects and writes it then
    reconnects: ClassVar[bool] = True

    def __init__(self, location: PostgresLocation) -> None:
        self.location = location
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: asyncpg.Connection | None = None

    def open(self, *, read_only: bool = False) -> None:
        """Connect and apply pending migrations; ``read_only`` neither migrates nor writes."""
        if self._conn is not None:
            return
        self._loop = asyncio.new_event_loop()
        try:
            self._conn = self._run(self._connect(read_only))
        except BaseException:
            self.close()
            raise

    async def _connect(self, read_only: bool) -> asyncpg.Connection:
        conn = await connect(self.location, read_only)
        try:
            if not read_only:
                await migrate(conn)
        except BaseException:
            conn.terminate()
            raise
        return conn

    def insert(self, records: Sequence[CallRecord]) -> list[Rejected]:
        """Insert the records (one COPY); the records the database cannot hold are returned."""
        return self._run(insert_records(self._connection(), records))

    def recent(self, task: str | None, last: int) -> list[dict[str, Any]]:
        """The newest ``last`` calls (of ``task`` if given), oldest first, newest last."""
        if last <= 0:
            return []
        conn = self._connection()
        if task is None:
            query = conn.fetch(SELECT_RECENT_SQL, last)
        else:
            query = conn.fetch(SELECT_RECENT_FOR_TASK_SQL, task, last)
        rows = [dict(zip(LEDGER_FIELDS, row, strict=True)) for row in self._run(query)]
        rows.reverse()
        return rows

    def calls(self, f: CallFilter) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
        """A page of calls, newest first, and the cursor of the next page (None: the last)."""
        sql, params = calls_query(f)
        rows = self._run(self._connection().fetch(numbered(sql), *params))
        return calls_page([dict(zip(LEDGER_FIELDS, row, strict=True)) for row in rows], f)

    def call(self, call_id: str) -> dict[str, Any] | None:
        row = self._run(self._connection().fetchrow(SELECT_CALL_SQL, call_id))
        return dict(zip(LEDGER_FIELDS, row, strict=True)) if row is not None else None

    def tasks(self, search: str | None, limit: int) -> list[dict[str, Any]]:
        """Per task its sums and misses, the tasks with the latest calls first."""
        conn = self._connection()

        def fetch(sql: str, params: list[Any]) -> list[Any]:
            return list(self._run(conn.fetch(numbered(sql), *params)))

        return tasks_from(fetch, search, limit, like="ILIKE")

    def spending(self, day_start: str, day_end: str) -> list[HolderTotals]:
        """Each caller's and task's spending, in all and from ``day_start`` up to
        ``day_end`` (``YYYY-MM-DD``, compared with ``started_at``)."""
        params = (day_start, day_end) * SPENDING_DAY_PARAMS
        return holder_totals(self._run(self._connection().fetch(SELECT_SPENDING_SQL, *params)))

    def close(self) -> None:
        """Close the connection and the ledger's event loop; closing twice is harmless."""
        conn, self._conn = self._conn, None
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            if conn is not None:
                loop.run_until_complete(close_connection(conn))
        finally:
            loop.close()

    def _connection(self) -> asyncpg.Connection:
        if self._conn is None:
            raise RuntimeError(f"ledger {self.location} is not open")
        return self._conn

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            work.close()
            raise RuntimeError(f"ledger {self.location} is not open")
        return self._loop.run_until_complete(work)
