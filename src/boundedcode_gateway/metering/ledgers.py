"""The one place a ledger's kind is chosen: SQLite (``ledger.py``) or PostgreSQL
(``pg_ledger.py``), from where ``ledger:`` says it lives.

Owns the small interface both have and the errors a reader of either may meet; it must
not know either's SQL.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from boundedcode_gateway.database.postgres import DATABASE_ERRORS
from boundedcode_gateway.locations import LedgerLocation, PostgresLocation
from boundedcode_gateway.metering import pg_ledger
from boundedcode_gateway.metering.ledger import HolderTotals, Ledger
from boundedcode_gateway.metering.ledger_queries import CallFilter
from boundedcode_gateway.metering.pg_ledger import PostgresLedger
from boundedcode_gateway.metering.records import CallRecord, Rejected

# what reading a ledger that is missing, unreadable or unreachable raises
LEDGER_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, *DATABASE_ERRORS)


class LedgerStore(Protocol):
    """The ``model_calls`` table, whichever database holds it; used by one thread only."""

    # whether a failed write may succeed later (a server that comes back): the meter
    # writer then keeps the records it could not write, reconnects and writes them
    reconnects: ClassVar[bool]

    def open(self, *, read_only: bool = False) -> None: ...

    def insert(self, records: Sequence[CallRecord]) -> list[Rejected]: ...

    def recent(self, task: str | None, last: int) -> list[dict[str, Any]]: ...

    def spending(self, day_start: str, day_end: str) -> list[HolderTotals]: ...

    def calls(self, f: CallFilter) -> tuple[list[dict[str, Any]], tuple[str, str] | None]: ...

    def call(self, call_id: str) -> dict[str, Any] | None: ...

    def tasks(self, search: str | None, limit: int) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


def ledger_at(location: LedgerLocation) -> LedgerStore:
    """The ledger where ``location`` says, not yet open."""
    if isinstance(location, PostgresLocation):
        return PostgresLedger(location)
    return Ledger(location)


def ledger_exists(location: LedgerLocation) -> bool:
    """Whether a reader should look: an SQLite file only once written (reading must not
    create it); a database server is always asked."""
    return isinstance(location, PostgresLocation) or location.is_file()


async def prepare_ledger(location: LedgerLocation) -> None:
    """At start-up, off the request path: connect to a PostgreSQL ledger and migrate it, or
    raise. An SQLite ledger is opened by the writer thread, which logs a failure and goes on
    with the call log alone, as before."""
    if isinstance(location, PostgresLocation):
        await pg_ledger.prepare(location)
