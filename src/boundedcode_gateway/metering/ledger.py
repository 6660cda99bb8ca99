"""The SQL ledger: the ``model_calls`` table in SQLite and its numbered migrations.

Owns the connection, the schema migrations and the SQL text (the ``?`` paramstyle
stays in this file). It must not be shared between threads: the connection is
created and used by one thread only (the meter writer's, or the CLI's for reads).
The file is the gateway user's alone (``private_files.py``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import fields
from operator import attrgetter
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from boundedcode_gateway import private_files
from boundedcode_gateway.clock import utc_now_iso
from boundedcode_gateway.database.migrations import Migration, load_migrations
from boundedcode_gateway.metering.ledger_queries import (
    CALL_SQL,
    CallFilter,
    calls_page,
    calls_query,
    tasks_from,
)
from boundedcode_gateway.metering.records import LEDGER_FIELDS, CallRecord, Rejected

MIGRATIONS_PACKAGE = "boundedcode_gateway.metering"
MIGRATIONS_DIR = "migrations"

_COLUMNS = ", ".join(LEDGER_FIELDS)
_ROW = attrgetter(*LEDGER_FIELDS)  # a record's ledger values, in column order
_PLACEHOLDERS = ", ".join("?" for _ in LEDGER_FIELDS)

JOURNAL_WAL_SQL = "PRAGMA journal_mode=WAL"
SYNC_NORMAL_SQL = "PRAGMA synchronous=NORMAL"
BEGIN_SQL = "BEGIN"
BEGIN_IMMEDIATE_SQL = "BEGIN IMMEDIATE"
COMMIT_SQL = "COMMIT"
ROLLBACK_SQL = "ROLLBACK"
CREATE_SCHEMA_MIGRATIONS_SQL = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
)
SELECT_MIGRATION_SQL = "SELECT 1 FROM schema_migrations WHERE version = ?"
INSERT_MIGRATION_SQL = "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)"
INSERT_CALL_SQL = f"INSERT INTO model_calls ({_COLUMNS}) VALUES ({_PLACEHOLDERS})"
# rowid breaks ties between calls started in the same millisecond: insertion order.
SELECT_RECENT_SQL = (
    f"SELECT {_COLUMNS} FROM model_calls ORDER BY started_at DESC, rowid DESC LIMIT ?"
)
SELECT_RECENT_FOR_TASK_SQL = (
    f"SELECT {_COLUMNS} FROM model_calls WHERE task = ? "
    "ORDER BY started_at DESC, rowid DESC LIMIT ?"
)

# What each caller (the gateway's own work has none) and each task spent, in all and in
# one UTC day [?, ?): the budgets' state after a restart. Tokens are prompt plus completion.
_DAY = "started_at >= ? AND started_at < ?"
_SPENT_COLUMNS = (
    "SUM(COALESCE(cost_usd, 0)), "
    "SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0)), "
    "SUM(COALESCE(evaluated_tokens, 0)), "
    f"SUM(CASE WHEN {_DAY} THEN COALESCE(cost_usd, 0) ELSE 0 END), "
    f"SUM(CASE WHEN {_DAY} THEN COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0) "
    "ELSE 0 END), "
    f"SUM(CASE WHEN {_DAY} THEN COALESCE(evaluated_tokens, 0) ELSE 0 END)"
)
SELECT_SPENDING_SQL = (
    f"SELECT 'caller', caller, {_SPENT_COLUMNS} FROM model_calls "
    "WHERE caller IS NOT NULL GROUP BY caller "
    f"UNION ALL SELECT 'task', task, {_SPENT_COLUMNS} FROM model_calls GROUP BY task"
)
# the day's bounds, once for each of the three day columns of each half
SPENDING_DAY_PARAMS = 6


class HolderTotals(NamedTuple):
    """What one caller (``kind`` "caller") or task (``kind`` "task") spent: in all, and on
    the day asked for."""

    kind: str
    name: str
    cost_usd: float
    tokens: int
    evaluated_tokens: int
    day_cost_usd: float
    day_tokens: int
    day_evaluated_tokens: int


# what one row's values or constraints raise; a statement that fails so leaves the
# transaction open (sqlite3 binds the values before the statement runs)
_ROW_ERRORS = (OverflowError, ValueError, TypeError, sqlite3.IntegrityError, sqlite3.InterfaceError)

# SQLite hands BOOLEAN columns back as 0/1; rows should read like CallRecord.to_dict().
_BOOL_FIELDS = frozenset(
    f.name for f in fields(CallRecord) if f.type in ("bool", bool, "bool | None")
)


def holder_totals(rows: Iterable[Sequence[Any]]) -> list[HolderTotals]:
    """The spending query's rows (``SELECT_SPENDING_SQL``), as numbers of their kind
    whatever the database summed them as."""
    return [
        HolderTotals(
            kind,
            name,
            float(cost),
            int(tokens),
            int(evaluated),
            float(day_cost),
            int(day_tokens),
            int(day_evaluated),
        )
        for kind, name, cost, tokens, evaluated, day_cost, day_tokens, day_evaluated in rows
    ]


def load_ledger_migrations(directory: str = MIGRATIONS_DIR) -> list[Migration]:
    """The ledger's packaged migrations of ``directory`` (SQLite's by default)."""
    return load_migrations(directory, MIGRATIONS_PACKAGE)


class Ledger:
    """The ``model_calls`` table in one SQLite file."""

    # a failure of the file is not waited out: the writer logs it and goes on (the call log
    # still holds every record)
    reconnects: ClassVar[bool] = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None

    def open(self, *, read_only: bool = False) -> None:
        """Connect and apply pending migrations; ``read_only`` neither migrates nor writes."""
        if self._conn is not None:
            return
        if read_only:
            uri = self.path.resolve().as_uri() + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        else:
            self._make_private()
            # isolation_level=None: transactions are begun and ended explicitly below.
            conn = sqlite3.connect(self.path, isolation_level=None)
            # WAL, synchronous=NORMAL: a commit appends to the log without an fsync, a
            # third of the CPU of a rollback-journal commit and none of its 20 ms wait.
            # A crash of the gateway loses nothing committed; a power loss may lose the
            # last batches, as it may the call log's unsynced lines.
            conn.execute(JOURNAL_WAL_SQL)
            conn.execute(SYNC_NORMAL_SQL)
        try:
            if not read_only:
                _migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _make_private(self) -> None:
        """The file made 0600 before SQLite opens it: SQLite makes its ``-wal`` and ``-shm``
        files with the database file's mode. Those of an earlier run are tightened too."""
        private_files.make_folder(self.path.parent)
        with private_files.open_append(self.path):
            pass
        for suffix in ("-wal", "-shm", "-journal"):
            private_files.tighten(self.path.with_name(self.path.name + suffix))

    def insert(self, records: Sequence[CallRecord]) -> list[Rejected]:
        """Insert the records in one transaction; the records it cannot hold are returned.

        A batch is one ``executemany``; should one row fail (a number SQLite cannot store,
        a call id already there), the batch is inserted again row by row, in one
        transaction still, and only the rows that fail are left out. A failure of the
        database itself (locked, full, gone) raises as before.
        """
        if not records:
            return []
        conn = self._connection()
        try:
            with _transaction(conn):
                conn.executemany(INSERT_CALL_SQL, [_ROW(r) for r in records])
        except _ROW_ERRORS:
            pass
        else:
            return []
        rejected: list[Rejected] = []
        with _transaction(conn):
            for record in records:
                try:
                    conn.execute(INSERT_CALL_SQL, _ROW(record))
                except _ROW_ERRORS as exc:
                    rejected.append((record, exc))
        return rejected

    def recent(self, task: str | None, last: int) -> list[dict[str, Any]]:
        """The newest ``last`` calls (of ``task`` if given), oldest first, newest last."""
        if last <= 0:
            return []
        conn = self._connection()
        if task is None:
            cursor = conn.execute(SELECT_RECENT_SQL, (last,))
        else:
            cursor = conn.execute(SELECT_RECENT_FOR_TASK_SQL, (task, last))
        rows = [_row_dict(row) for row in cursor.fetchall()]
        rows.reverse()
        return rows

    def calls(self, f: CallFilter) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
        """A page of calls, newest first, and the cursor of the next page (None: the last)."""
        sql, params = calls_query(f)
        rows = [_row_dict(row) for row in self._connection().execute(sql, params).fetchall()]
        return calls_page(rows, f)

    def call(self, call_id: str) -> dict[str, Any] | None:
        row = self._connection().execute(CALL_SQL, (call_id,)).fetchone()
        return _row_dict(row) if row is not None else None

    def tasks(self, search: str | None, limit: int) -> list[dict[str, Any]]:
        """Per task its sums and misses, the tasks with the latest calls first."""
        conn = self._connection()
        return tasks_from(lambda sql, params: conn.execute(sql, params).fetchall(), search, limit)

    def spending(self, day_start: str, day_end: str) -> list[HolderTotals]:
        """Each caller's and task's spending, in all and from ``day_start`` up to
        ``day_end`` (``YYYY-MM-DD``, compared with ``started_at``)."""
        params = (day_start, day_end) * SPENDING_DAY_PARAMS
        return holder_totals(self._connection().execute(SELECT_SPENDING_SQL, params).fetchall())

    def close(self) -> None:
        """Close the connection; closing twice is harmless."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"ledger {self.path} is not open")
        return self._conn


@contextmanager
def _transaction(conn: sqlite3.Connection, begin: str = BEGIN_SQL) -> Iterator[None]:
    """``begin`` ... COMMIT, or ROLLBACK when the block raises."""
    conn.execute(begin)
    try:
        yield
    except BaseException:
        # A failed ROLLBACK must not hide the error that caused it.
        with suppress(sqlite3.Error):
            conn.execute(ROLLBACK_SQL)
        raise
    conn.execute(COMMIT_SQL)


def _migrate(conn: sqlite3.Connection) -> None:
    conn.execute(CREATE_SCHEMA_MIGRATIONS_SQL)
    for migration in load_ledger_migrations():
        # The write lock is taken before the check so that two processes opening
        # the same new ledger cannot both apply one migration.
        with _transaction(conn, BEGIN_IMMEDIATE_SQL):
            if conn.execute(SELECT_MIGRATION_SQL, (migration.version,)).fetchone():
                continue
            for statement in migration.statements():
                conn.execute(statement)
            conn.execute(INSERT_MIGRATION_SQL, (migration.version, migration.name, utc_now_iso()))


def _row_dict(row: Sequence[Any]) -> dict[str, Any]:
    out = dict(zip(LEDGER_FIELDS, row, strict=True))
    for name in _BOOL_FIELDS:
        if out[name] is not None:
            out[name] = bool(out[name])
    return out
